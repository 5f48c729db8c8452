"""ccddp.sim: a CC-aware performance model of DDP training (no torch, no torch.distributed).

It predicts one training iteration per rank, CC off and CC on: the input bounce path,
forward, backward with buckets becoming ready in order, bucketed secure all-reduces
overlapped with backward, the optimizer; each ring or tree step costed by link latency and
bandwidth plus the crypto of the chosen schedule. Hardware is data (``profiles/*.toml``,
see :mod:`ccddp.sim.profile`); workloads are plain bucket plans and phase times
(:mod:`ccddp.sim.workload`).

Example::

    from ccddp.sim import Schedule, WorkloadProfile, load_profile, predict
    hw = load_profile("paper-h100")
    wl = WorkloadProfile("toy", bucket_bytes=[25 << 20] * 8, forward_ms=50,
                         backward_ms=100, optimizer_ms=5, input_bytes=1 << 20)
    row = predict(hw, wl, Schedule("pipelined"), n=8)
    row["slowdown"], row["breakdown"], row["ops"]["seals"]

Modules: profile (hardware data, each value with its source), workload (workload data),
catalog (the paper's workloads, shipped as data), schedule (settings), rates (per-rank
unit costs), collective (one node's all-reduce), hierarchy (across nodes, CPU-TEE relay),
bounce (input path), timeline (one iteration), predict (CC-off vs CC-on rows), tune
(search for the cheapest settings), envelope (what a prediction rests on), fidelity (the
model against the published numbers, and the fit of paper-h100), solve (the root finder).
"""

from ccddp.sim.predict import BREAKDOWN_KEYS, predict, sweep
from ccddp.sim.profile import (FIELDS, FieldValue, HardwareProfile, Source, builtin_names,
                               describe_fields, load_profile, validate_profile, write_profile)
from ccddp.sim.schedule import ALGORITHMS, SCHEDULES, Schedule
from ccddp.sim.timeline import Iteration, run_iteration
from ccddp.sim.tune import TuneResult, tune
from ccddp.sim.workload import (WorkloadProfile, derive_workload, load_workload_profile,
                                workload_from_dict)

__all__ = [
    "BREAKDOWN_KEYS", "predict", "sweep", "FIELDS", "FieldValue", "Source",
    "HardwareProfile", "builtin_names",
    "describe_fields", "load_profile", "validate_profile", "write_profile", "ALGORITHMS",
    "SCHEDULES", "Schedule", "Iteration", "run_iteration", "TuneResult", "tune",
    "WorkloadProfile", "derive_workload", "load_workload_profile", "workload_from_dict",
]
