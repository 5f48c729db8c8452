"""Secure all-reduce time, new/old, from run.sh's launches: per (world size, size), the
Hodges-Lehmann estimate of the per-round ratio with its signed-rank 95 % interval; also
secure/gloo within each launch, new over old. Writes summary.json beside the runs.
Reads each run from RUN_DIR (a fresh run) or, folded, from its runs.json
(``scripts/folded_runs.py``).

    python summarize.py [RUN_DIR [WHAT]]     # default: this folder, the first comparison
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from folded_runs import exists, read  # noqa: E402

from ccddp.stats import paired_ratio  # noqa: E402

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
WHAT = sys.argv[2] if len(sys.argv) > 2 else (
    "the CPU path before (40f6a93) and after CUDA tensors came through the backend")


def secure_and_gloo(path: Path, nbytes: int) -> tuple[float, float]:
    rows = read(path)["rows"]
    t = {r["impl"]: r["time_us"] for r in rows if r["op"] == "all_reduce" and r["bytes"] == nbytes}
    return t["secure"] / 1e3, t["gloo"] / 1e3


def interval(num: list[float], den: list[float]) -> dict:
    iv = paired_ratio(dict(enumerate(num)), dict(enumerate(den)))
    return {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n}


def main() -> None:
    out = []
    for ws in (2, 4):
        for nbytes in (1 << 20, 64 << 20):
            new, old, rnew, rold = [], [], [], []
            for r in range(1, 100):
                a, b = HERE / f"coll-ws{ws}-r{r}-new.json", HERE / f"coll-ws{ws}-r{r}-orig.json"
                if not (exists(a) and exists(b)):
                    continue
                (sn, gn), (so, go) = secure_and_gloo(a, nbytes), secure_and_gloo(b, nbytes)
                new.append(sn), old.append(so), rnew.append(sn / gn), rold.append(so / go)
            out.append({"world_size": ws, "bytes": nbytes, "secure_ms_new": new, "secure_ms_old": old,
                        "secure_new_over_old": interval(new, old),
                        "secure_over_gloo_new_over_old": interval(rnew, rold)})
    summary = {"what": f"{WHAT}: ccddp bench collectives gloo,secure, launches alternating old/new, order flipped "
                       "every round",
               "machine": "2-core shared VM (this session's), load in log.txt", "before_after": out}
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for row in out:
        iv = row["secure_new_over_old"]
        span = f"{iv['low']:.2f}-{iv['high']:.2f}" if iv["low"] is not None else "no interval"
        print(f"ws {row['world_size']} {row['bytes'] >> 20} MiB: new/old {iv['estimate']:.2f} ({span}, n={iv['n']})")


if __name__ == "__main__":
    main()
