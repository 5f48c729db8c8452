"""The c10d operations of a ccddp group, as one table: an :class:`Op` record per operation.

Each record describes one method that c10d calls on a ``ProcessGroup`` (``Op.method``,
with torch's signature) once, the way nccl-tests describes each collective once:

- ``name``: the op's c10d name (``"all_reduce"``): what ``ProcessGroupCCDDP.calls``, the
  per-op crypto counters and every error message say;
- ``check``: every check of the arguments, on the caller's thread, before anything is
  queued (layout, device, dtype, reduction, sizes: a :class:`ConfigError` that names the
  op, never a plaintext fallback), and how the tensors are flattened into ``calls.Call`` objects,
  one per engine call (a coalesced op has several). It returns what the work completes
  with, what the op only reads (both as torch passed them), and the calls;
- ``stage``: where each call works (``calls.stage``: the tensor's own memory when it is
  contiguous, else a contiguous copy on its device, or a pinned host copy when a CUDA
  tensor's placement is staged; ``calls.stage_on_host``: always host memory, for the ops
  whose engine code is host-only -- all-to-all, gather, scatter);
- ``engine``: the engine entry point that runs the call on the op queue's thread
  (``ccddp.comm.collectives.run_*``; with trust domains larger than one rank, all-reduce,
  reduce, broadcast and equal-chunk reduce-scatter run ``comm.hierarchy.hierarchical_*``;
  all-to-all, gather and scatter run ``ccddp.comm.exchange``'s sealed pairwise exchanges);
- ``write_back``: how the results reach the caller's tensors afterwards
  (``calls.write_back``; a reduce writes back on its root only).

:func:`method` turns a record into the group's method (``ProcessGroupCCDDP.allreduce =
method(ALL_REDUCE)``), which runs ``ProcessGroupCCDDP._run``: check and stage on the
caller's thread, then ``Op.run`` (engine, write-back) queued; the module docstring of
:mod:`ccddp.backend.process_group` follows a ``dist.all_reduce`` from there to the wire.
The ops that are no collective of the engine (``monitored_barrier``, ``send``, ``recv``,
``recv_anysource``) are in :mod:`ccddp.backend.peers`.

Measurement-only schedules: ``secure-naive`` (``ccddp.comm.naive``, the paper's
whole-chunk emulation) and ``tree`` (``ccddp.comm.tree``) are picked inside the engine by
the group's ``CommSettings`` (``comm.collectives._run_ring``, ``run_all_reduce``). A group
made from the environment (``CCDDP_SETTINGS``: the backend's default path) refuses them
(:func:`refuse_measurement_only`); they run only where a benchmark passes them explicitly
(``Options(settings=...)``: ``ccddp.bench.ddp``, ``ccddp bench collectives --algorithm``) or
drives the engine directly (``ccddp.bench.reference``).

Example::

    ALL_REDUCE.check(pg, [t], opts)     # -> ([t], (), [Call([t], reduction=Reduction.SUM)])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ccddp.backend.calls import (Call, check, cut, one, reduction, root_of, same_dtype, split_rows, stage,
                                 stage_on_host, uneven, write_back, write_back_at_root)
from ccddp.comm.collectives import run_all_gather, run_all_reduce, run_broadcast, run_reduce_scatter
from ccddp.comm.exchange import all_to_all, gather, scatter
from ccddp.comm.hierarchy import hierarchical_all_reduce, hierarchical_broadcast, hierarchical_reduce_scatter
from ccddp.comm.reduce import Reduction
from ccddp.errors import ConfigError

def refuse_measurement_only(settings, source: str) -> None:
    """A group whose settings came from ``source`` (the environment: the default path)
    runs the product's schedule only: ``secure`` on the ring."""
    for field, value, where in (("impl", settings.impl, "ccddp.comm.naive"),
                                ("algorithm", settings.algorithm, "ccddp.comm.tree")):
        if value not in ("secure", "ring"):
            raise ConfigError(f"{source}: {field} {value!r} is a measurement-only schedule ({where}); a ccddp group "
                              f"runs it only with settings passed explicitly (pg_options=Options(settings=...)), "
                              f"as ccddp's benchmarks do")


