"""What a measurement compares the product with, and the engine called without the backend.

The product path -- ``dist.all_reduce`` on a ccddp group -- checks every op once in the
backend and runs the engine's ``run_*`` functions (:mod:`ccddp.comm`). Measuring and
testing tools need two things more, kept here, outside the product:

- :class:`GlooReference`: gloo's own collectives on a process group, in plaintext, the
  CC-off reference every result is compared with (``impl`` ``"gloo"``). It seals nothing;
  it reads like a :class:`~ccddp.comm.SecureGroup` wherever a benchmark reads one
  (``rank``, ``world_size``, ``settings``, ``counters``, ``close``).
- the checked collectives :func:`all_reduce`, :func:`reduce_scatter`, :func:`all_gather`
  and :func:`broadcast`: any caller's tensors checked (CPU, contiguous, sizes, dtypes,
  reduction), then run on a ``SecureGroup`` -- the engine's schedule its settings name:
  ``ring`` (unsealed), ``secure-naive`` or ``secure`` -- or on a ``GlooReference``.

Example::

    ref = GlooReference()                                        # gloo's own, plaintext
    eng = open_impl("secure", CommSettings(timeout_s=60))        # the engine, sealed
    for g in (ref, eng):
        all_reduce(torch.ones(1 << 20), g)                       # the same call on each
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ccddp.comm import CommSettings, SecureGroup, Transport
from ccddp.comm.collectives import run_all_gather, run_all_reduce, run_broadcast, run_reduce_scatter
from ccddp.comm.control import parse_messages
from ccddp.comm.plan import sized_bounds
from ccddp.comm.reduce import Reduction
from ccddp.comm.settings import IMPLS as ENGINE_IMPLS
from ccddp.comm.transport import all_gather_flat, exchange_bytes
from ccddp.crypto.counters import CryptoCounters
from ccddp.errors import ConfigError

#: gloo's own collectives: the CC-off reference.
REFERENCE_IMPL = "gloo"
#: Every implementation a measurement can time: the reference, then the engine's schedules.
IMPLS = (REFERENCE_IMPL, *ENGINE_IMPLS)


@dataclass(frozen=True)
class ReferenceSettings:
    """What a :class:`GlooReference` records of itself in results, where an engine group
    records its :class:`~ccddp.comm.CommSettings`: the implementation and its timeout.

    Example::

        ReferenceSettings(60.0).as_dict()    # {"impl": "gloo", "timeout_s": 60.0}
    """

    timeout_s: float = 60.0

    @property
    def impl(self) -> str:
        return REFERENCE_IMPL

    @property
    def secure(self) -> bool:
        return False  # gloo's own collectives seal nothing

    def as_dict(self) -> dict:
        return {"impl": self.impl, "timeout_s": self.timeout_s}


class GlooReference:
    """gloo's own (plaintext) collectives on ``pg`` (the default group if None).

    Its crypto counters exist so that a benchmark reads every implementation alike; they
    stay zero.

    Example::

        ref = GlooReference(timeout_s=60)
        all_gather(out, inp, ref)            # dist.all_gather_into_tensor, plaintext
    """

    def __init__(self, pg: dist.ProcessGroup | None = None, timeout_s: float = 60.0) -> None:
        if pg is None and not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first")
        self.pg = pg if pg is not None else dist.group.WORLD
        self.rank = self.pg.rank()
        self.world_size = self.pg.size()
        self.settings = ReferenceSettings(timeout_s)
        self.counters = CryptoCounters()

    def gather_json(self, obj) -> list:
        """Every rank's JSON-serializable ``obj``, in rank order, in plaintext (a CC-off
        run's collectives are plaintext anyway); parsed as JSON, never unpickled."""
        blob = json.dumps(obj, sort_keys=True).encode()
        return parse_messages(exchange_bytes(blob, self.pg, self.settings.timeout_s))

    def close(self) -> None:
        """Nothing to release: ``pg`` belongs to its creator."""


def open_impl(impl: str, settings: CommSettings) -> SecureGroup | GlooReference:
    """A group that runs ``impl`` over every rank: the gloo reference, or an engine group
    with ``settings`` (its ``impl`` replaced) on links of its own. Collective.

    Example::

        groups = {impl: open_impl(impl, CommSettings(timeout_s=60)) for impl in IMPLS}
    """
    if impl == REFERENCE_IMPL:
        return GlooReference(None, settings.timeout_s)
    if impl not in ENGINE_IMPLS:
        raise ConfigError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    return SecureGroup(settings.with_(impl=impl), transport=Transport.open(None, settings.timeout_s))


# -- the checked collectives ----------------------------------------------------------------

def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ConfigError(f"{what}: ccddp's collectives take CPU tensors (got {t.device}); copy to host memory first")
    if not t.is_contiguous():
        raise ConfigError(f"{what}: tensor must be contiguous")
    return t.view(-1)


