"""One DDP iteration of one rank, on two timelines: compute and communication.

Input path, forward, then backward; bucket i becomes ready at its point in backward and
joins a FIFO communication stream (DDP launches buckets in order, one worker per rank);
the optimizer runs once backward and every all-reduce are done. Exposed communication is
what the stream still has to do after backward ends (paper Fig. 2).

Where communication and compute share cores or SMs (``overlap_efficiency < 1``), the
engine time of all-reduces that can run during backward stretches backward by the share
that does not hide, and the later buckets become ready later; on a host whose ranks share
its cores (``host_cores > 0``) the last all-reduce also cannot end before the cores have
done the backward's own work (``backward_core_ms`` of a measured workload: what it did
not spend waiting for peers) plus that share of every all-reduce's engine work (crypto,
reduction, message software, and the transfers' own core time where the link is
software), which costs ``1 + interference x ranks per core`` times its time alone.

Example::

    it = run_iteration(hw, wl, Schedule("naive"), n=4, cc=True)
    it.total_ms, it.phases["exposed"], it.counts["seals"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ccddp.sim.bounce import InputCost
from ccddp.sim.hierarchy import allreduce_cost, layout
from ccddp.sim.rates import US_MS, Rates, compute_factor


@dataclass(frozen=True)
class Iteration:
    """``phases`` sum to ``total_ms``: data, input, bounce, forward, backward, contention
    (backward stretched by communication work sharing its cores/SMs), exposed
    (communication after backward), optimizer, launch (CC's kernel-launch toll, see
    :func:`launch_toll_ms`)."""

    total_ms: float
    phases: dict[str, float]
    counts: dict[str, float] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=dict)


def run_iteration(hw, wl, sched, n: int, *, cc: bool, rates: Rates | None = None
                  ) -> Iteration:
    """Simulate one iteration; ``rates`` may be a modified :class:`Rates` (e.g. crypto
    switched off to attribute time)."""
    r = rates or Rates.resolve(hw, sched, n, cc)
    inp = InputCost.of(hw, wl, n=n, cc=cc, rates=r)
    # Measured times already hold the contention of the run they came from.
    cf = r.compute_factor / compute_factor(hw, wl.measured_ranks)
    fwd, bwd, opt = wl.forward_ms * cf, wl.backward_ms * cf, wl.optimizer_ms * cf
    bwd_start = inp.total_ms + fwd
    stretch = 1.0 - hw.overlap_efficiency

    fracs = wl.ready_fractions()
    costs = _costs(hw, wl, sched, r, n, cc) if n > 1 else []
    # Engine work as it costs on cores shared with backward: interference grows with
    # the ranks per core (more switches between them); 1 on devices.
    shared = 1.0 + (hw.interference * r.compute_factor if hw.host_cores > 0 else 0.0)
    busy = [c.busy_ms * shared for c in costs]
    extra = 0.0
    if stretch > 0 and costs:
        # Busy time that can overlap backward: each collective's, at most the backward
        # left once its bucket is ready, and in all at most the backward left after the
        # first bucket. Monotone in every cost, unlike tracking actual start times.
        overlap = sum(min(b, (1 - f) * bwd) for b, f in zip(busy, fracs))
        extra = stretch * min(overlap, (1 - fracs[0]) * bwd)
    comm_free = 0.0
    for c, f in zip(costs, fracs):
        comm_free = max(bwd_start + f * (bwd + extra), comm_free) + c.ms
    if stretch > 0 and costs and hw.host_cores > 0:
        # Work conservation where ranks run on shared host cores: each collective above
        # runs at full speed, but the cores cannot do the backward's own work and (the
        # share that does not hide of) every collective's engine work in less than their
        # sum. A backward's wait for its peers is not core work: the engine work runs in
        # it. (Device profiles keep overlap_efficiency as their only coupling: SMs are
        # partitioned between streams, not time-shared like cores.)
        core = bwd if wl.backward_core_ms is None else wl.backward_core_ms * cf
        comm_free = max(comm_free, bwd_start + core + stretch * sum(busy))
    totals = {k: sum(getattr(c, k) for c in costs)
              for k in ("seals", "opens", "messages", "bytes_sent", "relay_ops", "busy_ms",
                        "crypto_ms", "pad_bytes")}
    totals["comm_ms"] = sum(c.ms for c in costs)
    bwd_end = bwd_start + bwd + extra
    exposed = max(0.0, comm_free - bwd_end)
    launch = launch_toll_ms(hw, wl, cc=cc)
    phases = {
        "data": inp.data_ms, "input": inp.transfer_ms, "bounce": inp.bounce_ms,
        "forward": fwd, "backward": bwd, "contention": extra, "exposed": exposed,
        "optimizer": opt, "launch": launch,
    }
    counts = {k: totals[k] for k in ("seals", "opens", "messages", "bytes_sent",
                                     "relay_ops", "pad_bytes")}
    counts["allreduces"] = wl.num_buckets if n > 1 else 0
    counts["nodes"] = layout(hw, n)[0]
    busy = {"comm_ms": totals["comm_ms"], "engine_ms": totals["busy_ms"],
            "crypto_ms": totals["crypto_ms"], "bounce_crypto_ms": inp.crypto_ms}
    return Iteration(sum(phases.values()), phases, counts, busy)


def launch_toll_ms(hw, wl, *, cc: bool) -> float:
    """What CC adds to an iteration's kernel launches: each of the workload's launches
    takes ``cc_launch_toll`` times its CC-off time.

    The toll is added, not hidden under the device's compute: the production CC
    measurements this follows report that CC "adds a toll around the edges of each
    training step" which more compute dilutes but does not remove (full fine-tuning lost
    18 % of its throughput, LoRA, with a third less compute per step and the same
    launches, 32 %). A step's CC-off time already holds its launches.
    """
    if not cc:
        return 0.0
    return wl.kernel_launches * hw.kernel_launch_us * (hw.cc_launch_toll - 1) * US_MS


def _costs(hw, wl, sched, r: Rates, n: int, cc: bool) -> list:
    """Each bucket's all-reduce cost, in launch order.

    Pad tables (``pad_budget_bytes`` per peer) are refilled once per iteration, while
    the links idle through forward and the optimizer, and drain through backward's
    bursts of all-reduces (seed 002: communication is bursty); so the first buckets get
    pads. The total covered is then independent of how the gradient is bucketed.
    """
    cache: dict[tuple, object] = {}
    out, pads = [], sched.pad_budget_bytes if cc else 0.0
    for nbytes in wl.bucket_bytes:
        key = (nbytes, pads)
        if key not in cache:     # equal buckets (transformer layers) cost the same
            cache[key] = allreduce_cost(hw, sched, r, n, nbytes, cc=cc, pads=pads)
        out.append(cache[key])
        pads = max(0.0, pads - cache[key].pad_bytes)
    return out


__all__ = ["Iteration", "run_iteration", "launch_toll_ms"]
