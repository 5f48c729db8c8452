"""Search for the CC-on settings that make an iteration cheapest, inside what was measured.

Dimensions: bucket cap, schedule, algorithm, segment size, chains. For every
(schedule, algorithm) pair the search starts from the system's default and improves one
dimension at a time until nothing changes (coordinate descent); every point it visits is a
full iteration simulation, so the answer accounts for overlap with backward, not just
all-reduce time. The default setting is always evaluated, so the best is never worse.

Chains and segment sizes stay inside the profile's envelope (what its crypto was
measured or fitted over, :mod:`ccddp.sim.envelope`) unless ``beyond_envelope``. The result
names the ASSUMED profile fields the gain moves with and the setting's security
trade-off.

Slowdowns are against the CC-off iteration with DDP's default buckets: the run the user
has today.

Example::

    res = tune(load_profile("h100-cc"), wl, n=8)
    res.best, res.best_row["slowdown"], res.default_row["slowdown"], res.rests_on
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ccddp.sim.envelope import outside_envelope, rests_on, security_tradeoff
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
    first, as (settings dict, CC-on ms); ``rests_on``: (ASSUMED field, largest relative
    change of the gain when it is halved or doubled); ``time_rests_on``: the same for the
    best setting's CC-on time; ``outside``: how the best goes beyond
    the envelope (only with ``beyond_envelope``); ``tradeoff``: its security trade-off."""

    best: Schedule
    default: Schedule
    best_row: dict[str, Any]
    default_row: dict[str, Any]
    evaluated: int
    top: list[tuple[dict[str, Any], float]] = field(default_factory=list)
    rests_on: list[tuple[str, float]] = field(default_factory=list)
    time_rests_on: list[tuple[str, float]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    tradeoff: str | None = None

    def as_dict(self) -> dict[str, Any]:
        gain = self.default_row["cc_on_ms"] / self.best_row["cc_on_ms"]
        return {"best": self.best.as_dict(), "default": self.default.as_dict(),
                "best_row": self.best_row, "default_row": self.default_row,
                "speedup_vs_default": gain, "evaluated": self.evaluated,
                "top": [{"settings": s, "cc_on_ms": ms} for s, ms in self.top],
                "gain_rests_on_assumed": [{"field": f, "change": c} for f, c in self.rests_on],
                "time_rests_on_assumed": [{"field": f, "change": c}
                                          for f, c in self.time_rests_on],
                "outside_envelope": list(self.outside), "security_tradeoff": self.tradeoff}


def _options(hw, wl, beyond: bool) -> dict[str, list]:
    caps = [None] + [c for c in CAPS_MB
                     if wl.total_bytes / (c * MIB) <= MAX_BUCKETS
                     and c * MIB < 2 * wl.total_bytes]
    top = hw.max_chains if beyond else min(hw.max_chains, hw.envelope_chains)
    chains = sorted({c for c in {1, hw.mac_chains, top} | {2 ** i for i in range(16)}
                     if 1 <= c <= top})
    segs = [int(s * MIB) for s in SEGMENTS_MB]
    if not beyond:
        segs = [s for s in segs if hw.envelope_min_bytes <= s <= hw.envelope_max_bytes] or \
            [int(hw.envelope_max_bytes)]
    return {"bucket_cap_mb": caps, "segment_bytes": segs, "chains": chains}


def tune(hw, wl, n: int, *, default: Schedule | None = None,
         schedules: tuple[str, ...] = SCHEDULES, algorithms: tuple[str, ...] = ALGORITHMS,
         rounds: int = 4, beyond_envelope: bool = False) -> TuneResult:
    """Find the cheapest CC-on settings for ``wl`` on ``n`` devices of ``hw``."""
    default = default or Schedule.default_for(hw)
    # The system's own protection is only an option where the system protects the link.
    schedules = tuple(s for s in schedules if s != "native" or not hw.sealed_inside_node)
    opts = _options(hw, wl, beyond_envelope)
    plans: dict[Any, Any] = {}
    seen: dict[Schedule, float] = {}

    def cost(s: Schedule, h=hw) -> float:
        cap = s.bucket_cap_mb
        if cap not in plans:
            plans[cap] = wl if cap is None else wl.rebucket(cap * MIB)
        if h is not hw:
            return run_iteration(h, plans[cap], s, n, cc=True).total_ms
        if s not in seen:
            seen[s] = run_iteration(hw, plans[cap], s, n, cc=True).total_ms
        return seen[s]

    cost(default)
    for sched_name in schedules:
        for algo in algorithms:
            cur = default.with_(schedule=sched_name, algorithm=algo)
            if sched_name != "native" and default.schedule == "native":
                cur = cur.with_(chains=None)
            for _ in range(rounds):
                before = cur
                for dim, values in opts.items():
                    if dim == "segment_bytes" and not cur.segmented:
                        continue
                    if dim == "chains" and not cur.sealed:
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
    # The gain, and what it rests on: re-cost both settings with each assumed field moved.
    assumed = [] if best == default else rests_on(
        hw, lambda h: cost(default, h) / cost(best, h))
    time = rests_on(hw, lambda h: cost(best, h))
    return TuneResult(best, default, best_row, base_off, len(seen),
                      [(s.as_dict(), ms) for s, ms in ranked[:10]], assumed, time,
                      outside_envelope(hw, best, n), security_tradeoff(best))


__all__ = ["tune", "TuneResult", "CAPS_MB", "SEGMENTS_MB"]