def _torch_op(reduction: Reduction) -> dist.ReduceOp:
    # AVG: gloo has none; the sum is divided afterwards (Reduction.finish), as the engine does.
    return dist.ReduceOp.SUM if reduction == Reduction.AVG else getattr(dist.ReduceOp, reduction.name)


def _uneven_bounds(what: str, sizes: list[int] | None, n: int, rank: int, mine: int,
                   total: int) -> list[tuple[int, int]] | None:
    """Chunk bounds from per-rank ``sizes``, checked against this rank's tensors."""
    if sizes is None:
        return None
    if len(sizes) != n or sizes[rank] != mine or sum(sizes) != total or min(sizes) < 0:
        raise ConfigError(f"{what}: sizes {sizes} do not fit a group of {n} with {mine} elements on rank "
                          f"{rank} and {total} in all")
    return sized_bounds(sizes)


def all_reduce(tensor: torch.Tensor, group: SecureGroup | GlooReference,
               op: Reduction | str = Reduction.SUM) -> torch.Tensor:
    """Reduce ``tensor`` over the group (SUM unless ``op`` says otherwise), in place; returns it."""
    flat = _flat(tensor, "all_reduce")
    reduction = Reduction.from_name(op)
    reduction.check(flat.dtype, "all_reduce")
    if isinstance(group, GlooReference):
        dist.all_reduce(tensor, op=_torch_op(reduction), group=group.pg)
        reduction.finish(tensor, group.world_size)
    else:
        run_all_reduce(group, flat, reduction)
    return tensor


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: SecureGroup | GlooReference,
                   op: Reduction | str = Reduction.SUM, *, sizes: list[int] | None = None) -> torch.Tensor:
    """``output`` (on rank r) = the reduction over ranks of chunk r of ``input``; ``input``
    is unchanged.

    ``input`` holds ``world_size * output.numel()`` elements, or, with ``sizes`` (every
    rank's output length, the same list on every rank; engine groups only), ``sum(sizes)``.
    """
    n = group.world_size
    out, inp = _flat(output, "reduce_scatter output"), _flat(input, "reduce_scatter input")
    reduction = Reduction.from_name(op)
    reduction.check(out.dtype, "reduce_scatter")
    bounds = _uneven_bounds("reduce_scatter", sizes, n, group.rank, out.numel(), inp.numel())
    if (bounds is None and inp.numel() != n * out.numel()) or inp.dtype != out.dtype:
        raise ConfigError(f"reduce_scatter: input must hold world_size x output elements of the same dtype "
                          f"({inp.numel()} {inp.dtype} vs {n} x {out.numel()} {out.dtype})")
    if isinstance(group, GlooReference):
        if bounds is not None:
            raise ConfigError("reduce_scatter: the gloo reference takes equal chunks only (no sizes)")
        dist.reduce_scatter_tensor(output, input, op=_torch_op(reduction), group=group.pg)
        reduction.finish(output, n)
    else:
        run_reduce_scatter(group, out, inp, reduction, bounds)
    return output


def all_gather(output: torch.Tensor, input: torch.Tensor, group: SecureGroup | GlooReference, *,
               sizes: list[int] | None = None) -> torch.Tensor:
    """``output`` = the ``input`` of every rank, concatenated in rank order; ``sizes``
    (every rank's input length, the same list on every rank; engine groups only) allows
    unequal inputs."""
    n = group.world_size
    out, inp = _flat(output, "all_gather output"), _flat(input, "all_gather input")
    bounds = _uneven_bounds("all_gather", sizes, n, group.rank, inp.numel(), out.numel())
    if (bounds is None and out.numel() != n * inp.numel()) or inp.dtype != out.dtype:
        raise ConfigError(f"all_gather: output must hold world_size x input elements of the same dtype "
                          f"({out.numel()} {out.dtype} vs {n} x {inp.numel()} {inp.dtype})")
    if isinstance(group, GlooReference):
        if bounds is not None:
            raise ConfigError("all_gather: the gloo reference takes equal inputs only (no sizes)")
        all_gather_flat(output, input, group=group.pg)
    else:
        run_all_gather(group, out, inp, bounds)
    return output


def broadcast(tensor: torch.Tensor, src: int, group: SecureGroup | GlooReference) -> torch.Tensor:
    """Copy ``tensor`` of group rank ``src`` to every rank, in place; returns it."""
    flat = _flat(tensor, "broadcast")
    if not 0 <= src < group.world_size:
        raise ConfigError(f"broadcast: src {src} is not a rank of a group of {group.world_size}")
    if isinstance(group, GlooReference):
        dist.broadcast(tensor, src=dist.get_global_rank(group.pg, src), group=group.pg)
    else:
        run_broadcast(group, flat, src)
    return tensor
