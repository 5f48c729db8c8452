"""Validation of the performance model against this machine's measured training runs.

Reads ``ccddp train --json`` results (or ``ccddp characterize``'s ``results.json``),
pairs each CC-on run with the CC-off run of the same workload, shapes and world size,
and predicts the CC-on run from:

* the hardware profile (``ccddp calibrate``: micro-benchmarks only);
* workload profiles built from the CC-OFF run alone: DDP's bucket plan for the run's
  shapes and dtype (:func:`ccddp.workloads.bucket_plan`, the order DDP rebuilds its
  buckets in), the batch's bytes, and the measured compute phases (data, forward,
  backward, optimizer: "measured compute") of each measured iteration. A CC-on run is
  never a compute source (:func:`workload_from_run` refuses one), so nothing of what is
  predicted feeds the prediction;
* the CC-on run's schedule and settings (``pipelined`` = ccddp's ``secure``, ``naive`` =
  the paper's ``secure-naive``; segment size, chains as the run resolved them).

The measured CC-off backward contains the time gloo's all-reduce threads took from it;
the model adds that contention itself, so the workload's backward is the value for which
the model's CC-off backward (compute + contention) equals the measured one. The measured
rank also waits for its slowest peer at the end of backward (its exposed communication
beyond the model's all-reduce tail): that wait is part of the workload in both modes, so
the backward becomes the slowest rank's (``wait=False`` leaves it out). Where the run
recorded its training thread's CPU time in the backward (``backward_main_cpu_ms``), that,
as wall time on the shared cores, is the backward's own core work and the rest is
waiting: on the host's shared cores the CC-on collectives' work runs in that wait instead
of after it (:func:`ccddp.sim.run_iteration`'s work conservation). Each measured
CC-off iteration is predicted on its own. Where CC-off and CC-on took turns in one launch,
each round's prediction is compared with the CC-on iteration of that round and the errors
are Hodges-Lehmann estimates over the rounds with 95 % intervals; otherwise the medians
of all predicted and measured iterations are compared, as ``ccddp train`` reports the
median iteration (a median of sums, not a sum of medians). Repeated runs of one
configuration are pooled: their measured iterations count together.

Example::

    runs = load_runs(["runs/"])
    rows = validate(load_profile("local.toml"), runs)
    rows[0]["cc_on_error"], rows[0]["ratio_error"], rows[0]["pass"]
"""

from __future__ import annotations

import os

from ccddp.chains import auto_chains
from ccddp.errors import ConfigError
from ccddp.runs import load_runs, run_key, settings_of

SCHEMA = "ccddp.validate/1"
#: A row passes when the CC-on iteration time and the CC-on/CC-off ratio are both within
#: 10 % of the measured ones.
TIME_TOLERANCE = 0.10
RATIO_TOLERANCE = 0.10
SIM_SCHEDULES = {"pipelined": "pipelined", "naive": "naive"}


def _on_key(run: dict) -> tuple:
    """CC-on runs pooled together ran the same schedule with the same settings."""
    st = run.get("settings", {})
    return (run.get("schedule"),) + tuple(st.get(k) for k in ("segment_bytes", "chains", "tag",
                                                               "allgather", "algorithm"))


def pair_runs(runs: list[dict]) -> list[tuple[list[dict], list[dict]]]:
    """(CC-off runs, CC-on runs) per workload/shapes/world size and CC-on schedule. Repeated
    runs of one configuration are pooled: their measured iterations count together, which
    averages out a machine that other work disturbs now and then."""
    offs: dict[tuple, list[dict]] = {}
    ons: dict[tuple, list[dict]] = {}
    for r in runs:
        if r.get("cc") == "off":
            offs.setdefault(run_key(r), []).append(r)
        elif r.get("cc") == "on":
            ons.setdefault((run_key(r), _on_key(r)), []).append(r)
    pairs = [(offs[key], group) for (key, _), group in ons.items() if key in offs]
    if not pairs:
        raise ConfigError("no CC-on run has a CC-off run of the same workload, shapes and "
                          "world size to take compute times from")
    return pairs


def _many(runs) -> list[dict]:
    return runs if isinstance(runs, list) else [runs]


