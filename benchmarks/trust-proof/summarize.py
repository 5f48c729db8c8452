"""The hierarchical all-reduce (64 MiB, 4 ranks as 2 domains of 2) before and after proven
trust domains, from run.sh's launches: per launch the paired secure-domains/gloo ratio the
benchmark reports, and over rounds the Hodges-Lehmann estimate of new/old with its
signed-rank 95 % interval. Writes summary.json here.

    python summarize.py [RAW_DIR]      # default /tmp/trust-proof-runs
"""

import json
import sys
from pathlib import Path

from ccddp.stats import paired_ratio

RAW = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/trust-proof-runs")
HERE = Path(__file__).parent


def launch(path: Path) -> dict:
    rows = [r for r in json.loads(path.read_text())["rows"] if r["op"] == "all_reduce"]
    t = {r["impl"]: r["time_us"] / 1e3 for r in rows}
    # The secure-domains row's time over gloo's, call by call in the launch.
    domains = next(r for r in rows if r["impl"] == "secure-domains")
    ratio, low, high, n = domains["paired_ratio_intervals"]["gloo"]
    return {"gloo_ms": t["gloo"], "domains_ms": t["secure-domains"], "domains_over_gloo_paired": [ratio, low, high, n]}


def interval(num: list[float], den: list[float]) -> dict:
    iv = paired_ratio(dict(enumerate(num)), dict(enumerate(den)))
    return {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n}


def main() -> None:
    runs = {t: [] for t in ("orig", "new")}
    for r in range(1, 100):
        a, b = RAW / f"dom-r{r}-new.json", RAW / f"dom-r{r}-orig.json"
        if a.exists() and b.exists():
            runs["new"].append(launch(a))
            runs["orig"].append(launch(b))
    new_ms = [x["domains_ms"] for x in runs["new"]]
    old_ms = [x["domains_ms"] for x in runs["orig"]]
    summary = {
        "what": "hierarchical all-reduce, 64 MiB fp32, 4 ranks as [[0,1],[2,3]]: before (73afd36, gloo over "
                "loopback inside a domain) and after (proven AF_UNIX links); ccddp bench collectives "
                "--impl gloo,secure-domains --iters 12 --warmup 3, launches alternating, order flipped every round",
        "machine": "2-core shared VM (this session's), load in log.txt",
        "launches": runs,
        "domains_new_over_old": interval(new_ms, old_ms),
        # The launches' medians, secure-domains over gloo, over the rounds.
        "domains_over_gloo_new": interval(new_ms, [x["gloo_ms"] for x in runs["new"]]),
        "domains_over_gloo_old": interval(old_ms, [x["gloo_ms"] for x in runs["orig"]]),
    }
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for key in ("domains_new_over_old", "domains_over_gloo_new", "domains_over_gloo_old"):
        iv = summary[key]
        span = f"{iv['low']:.2f}-{iv['high']:.2f}" if iv["low"] is not None else "no interval"
        print(f"{key}: {iv['estimate']:.2f} ({span}, n={iv['n']})")
    for t in ("orig", "new"):
        print(t, "per launch, secure-domains/gloo paired:",
              ", ".join(f"{x['domains_over_gloo_paired'][0]:.2f}" for x in runs[t]))


if __name__ == "__main__":
    main()
