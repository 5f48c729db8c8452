"""Search for the CC-on settings that make an iteration cheapest.

Dimensions: bucket cap, schedule, algorithm, segment size, chains. For every
(schedule, algorithm) pair the search starts from ccddp's defaults and improves one
dimension at a time until nothing changes (coordinate descent); every point it visits is a
full iteration simulation, so the answer accounts for overlap with backward, not just
all-reduce time. The default setting is always evaluated, so the best is never worse.

Slowdowns are against the CC-off iteration with DDP's default buckets: the run the user
has today.

Example::

    res = tune(load_profile("h100-cc"), wl, n=8)
    res.best, res.best_row["slowdown"], res.default_row["slowdown"]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ccddp.sim.predict import predict
from ccddp.sim.schedule import ALGORITHMS, SCHEDULES, Schedule
from ccddp.sim.timeline import run_iteration

MIB = 1 << 20
CAPS_MB = (1, 4, 10, 25, 50, 100, 200, 400, 800, 1600, 3200)
SEGMENTS_MB = (0.25, 0.5, 1, 2, 4, 8, 16, 64)
MAX_BUCKETS = 4096      # finer plans than this only add per-op tolls; skip them for speed


@dataclass
class TuneResult:
    """``best``/``default``: the schedules; ``*_row``: their full :func:`predict` rows
    (slowdowns against the default CC-off); ``top``: the best settings seen, cheapest
    first, as (settings dict, CC-on ms)."""

    best: Schedule
    default: Schedule
    best_row: dict[str, Any]
    default_row: dict[str, Any]
    evaluated: int
    top: list[tuple[dict[str, Any], float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        gain = self.default_row["cc_on_ms"] / self.best_row["cc_on_ms"]
        return {"best": self.best.as_dict(), "default": self.default.as_dict(),
                "best_row": self.best_row, "default_row": self.default_row,
                "speedup_vs_default": gain, "evaluated": self.evaluated,
                "top": [{"settings": s, "cc_on_ms": ms} for s, ms in self.top]}


def _options(hw, wl) -> dict[str, list]:
    caps = [None] + [c for c in CAPS_MB
                     if wl.total_bytes / (c * MIB) <= MAX_BUCKETS
                     and c * MIB < 2 * wl.total_bytes]
    chains = sorted({1, hw.mac_chains, hw.max_chains}
                    | {2 ** i for i in range(16) if 2 ** i <= hw.max_chains})
    return {"bucket_cap_mb": caps, "segment_bytes": [int(s * MIB) for s in SEGMENTS_MB],
            "chains": chains}


def tune(hw, wl, n: int, *, default: Schedule | None = None,
         schedules: tuple[str, ...] = SCHEDULES, algorithms: tuple[str, ...] = ALGORITHMS,
         rounds: int = 4) -> TuneResult:
    """Find the cheapest CC-on settings for ``wl`` on ``n`` devices of ``hw``."""
    default = default or Schedule()
    # Dropping software crypto is only an option where the hardware seals the link.
    schedules = tuple(s for s in schedules if s != "hw-link" or hw.link_encrypted)
    opts = _options(hw, wl)
    plans: dict[Any, Any] = {}
    seen: dict[Schedule, float] = {}

    def cost(s: Schedule) -> float:
        if s not in seen:
            cap = s.bucket_cap_mb
            if cap not in plans:
                plans[cap] = wl if cap is None else wl.rebucket(cap * MIB)
            seen[s] = run_iteration(hw, plans[cap], s, n, cc=True).total_ms
        return seen[s]

    cost(default)
    for sched_name in schedules:
        for algo in algorithms:
            cur = default.with_(schedule=sched_name, algorithm=algo)
            for _ in range(rounds):
                before = cur
                for dim, values in opts.items():
                    if dim == "segment_bytes" and not cur.segmented:
                        continue
                    cur = min((cur.with_(**{dim: v}) for v in values), key=cost)
                if cur == before:
                    break
    ranked = sorted(seen.items(), key=lambda kv: kv[1])
    best = ranked[0][0]
    base_off = predict(hw, wl, default, n)
    best_row = predict(hw, wl, best, n)
    ref = base_off["cc_off_ms"]
    best_row["cc_off_ms"], best_row["slowdown"] = ref, best_row["cc_on_ms"] / ref
    best_row["overhead_share"] = 1 - ref / best_row["cc_on_ms"]
    return TuneResult(best, default, best_row, base_off, len(seen),
                      [(s.as_dict(), ms) for s, ms in ranked[:10]])


__all__ = ["tune", "TuneResult", "CAPS_MB", "SEGMENTS_MB"]