# -- the record -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One c10d operation of the table (see the module docstring)."""

    method: str                                   # the ProcessGroup method c10d calls
    name: str                                     # its c10d name: calls, counters, errors
    check: Callable[..., tuple]                   # (pg, *torch's args) -> (result, inputs, [Call])
    engine: Callable[[object, Call], None]        # (pg, call): the engine entry point
    stage: Callable[[object, Call], None] = stage
    write_back: Callable[[object, Call], None] = write_back

    def run(self, pg, calls: list[Call]) -> None:
        """The queued job: each call's engine entry point, then its write-back -- outside
        autograd, as gloo writes (a collective on a parameter, a leaf that requires grad,
        writes its data, whichever thread runs the job)."""
        engine, write_back = self.engine, self.write_back
        with torch.no_grad():
            for call in calls:
                engine(pg, call)
                write_back(pg, call)


def method(op: Op):
    """The ``ProcessGroup`` method c10d calls for ``op``: ``ProcessGroupCCDDP._run(op, ...)``,
    with torch's signature (``op.check``'s); the group keeps it out of dynamo's tracing
    (:mod:`ccddp.backend.eager`). pybind11 finds it as it finds any Python override
    (``getattr`` on the group, at each C++ call)."""
    def bound(self, *args, **kwargs):
        return self._run(op, *args, **kwargs)

    bound.__name__ = bound.__qualname__ = op.method
    params = list(inspect.signature(op.check).parameters.values())
    bound.__signature__ = inspect.Signature([params[0].replace(name="self")] + params[1:])
    bound.__doc__ = f"c10d's ``{op.method}`` ({op.name}), sealed: ``ccddp.backend.ops``."
    return bound


# -- engine entry points (the queue's thread) ---------------------------------------------------
def _all_reduce_flat(pg, flat: torch.Tensor, red: Reduction) -> None:
    """Hierarchical over trust domains, else the sealed ring (or tree)."""
    if pg.domain_links is not None:
        hierarchical_all_reduce(pg.domain_links, flat, red)
    else:
        run_all_reduce(pg.endpoint, flat, red)