def pooled_steps(runs) -> list[dict]:
    """The measured iterations of one or more runs of a configuration."""
    return [it for r in _many(runs) for it in measured_steps(r)]


def measured_ms(runs, phase: str = "total_ms") -> float:
    """Median of a phase over the pooled measured iterations (``ccddp train``'s summary
    for a single run)."""
    import statistics

    return statistics.median(it[phase] for it in pooled_steps(runs))


# -- the model's inputs ------------------------------------------------------------------

def _workload(run: dict):
    from ccddp.workloads import get_workload

    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in settings_of(run).items()}
    return get_workload(run["workload"], size=run.get("size", "default"), **settings)


def bucket_bytes(run: dict) -> list[int]:
    """DDP's buckets for the run's model, in the order DDP rebuilds them after iteration
    0 (the measured iterations); checked against the all-reduces the run counted."""
    from ccddp.workloads import bucket_plan

    wl = _workload(run)
    calls = run.get("allreduce_calls_per_iteration")
    plan = None
    for order in ("ready", "reverse"):
        try:
            plan = bucket_plan(wl, bucket_cap_mb=run.get("bucket_cap_mb"), order=order)
        except Exception:  # tracing the ready order needs a meta-device backward
            continue
        if calls is None or plan.num_buckets == calls:
            return list(plan.bucket_bytes)
    if plan is None:
        raise ConfigError(f"cannot build the bucket plan of {run['workload']}")
    raise ConfigError(f"{run.get('source', run['workload'])}: the run made {calls} all-reduces "
                      f"per iteration, DDP's bucket plan has {plan.num_buckets}")


def input_bytes(run: dict) -> int:
    """Bytes of one rank's batch (what the bounce path seals)."""
    batch = _workload(run).make_batch(0, 0, int(run["world_size"]))
    return int(sum(t.numel() * t.element_size() for t in batch.values()))


def measured_steps(run: dict) -> list[dict]:
    """The measured (not warm-up) iterations of a run; its summary medians if the file
    holds no iterations."""
    its = [it for it in run.get("iterations", []) if not it.get("warmup")]
    return its or [run["summary"]]


def workload_from_run(run: dict, hw, *, step: dict | None = None,
                      buckets: list[int] | None = None, nbytes: int | None = None,
                      wait: bool = True):
    """The model's :class:`~ccddp.sim.WorkloadProfile` from a measured CC-OFF run: its
    summary medians, or one measured iteration ``step`` (an entry of ``iterations``).
    ``wait``: count this rank's wait for its slowest peer into the backward (see below).

    A CC-on run is refused: its phases hold the very cost the model is to predict.
    ``buckets``/``nbytes`` skip rebuilding the model (tests, repeated calls).
    """
    from dataclasses import replace

    from ccddp.sim import Schedule, WorkloadProfile, run_iteration
    from ccddp.sim.rates import compute_factor
    from ccddp.sim.solve import root

    if run.get("cc") != "off":
        raise ConfigError(f"{run.get('source', run.get('workload'))} is a CC-{run.get('cc')} "
                          "run: compute times come from CC-off runs only (a CC-on run holds "
                          "the cost being predicted)")
    s = step if step is not None else run["summary"]
    n = int(run["world_size"])
    wl = WorkloadProfile(
        run["workload"], bucket_bytes=buckets if buckets is not None else bucket_bytes(run),
        forward_ms=s["forward_ms"], backward_ms=s["backward_ms"],
        optimizer_ms=s["optimizer_ms"], data_ms=s["data_ms"],
        input_bytes=float(nbytes if nbytes is not None else input_bytes(run)),
        measured_ranks=n)
    target = s["backward_ms"]

    def model_bwd(b: float) -> float:
        ph = run_iteration(hw, replace(wl, backward_ms=b), Schedule(), n, cc=False).phases
        return ph["backward"] + ph["contention"]

    # bwd + contention(bwd) rises with bwd: solve for the compute-only backward.
    if n > 1 and model_bwd(target) > target:
        b = root(lambda x: model_bwd(x) - target, 0.0, target)
        wl = replace(wl, backward_ms=b if b is not None else 0.0)
    if n > 1 and wait:
        # This rank's exposed communication beyond the model's all-reduce tail is the
        # wait for its slowest peer (ranks on shared cores are scheduled unevenly; a
        # graph's batches differ per rank). Every collective runs at the slowest rank's
        # pace, with CC on as with CC off, so the workload's backward is the slowest
        # rank's: this rank's plus the wait.
        tail = run_iteration(hw, wl, Schedule(), n, cc=False).phases["exposed"]
        extra = max(0.0, s.get("exposed_comm_ms", 0.0) - tail)
        wl = replace(wl, backward_ms=wl.backward_ms + extra)
    if n > 1 and s.get("backward_main_cpu_ms") is not None:
        # The backward's own core work: its compute thread's CPU time (autograd's CPU
        # backward runs in the thread that calls it), as wall time on cores shared by n
        # ranks. The rest of the backward is waiting, which the collectives' work fills.
        core = s["backward_main_cpu_ms"] * compute_factor(hw, n)
        wl = replace(wl, backward_core_ms=min(core, wl.backward_ms))
    return wl


