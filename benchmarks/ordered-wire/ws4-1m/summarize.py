"""Secure all-reduce time new/old (and secure/gloo new over old) for run.sh's rounds,
Hodges-Lehmann with the signed-rank 95 % interval; writes summary.json here. Reads the
runs from this folder (a fresh run) or, folded, from ../runs.json (``scripts/folded_runs.py``)."""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from folded_runs import exists, read  # noqa: E402

from ccddp.stats import paired_ratio  # noqa: E402

HERE = Path(__file__).parent


def times(path: Path) -> tuple[float, float]:
    rows = read(path)["rows"]
    t = {r["impl"]: r["time_us"] / 1e3 for r in rows if r["op"] == "all_reduce"}
    return t["secure"], t["gloo"]


def main() -> None:
    new, old, rnew, rold = {}, {}, {}, {}
    for r in range(1, 100):
        a, b = HERE / f"coll-ws4-r{r}-new.json", HERE / f"coll-ws4-r{r}-orig.json"
        if exists(a) and exists(b):
            (sn, gn), (so, go) = times(a), times(b)
            new[r], old[r], rnew[r], rold[r] = sn, so, sn / gn, so / go
    iv, iv2 = paired_ratio(new, old), paired_ratio(rnew, rold)
    out = {"what": "4 ranks, 1 MiB secure all-reduce, old (2e6e104) vs new taking turns, --iters 30 --warmup 5",
           "n": iv.n, "secure_new_over_old": {"estimate": iv.estimate, "low": iv.low, "high": iv.high},
           "secure_over_gloo_new_over_old": {"estimate": iv2.estimate, "low": iv2.low, "high": iv2.high},
           "secure_ms_new": list(new.values()), "secure_ms_old": list(old.values())}
    (HERE / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"new/old {iv.estimate:.2f} ({iv.low:.2f}-{iv.high:.2f}, n={iv.n}); median "
          f"{statistics.median(new.values()):.2f} / {statistics.median(old.values()):.2f} ms")


if __name__ == "__main__":
    main()