def _reduce_scatter_flat(pg, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> None:
    """Equal chunks, 1-D contiguous: hierarchical over trust domains, else the flat ring."""
    if pg.domain_links is not None:
        hierarchical_reduce_scatter(pg.domain_links, out, inp, red)
    else:
        run_reduce_scatter(pg.endpoint, out, inp, red)


def _all_reduce(pg, c: Call) -> None:
    _all_reduce_flat(pg, c.bufs[0].view(-1), c.reduction)


def _all_reduce_alike(pg, c: Call) -> None:
    """One flat all-reduce per (dtype, device) of the coalesced tensors."""
    alike: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for buf in c.bufs:
        alike.setdefault((buf.dtype, buf.device), []).append(buf)
    for same in alike.values():
        flat = torch.cat([b.reshape(-1) for b in same])
        _all_reduce_flat(pg, flat, c.reduction)
        for b, part in zip(same, flat.split([b.numel() for b in same])):
            b.copy_(part.view(b.shape))


def _reduce(pg, c: Call) -> None:
    # Every rank takes part in a sealed all-reduce; only the root keeps the result.
    buf = c.bufs[0]
    _all_reduce_flat(pg, (buf if c.root == pg.rank() else buf.clone()).view(-1), c.reduction)


def _broadcast(pg, c: Call) -> None:
    if pg.domain_links is not None:
        hierarchical_broadcast(pg.domain_links, c.bufs[0].view(-1), c.root)
    else:
        run_broadcast(pg.endpoint, c.bufs[0].view(-1), c.root)


def _all_gather(pg, c: Call) -> None:
    src = c.srcs[0]
    flat = torch.empty(sum(c.sizes), dtype=src.dtype, device=src.device)
    run_all_gather(pg.endpoint, flat, src.reshape(-1), c.bounds)
    for buf, part in zip(c.bufs, flat.split(c.sizes)):
        buf.copy_(part.view(buf.shape))


def _all_gather_into_tensor(pg, c: Call) -> None:
    run_all_gather(pg.endpoint, c.bufs[0].view(-1), c.srcs[0].view(-1))


def _reduce_scatter(pg, c: Call) -> None:
    flat = torch.cat([x.reshape(-1) for x in c.srcs])
    if c.bounds is None:
        _reduce_scatter_flat(pg, c.bufs[0].view(-1), flat, c.reduction)
    else:
        run_reduce_scatter(pg.endpoint, c.bufs[0].view(-1), flat, c.reduction, c.bounds)


def _reduce_scatter_tensor(pg, c: Call) -> None:
    _reduce_scatter_flat(pg, c.bufs[0].view(-1), c.srcs[0].view(-1), c.reduction)


def _all_to_all_single(pg, c: Call) -> None:
    out_rows, in_rows = c.sizes
    all_to_all(cut(c.bufs[0], out_rows), cut(c.srcs[0], in_rows), pg.endpoint)


def _all_to_all(pg, c: Call) -> None:
    all_to_all(c.bufs, c.srcs, pg.endpoint)


def _gather(pg, c: Call) -> None:
    gather(c.bufs if c.root == pg.rank() else None, c.srcs[0], c.root, pg.endpoint)


def _scatter(pg, c: Call) -> None:
    scatter(c.bufs[0], c.srcs if c.root == pg.rank() else None, c.root, pg.endpoint)


def _barrier(pg, c: Call) -> None:
    # A sealed one-element all-reduce: the host cannot fake a peer's arrival, and, queued
    # behind every earlier op of this group, it completes after them.
    run_all_reduce(pg.endpoint, torch.zeros(1, dtype=torch.int32), Reduction.SUM)


# -- checks per op (the caller's thread; torch's signatures) -----------------------------------
def _check_all_reduce(pg, tensors, opts=None):
    t = one(tensors, "all_reduce")
    return tensors, (), [Call([t], (), reduction(opts, t.dtype, "all_reduce"))]


def _check_all_reduce_coalesced(pg, tensors, opts=None):
    red = Reduction.SUM  # (no tensors: nothing to reduce)
    for t in tensors:
        red = reduction(opts, check(t, "all_reduce_coalesced").dtype, "all_reduce_coalesced")
    return tensors, (), [Call(list(tensors), reduction=red)]


def _root(pg, opts, what: str) -> int:
    """The op's root rank, checked here, before the op is queued: an argument the engine
    refused inside the op would fail the group's op queue for every later op."""
    root = root_of(opts)
    if not 0 <= root < pg.size():
        raise ConfigError(f"{what}: root {root} is not a rank of a group of {pg.size()}")
    return root


def _count(tensors, n: int, what: str) -> list:
    if len(tensors) != n:
        raise ConfigError(f"{what}: need one tensor per rank, {n}, got {len(tensors)}")
    return tensors


def _check_reduce(pg, tensors, opts=None):
    t = one(tensors, "reduce")
    return tensors, (), [Call([t], reduction=reduction(opts, t.dtype, "reduce"), root=_root(pg, opts, "reduce"))]


def _check_broadcast(pg, tensors, opts=None):
    t = one(tensors, "broadcast")
    return tensors, (), [Call([t], root=_root(pg, opts, "broadcast"))]


def _gather_call(pg, outs: list[torch.Tensor], inp: torch.Tensor, what: str) -> Call:
    """All-gather into a list: one output per rank, sizes may differ."""
    n = pg.size()
    if len(outs) != n:
        raise ConfigError(f"{what}: need {n} output tensors, got {len(outs)}")
    for o in outs:
        check(o, what)
    same_dtype(list(outs) + [inp], what)
    sizes = [o.numel() for o in outs]
    if sizes[pg.rank()] != inp.numel():
        raise ConfigError(f"{what}: this rank's output has {sizes[pg.rank()]} elements, its input {inp.numel()}")
    return Call(list(outs), [inp], sizes=sizes, bounds=uneven(sizes))


def _check_all_gather(pg, output_tensors, input_tensors, opts=None):
    inp = one(input_tensors, "all_gather")
    if len(output_tensors) != 1:
        raise ConfigError("all_gather: the ccddp backend takes one output list per call")
    # The work completes with the output list itself, as gloo's and NCCL's do (c10d's
    # futures carry a list of one list as that list).
    return output_tensors[0], input_tensors, [_gather_call(pg, output_tensors[0], inp, "all_gather")]


def _check_all_gather_coalesced(pg, output_lists, input_list, opts=None):
    what = "all_gather_coalesced"
    return output_lists, input_list, [_gather_call(pg, [per_rank[i] for per_rank in output_lists], check(x, what),
                                                   what) for i, x in enumerate(input_list)]


def _gather_flat_call(pg, output: torch.Tensor, input: torch.Tensor, what: str) -> Call:
    check(output, what), check(input, what)
    if output.numel() != pg.size() * input.numel() or output.dtype != input.dtype:
        raise ConfigError(f"{what}: output must hold world_size x input elements of the input's dtype "
                          f"({output.numel()} {output.dtype} vs {pg.size()} x {input.numel()} {input.dtype})")
    return Call([output], [input])


def _check_all_gather_into_tensor(pg, output, input, opts=None):
    return [output], [input], [_gather_flat_call(pg, output, input, "all_gather_into_tensor")]


def _check_all_gather_into_tensor_coalesced(pg, outputs, inputs, opts=None):
    what = "all_gather_into_tensor_coalesced"
    return outputs, inputs, [_gather_flat_call(pg, o, i, what) for o, i in zip(outputs, inputs)]


def _check_reduce_scatter(pg, output_tensors, input_lists, opts=None):
    out = one(output_tensors, "reduce_scatter")
    red = reduction(opts, out.dtype, "reduce_scatter")
    if len(input_lists) != 1 or len(input_lists[0]) != pg.size():
        raise ConfigError(f"reduce_scatter: need one list of {pg.size()} input tensors")
    ins = [check(x, "reduce_scatter") for x in input_lists[0]]
    same_dtype(ins + [out], "reduce_scatter")
    sizes = [x.numel() for x in ins]
    if sizes[pg.rank()] != out.numel():
        raise ConfigError(f"reduce_scatter: this rank's output has {out.numel()} elements, "
                          f"its input chunk {sizes[pg.rank()]}")
    return output_tensors, input_lists, [Call([out], ins, reduction=red, bounds=uneven(sizes))]


def _scatter_flat_call(pg, output: torch.Tensor, input: torch.Tensor, opts, what: str) -> Call:
    check(output, what), check(input, what)
    red = reduction(opts, output.dtype, what)
    if input.numel() != pg.size() * output.numel() or output.dtype != input.dtype:
        raise ConfigError(f"{what}: input must hold world_size x output elements of the output's dtype "
                          f"({input.numel()} {input.dtype} vs {pg.size()} x {output.numel()} {output.dtype})")
    return Call([output], [input], reduction=red)


def _check_reduce_scatter_tensor(pg, output, input, opts=None):
    return [output], [input], [_scatter_flat_call(pg, output, input, opts, "reduce_scatter_tensor")]


def _check_reduce_scatter_tensor_coalesced(pg, outputs, inputs, opts=None):
    what = "reduce_scatter_tensor_coalesced"
    return outputs, inputs, [_scatter_flat_call(pg, o, i, opts, what) for o, i in zip(outputs, inputs)]


def _check_all_to_all_single(pg, output, input, output_split_sizes, input_split_sizes, opts=None):
    check(output, "all_to_all_single"), check(input, "all_to_all_single")
    n = pg.size()
    rows = (split_rows(output, list(output_split_sizes), n, "all_to_all_single output"),
            split_rows(input, list(input_split_sizes), n, "all_to_all_single input"))
    return [output], [input], [Call([output], [input], sizes=rows)]


def _check_all_to_all(pg, output_tensors, input_tensors, opts=None):
    outs = [check(o, "all_to_all") for o in _count(output_tensors, pg.size(), "all_to_all outputs")]
    ins = [check(x, "all_to_all") for x in _count(input_tensors, pg.size(), "all_to_all inputs")]
    return output_tensors, input_tensors, [Call(outs, ins)]


def _check_gather(pg, output_lists, input_tensors, opts=None):
    inp = one(input_tensors, "gather")
    root, outs = _root(pg, opts, "gather"), []
    if pg.rank() == root:
        if len(output_lists) != 1:
            raise ConfigError("gather: the destination rank needs one output list")
        outs = [check(o, "gather") for o in _count(output_lists[0], pg.size(), "gather outputs")]
    # As for all_gather: the root's work completes with its output list itself.
    return output_lists[0] if output_lists else [], input_tensors, [Call(outs, [inp], root=root)]


def _check_scatter(pg, output_tensors, input_lists, opts=None):
    out = one(output_tensors, "scatter")
    root, ins = _root(pg, opts, "scatter"), []
    if pg.rank() == root:
        if len(input_lists) != 1:
            raise ConfigError("scatter: the source rank needs one input list")
        ins = [check(x, "scatter") for x in _count(input_lists[0], pg.size(), "scatter inputs")]
    return output_tensors, input_lists, [Call([out], ins, root=root)]


def _check_barrier(pg, opts=None):
    return [], (), [Call()]


# -- the table ----------------------------------------------------------------------------------
ALL_REDUCE = Op("allreduce", "all_reduce", _check_all_reduce, _all_reduce)
ALL_REDUCE_COALESCED = Op("allreduce_coalesced", "all_reduce_coalesced", _check_all_reduce_coalesced,
                          _all_reduce_alike)
REDUCE = Op("reduce", "reduce", _check_reduce, _reduce, write_back=write_back_at_root)
BROADCAST = Op("broadcast", "broadcast", _check_broadcast, _broadcast)
ALL_GATHER = Op("allgather", "all_gather", _check_all_gather, _all_gather)
ALL_GATHER_COALESCED = Op("allgather_coalesced", "all_gather_coalesced", _check_all_gather_coalesced, _all_gather)
ALL_GATHER_INTO_TENSOR = Op("_allgather_base", "all_gather_into_tensor", _check_all_gather_into_tensor,
                            _all_gather_into_tensor)
ALL_GATHER_INTO_TENSOR_COALESCED = Op("allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced",
                                      _check_all_gather_into_tensor_coalesced, _all_gather_into_tensor)
REDUCE_SCATTER = Op("reduce_scatter", "reduce_scatter", _check_reduce_scatter, _reduce_scatter)
REDUCE_SCATTER_TENSOR = Op("_reduce_scatter_base", "reduce_scatter_tensor", _check_reduce_scatter_tensor,
                           _reduce_scatter_tensor)
REDUCE_SCATTER_TENSOR_COALESCED = Op("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced",
                                     _check_reduce_scatter_tensor_coalesced, _reduce_scatter_tensor)
ALL_TO_ALL_SINGLE = Op("alltoall_base", "all_to_all_single", _check_all_to_all_single, _all_to_all_single,
                       stage=stage_on_host)
ALL_TO_ALL = Op("alltoall", "all_to_all", _check_all_to_all, _all_to_all, stage=stage_on_host)
GATHER = Op("gather", "gather", _check_gather, _gather, stage=stage_on_host)
SCATTER = Op("scatter", "scatter", _check_scatter, _scatter, stage=stage_on_host)
BARRIER = Op("barrier", "barrier", _check_barrier, _barrier)

#: Every op of the table, in the order ``ProcessGroupCCDDP`` lists its methods.
TABLE = (ALL_REDUCE, ALL_REDUCE_COALESCED, REDUCE, BROADCAST, ALL_GATHER, ALL_GATHER_COALESCED,
         ALL_GATHER_INTO_TENSOR, ALL_GATHER_INTO_TENSOR_COALESCED, REDUCE_SCATTER, REDUCE_SCATTER_TENSOR,
         REDUCE_SCATTER_TENSOR_COALESCED, ALL_TO_ALL_SINGLE, ALL_TO_ALL, GATHER, SCATTER, BARRIER)