def workloads_from_run(runs, hw, *, wait: bool = True) -> list:
    """One workload profile per measured iteration of a CC-off run, or of several runs of
    one configuration (same buckets and batch bytes, each iteration's phases)."""
    runs = _many(runs)
    for r in runs:
        if r.get("cc") != "off":
            workload_from_run(r, hw)          # raises the refusal
    buckets, nbytes = bucket_bytes(runs[0]), input_bytes(runs[0])
    return [workload_from_run(r, hw, step=it, buckets=buckets, nbytes=nbytes, wait=wait)
            for r in runs for it in measured_steps(r)]


def schedule_from_run(run: dict):
    """The sim :class:`~ccddp.sim.Schedule` a CC-on run used."""
    from ccddp.sim import Schedule

    sched = run.get("schedule")
    if sched not in SIM_SCHEDULES:
        raise ConfigError(f"{run.get('source')}: unknown schedule {sched!r}")
    st = run.get("settings", {})
    chains = int(st.get("chains") or 0)
    if chains == 0:
        # ccddp.comm's automatic chains, by its own rule: the node's cores shared by its
        # local ranks (every rank of these runs is on one host).
        cores = int(run.get("machine", {}).get("cores") or os.cpu_count() or 1)
        local = int(run.get("local_world_size") or run["world_size"])
        chains = auto_chains(cores, local)
    name = SIM_SCHEDULES[sched]
    if name == "pipelined" and st.get("allgather") == "group-key":
        name = "group-key-allgather"
    # Pre-computed pads: keystream each link keeps ahead (the device engine's budget).
    return Schedule(name, algorithm=st.get("algorithm", "ring"),
                    segment_bytes=int(st.get("segment_bytes", 4 << 20)), chains=chains,
                    tag=st.get("tag", "segment"),
                    pad_budget_bytes=float(st.get("pad_budget_bytes") or 0))


# -- the comparison ----------------------------------------------------------------------

def launch_rounds(offs: list[dict], ons: list[dict]) -> dict[tuple, tuple[list[int], list[dict]]] | None:
    """Where the CC-on runs took turns with CC-off runs in one launch: per (launch, round),
    the indices of its CC-off iterations among the pooled ones (:func:`pooled_steps`
    order) and its CC-on iterations. None when any CC-on run has no CC-off run of its
    launch or an iteration has no round (separate launches: only pooled medians compare)."""
    start, by_launch = 0, {}
    for r in offs:
        steps = measured_steps(r)
        launch = r.get("pairing", {}).get("launch")
        if launch is not None:
            by_launch[launch] = (start, steps)
        start += len(steps)
    out: dict[tuple, tuple[list[int], list[dict]]] = {}
    for r in ons:
        launch = r.get("pairing", {}).get("launch")
        if launch is None or launch not in by_launch:
            return None
        first, off_steps = by_launch[launch]
        for j, it in enumerate(off_steps):
            if it.get("round") is None:
                return None
            out.setdefault((launch, it["round"]), ([], []))[0].append(first + j)
        for it in measured_steps(r):
            if (launch, it.get("round")) not in out:
                return None
            out[(launch, it["round"])][1].append(it)
    return {k: v for k, v in out.items() if v[0] and v[1]} or None


