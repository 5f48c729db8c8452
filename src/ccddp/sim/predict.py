"""CC-off vs CC-on for one workload at one world size: the result row.

Rows are plain dicts (results are data: they go to JSON as they are). The CC-on
breakdown mirrors paper Figs. 8b/9b and sums to ``cc_on_ms``. Communication cost
(exposed after backward, plus backward stretched where comm and compute share cores or
SMs) is split into ``crypto`` and ``comm`` by re-running the same schedule with free
crypto: what remains is the ring's own cost (with CC link tolls), the rest is crypto.

Example::

    row = predict(load_profile("paper-h100"), wl, Schedule("naive"), 4)
    row["slowdown"], row["breakdown"]["crypto"], row["ops"]["ops_per_allreduce"]
"""

from __future__ import annotations

from typing import Any, Iterable

from ccddp.errors import ConfigError
from ccddp.sim.rates import Rates
from ccddp.sim.timeline import run_iteration

BREAKDOWN_KEYS = ("data", "input", "bounce", "forward", "backward", "comm", "crypto",
                  "optimizer", "launch")


def _breakdown(phases: dict[str, float], free: dict[str, float] | None) -> dict[str, float]:
    """``comm`` + ``crypto`` = exposed communication + the backward it stretched;
    ``crypto`` is what disappears when crypto is free (``free``: that run's phases)."""
    cost = phases["exposed"] + phases["contention"]
    crypto = 0.0
    if free is not None:
        crypto = min(cost, max(0.0, cost - free["exposed"] - free["contention"]))
    out = {k: phases.get(k, 0.0) for k in BREAKDOWN_KEYS}
    out["comm"], out["crypto"] = cost - crypto, crypto
    return out


def predict(hw, wl, sched, n: int) -> dict[str, Any]:
    """Predict one (workload, world size) under one profile and schedule."""
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"number of GPUs must be a positive integer, got {n!r}")
    if sched.bucket_cap_mb is not None:
        wl = wl.rebucket(sched.bucket_cap_mb * (1 << 20))
    off = run_iteration(hw, wl, sched, n, cc=False)
    r_on = Rates.resolve(hw, sched, n, True)
    on = run_iteration(hw, wl, sched, n, cc=True, rates=r_on)
    free = run_iteration(hw, wl, sched, n, cc=True, rates=r_on.without_crypto())
    seals, opens = on.counts["seals"], on.counts["opens"]
    k = on.counts["allreduces"]
    slowdown = on.total_ms / off.total_ms if off.total_ms > 0 else float("inf")
    return {
        "workload": wl.name,
        "gpus": n,
        "nodes": on.counts["nodes"],
        "profile": hw.name,
        "schedule": sched.schedule,
        "algorithm": sched.algorithm,
        "bucket_cap_mb": sched.bucket_cap_mb,
        "segment_bytes": sched.segment_bytes,
        "chains": sched.chains_for(hw, n) if sched.sealed else 0,
        "tag": sched.tag,
        "mac_batch": sched.mac_batch,
        "pad_budget_bytes": sched.pad_budget_bytes,
        "op_bucket_share": hw.op_bucket_share,
        "buckets": wl.num_buckets,
        "gradient_bytes": wl.total_bytes,
        "cc_off_ms": off.total_ms,
        "cc_on_ms": on.total_ms,
        "slowdown": slowdown,
        "overhead_share": 1.0 - off.total_ms / on.total_ms if on.total_ms > 0 else 0.0,
        "breakdown": _breakdown(on.phases, free.phases),
        "breakdown_cc_off": _breakdown(off.phases, None),
        "ops": {
            "allreduces": k,
            "seals": seals,
            "opens": opens,
            "crypto_ops": seals + opens,
            "ops_per_allreduce": (seals + opens) / k if k else 0.0,
            "messages": on.counts["messages"],
            "relay_ops": on.counts["relay_ops"],
            "bytes_sent": on.counts["bytes_sent"],
            "pad_bytes": on.counts["pad_bytes"],
        },
        "busy_ms": dict(on.busy),
        # The timelines' own phases (contention and exposed apart), to set beside a
        # measured run's phases.
        "phases": dict(on.phases),
        "phases_cc_off": dict(off.phases),
    }


def sweep(hw, workloads: Iterable, sched, gpus: Iterable[int]) -> list[dict[str, Any]]:
    """Rows for every workload at every world size, in that order."""
    return [predict(hw, wl, sched, n) for wl in workloads for n in gpus]


__all__ = ["predict", "sweep", "BREAKDOWN_KEYS"]
