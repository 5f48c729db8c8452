"""Model projections of paper workloads: the glue between ``ccddp.workloads`` (torch,
DDP's bucketing) and ``ccddp.sim`` (pure Python), used by ``simulate``, ``tune`` and
``characterize``.

Example::

    rows = project_paper_gpus(["bert-base"], gpus=(2, 4, 8))
"""

from __future__ import annotations

from typing import Any

from ccddp.errors import ConfigError


def model_workload(name: str, hw) -> Any:
    """A :class:`~ccddp.sim.workload.WorkloadProfile` for a paper workload: DDP's own
    bucket plan (fp32, the paper's setting), per-parameter sizes so the model can
    re-bucket exactly, phase times from FLOPs or the profile's measured overrides."""
    try:
        from ccddp.workloads import bucket_plan, paper_setup
    except ImportError as e:
        raise ConfigError(f"ccddp.workloads is not available ({e}); pass "
                          "--workload-profile PATH instead") from None
    from dataclasses import replace

    from ccddp.sim.workload import derive_workload, paper_input_bytes

    plan = bucket_plan(name, dtype="float32")
    setup = paper_setup(name)
    wl = derive_workload(name, plan.bucket_bytes, hw, batch_size=setup["batch_size"],
                         forward_flops_per_sample=setup["forward_flops_per_sample"],
                         input_bytes=paper_input_bytes(setup))
    param_bytes = _param_bytes(name)
    if param_bytes and sum(param_bytes) == wl.total_bytes:
        wl = replace(wl, param_bytes=tuple(param_bytes))
    return wl


def _param_bytes(name: str) -> list[int] | None:
    """fp32 gradient bytes per parameter in DDP's bucket-fill order, or None (then
    ``--bucket-cap-mb`` re-buckets as if tensors could be split anywhere)."""
    try:
        from ccddp.workloads import get_workload
        from ccddp.workloads.bucketing import reducer_parameters
    except ImportError:
        return None
    _, params, _ = reducer_parameters(get_workload(name).build_model(device="meta"))
    return [p.numel() * 4 for p in reversed(params)]


def project_paper_gpus(workloads: list[str], gpus=(2, 4, 8),
                       profiles=("paper-h100", "h100-cc"), schedule: str = "naive") -> list[dict]:
    """Predicted CC-off/CC-on rows for ``workloads`` on GPUs not measured here: the
    paper's emulated H100 and Hopper CC as measured in production (seed 003)."""
    from ccddp.sim import Schedule, load_profile, sweep

    rows = []
    for profile in profiles:
        hw = load_profile(profile)
        wls = [model_workload(w, hw) for w in workloads]
        for row in sweep(hw, wls, Schedule(schedule=schedule), gpus):
            rows.append({**row, "profile": profile, "schedule": schedule})
    return rows