def paired_errors(preds: list[dict], offs: list[dict], rounds: dict) -> dict:
    """The prediction against the measurement round by round (medians within a round of
    blocks): Hodges-Lehmann estimates with 95 % signed-rank intervals
    (:func:`ccddp.stats.paired_ratio`) of predicted/measured CC-on time and of
    predicted/measured CC-on/CC-off ratio, and the measured and predicted ratios."""
    import statistics

    from ccddp.stats import paired_ratio

    med = statistics.median
    off_steps = pooled_steps(offs)
    m_on = {k: med(it["total_ms"] for it in ons) for k, (_, ons) in rounds.items()}
    m_off = {k: med(off_steps[i]["total_ms"] for i in idx) for k, (idx, _) in rounds.items()}
    p_on = {k: med(preds[i]["cc_on_ms"] for i in idx) for k, (idx, _) in rounds.items()}
    p_off = {k: med(preds[i]["cc_off_ms"] for i in idx) for k, (idx, _) in rounds.items()}
    time = paired_ratio(p_on, m_on)
    ratio = paired_ratio({k: p_on[k] / p_off[k] for k in p_on}, {k: m_on[k] / m_off[k] for k in m_on})

    def shifted(iv):       # a ratio's interval as an error's (ratio - 1)
        return None if iv.low is None else [iv.low - 1, iv.high - 1]

    return {"rounds": time.n, "cc_on_error": time.estimate - 1,
            "cc_on_error_interval": shifted(time), "ratio_error": ratio.estimate - 1,
            "ratio_error_interval": shifted(ratio),
            "measured_ratio": paired_ratio(m_on, m_off).estimate,
            "predicted_ratio": paired_ratio(p_on, p_off).estimate}


def compare(hw, off, on, *, wls: list | None = None) -> dict:
    """One validation row: measured CC-off / CC-on (a run each, or lists of repeated runs
    of one configuration) against the model's prediction.

    The model predicts each measured CC-off iteration (its own batch, its own compute
    times) with CC off and with CC on. Where the variants took turns in one launch
    (``ccddp train --cc off,on``), each round's prediction is compared with the CC-on
    iteration measured seconds after the CC-off one it came from, and the errors are the
    Hodges-Lehmann estimates over the rounds with their 95 % intervals
    (:func:`paired_errors`): the machine's drift between launches cancels. Otherwise the
    medians of all predicted and all measured iterations are compared (a median of sums,
    not a sum of medians). Both are in the row (``comparison`` says which decides);
    ``wls``: the workload profiles per iteration, if already built
    (:func:`workloads_from_run`).
    """
    import statistics

    from ccddp.sim import predict

    offs, ons = _many(off), _many(on)
    keys = {run_key(r) for r in offs + ons}
    if len(keys) != 1 or any(r.get("cc") != "off" for r in offs) \
            or len({_on_key(r) for r in ons}) != 1:
        raise ConfigError("compare needs CC-off and CC-on runs of the same workload, "
                          "shapes and world size (and one CC-on schedule)")
    off, on = offs[0], ons[0]
    wls = wls if wls is not None else workloads_from_run(offs, hw)
    n = int(on["world_size"])
    sched = schedule_from_run(on)
    preds = [predict(hw, wl, sched, n) for wl in wls]
    med = statistics.median
    m_off, m_on = measured_ms(offs), measured_ms(ons)
    p_off = med(p["cc_off_ms"] for p in preds)
    p_on = med(p["cc_on_ms"] for p in preds)
    pooled = {"cc_on_error": p_on / m_on - 1, "measured_ratio": m_on / m_off,
              "predicted_ratio": p_on / p_off}
    pooled["ratio_error"] = pooled["predicted_ratio"] / pooled["measured_ratio"] - 1
    rounds = launch_rounds(offs, ons)
    paired = paired_errors(preds, offs, rounds) if rounds else None
    use = paired or pooled
    err, rerr = use["cc_on_error"], use["ratio_error"]
    phases = ("data_ms", "bounce_ms", "forward_ms", "backward_ms", "exposed_comm_ms",
              "optimizer_ms")
    pred_on = [_as_measured(p["phases"]) for p in preds]
    pred_off = [_as_measured(p["phases_cc_off"]) for p in preds]
    wl = wls[0]
    return {
        "workload": on["workload"], "world_size": n, "schedule": on["schedule"],
        "shapes": settings_of(on), "segment_bytes": sched.segment_bytes,
        "chains": sched.chains, "buckets": wl.num_buckets, "gradient_bytes": wl.total_bytes,
        "runs_cc_off": len(offs), "runs_cc_on": len(ons),
        "iterations_modelled": len(wls),
        "iterations_measured_cc_on": len(pooled_steps(ons)),
        "comparison": "paired by round" if paired else "pooled medians",
        "measured_cc_off_ms": m_off, "measured_cc_on_ms": m_on,
        "predicted_cc_off_ms": p_off, "predicted_cc_on_ms": p_on,
        "cc_off_error": p_off / m_off - 1, "cc_on_error": err,
        "measured_ratio": use["measured_ratio"], "predicted_ratio": use["predicted_ratio"],
        "ratio_error": rerr,
        "pass_time": abs(err) <= TIME_TOLERANCE, "pass_ratio": abs(rerr) <= RATIO_TOLERANCE,
        "pass": abs(err) <= TIME_TOLERANCE and abs(rerr) <= RATIO_TOLERANCE,
        "paired": paired, "pooled": pooled,
        "measured_phases_cc_off": {k: measured_ms(offs, k) for k in phases},
        "measured_phases_cc_on": {k: measured_ms(ons, k) for k in phases},
        # The model's iterations in the measured phases' terms (medians per phase).
        "predicted_phases_cc_off": {k: med(p[k] for p in pred_off) for k in phases},
        "predicted_phases_cc_on": {k: med(p[k] for p in pred_on) for k in phases},
        "predicted_breakdown_cc_on": {k: med(p["breakdown"][k] for p in preds)
                                      for k in preds[0]["breakdown"]},
        "compute_source": [r.get("source", "cc-off run") for r in offs],
        "predicted_source": [r.get("source", "cc-on run") for r in ons],
    }


def _as_measured(ph: dict) -> dict:
    """The model's phases in ``ccddp train``'s terms: its backward ends when the last
    bucket is handed over, so it includes the contention."""
    return {"data_ms": ph["data"], "bounce_ms": ph["input"] + ph["bounce"],
            "forward_ms": ph["forward"], "backward_ms": ph["backward"] + ph["contention"],
            "exposed_comm_ms": ph["exposed"], "optimizer_ms": ph["optimizer"]}


def validate(hw, runs: list[dict]) -> list[dict]:
    """Rows for every CC-on run with a CC-off partner, sorted by workload, world size and
    schedule."""
    rows, cache = [], {}
    for offs, ons in pair_runs(runs):
        key = run_key(offs[0])
        if key not in cache:
            cache[key] = workloads_from_run(offs, hw)
        rows.append(compare(hw, offs, ons, wls=cache[key]))
    rows.sort(key=lambda r: (r["workload"], r["world_size"], r["schedule"]))
    return rows


def verdict(rows: list[dict], *, schedule: str = "pipelined") -> dict:
    """Every row's pass count, and whether at least three workloads pass at world sizes 2
    and 4 (on ``schedule``)."""
    by_wl: dict[str, dict[int, bool]] = {}
    for r in rows:
        if r["schedule"] == schedule:
            by_wl.setdefault(r["workload"], {})[r["world_size"]] = r["pass"]
    good = sorted(w for w, ws in by_wl.items() if ws.get(2) and ws.get(4))
    return {"schedule": schedule, "workloads_passing_ws2_and_ws4": good,
            "accepted": len(good) >= 3,
            "rows_passing": sum(r["pass"] for r in rows), "rows": len(rows)}


__all__ = ["load_runs", "pair_runs", "run_key", "workload_from_run", "workloads_from_run",
           "measured_steps", "pooled_steps", "measured_ms", "schedule_from_run",
           "launch_rounds", "paired_errors", "compare", "validate", "verdict",
           "TIME_TOLERANCE", "RATIO_TOLERANCE"]
