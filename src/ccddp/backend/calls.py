"""The arguments of one c10d op of a ccddp group: the checks the ops of the table
(:mod:`ccddp.backend.ops`) share, the :class:`Call` each op's check makes (the tensors
of one engine call and its parameters), and how a call is staged and written back.

Staging (:func:`stage`) decides where a call works: a CPU tensor in its own memory (a
contiguous copy if it is not contiguous, copied back afterwards); a CUDA tensor in device
memory (the ``device`` placement, sealed by the Triton engine) or through a pinned host
copy (``staged``: ``ccddp.backend.placement``), the copies queued on the caller's stream;
:func:`stage_on_host` always through host memory, for the ops whose engine code is
host-only.

Example::

    call = Call([t], reduction=reduction(None, t.dtype, "all_reduce"))
    stage(pg, call)            # call.bufs[0]: where the engine reduces; call.backs: into t
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ccddp.backend.placement import Placement, stage_in, stage_out, stages_small
from ccddp.comm.plan import sized_bounds
from ccddp.comm.reduce import Reduction
from ccddp.errors import ConfigError

# -- checks ---------------------------------------------------------------------------------
# torch's reduction types to ccddp's (PREMUL_SUM, NCCL's pre-multiplied sum, has none).
_REDUCTIONS = {getattr(dist.ReduceOp.RedOpType, red.name).value: red for red in Reduction}
# (dtype, torch reduction) pairs already checked: a synchronous call pays for every check
# on top of its sealed op, so each pair is checked once.
_CHECKED: dict[tuple[torch.dtype, int], Reduction] = {}


def reduction(opts, dtype: torch.dtype, what: str) -> Reduction:
    """ccddp's reduction for torch's ``opts.reduceOp``, checked against ``dtype``."""
    op = opts.reduceOp.op.value if opts is not None else dist.ReduceOp.RedOpType.SUM.value
    red = _CHECKED.get((dtype, op))
    if red is not None:
        return red
    red = _REDUCTIONS.get(op)
    if red is None:
        raise ConfigError(f"{what}: {opts.reduceOp.op.name} (NCCL's pre-multiplied sum) is not supported by "
                          "the ccddp backend")
    red.check(dtype, what)
    _CHECKED[(dtype, op)] = red
    return red


def check(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.layout != torch.strided:
        raise ConfigError(f"{what}: {t.layout} tensors are not supported by the ccddp backend (dense tensors only)")
    if t.device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{what}: the ccddp backend seals CPU and CUDA tensors, got one on {t.device}")
    return t


def one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ConfigError(f"{what}: the ccddp backend takes one tensor per call, got {len(tensors)}")
    return check(tensors[0], what)


def same_dtype(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ConfigError(f"{what}: all tensors must share one dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def split_rows(t: torch.Tensor, sizes: list[int], n: int, what: str) -> list[int]:
    """The rows of ``t`` (dim 0) each rank gets: ``sizes``, or equal parts if empty."""
    rows = t.shape[0] if t.dim() else 1
    if not sizes:
        # gloo's rule: an empty tensor splits whatever its rows (every part is empty).
        if rows % n and t.numel():
            raise ConfigError(f"{what}: {rows} rows do not split evenly over {n} ranks; pass split sizes")
        sizes = [rows // n] * n
        sizes[-1] += rows % n          # an empty tensor's remainder rows (empty too)
    if len(sizes) != n or sum(sizes) != rows:
        raise ConfigError(f"{what}: split sizes {list(sizes)} do not cover {rows} rows over {n} ranks")
    return sizes


def cut(t: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
    """``t`` cut along dim 0 into parts of ``counts`` rows."""
    flat = t if t.dim() else t.view(1)
    out, start = [], 0
    for s in counts:
        out.append(flat.narrow(0, start, s))
        start += s
    return out


def root_of(opts) -> int:
    return opts.rootRank if opts is not None else 0


def uneven(sizes: list[int]) -> list[tuple[int, int]] | None:
    return sized_bounds(sizes) if len(set(sizes)) > 1 else None


# -- calls and staging ------------------------------------------------------------------------
class Call:
    """One engine call of an op: the caller's tensors it writes (``outs``) and only reads
    (``ins``), its parameters, and, once staged, the buffers it works in (``bufs``, each
    written back into its ``outs`` tensor by ``backs``) and reads (``srcs``)."""

    __slots__ = ("outs", "ins", "reduction", "root", "sizes", "bounds", "bufs", "backs", "srcs")

    def __init__(self, outs=(), ins=(), reduction: Reduction | None = None, root: int = 0, sizes=None,
                 bounds: list[tuple[int, int]] | None = None) -> None:
        self.outs, self.ins, self.reduction, self.root = outs, ins, reduction, root
        self.sizes, self.bounds = sizes, bounds  # (bufs, backs, srcs: set by stage)

    def __repr__(self) -> str:
        return f"Call({len(self.outs)} out, {len(self.ins)} in, {self.reduction}, root {self.root})"


def _nothing() -> None:
    pass


def _through_host(pg, t: torch.Tensor, on_device: bool) -> bool:
    """Whether ``t``'s op runs on a host copy: a CUDA tensor whose op is staged, by the
    placement or because the op runs on host memory only (``on_device`` False)."""
    return t.is_cuda and (not on_device or pg.placement(t.device) is Placement.STAGED)


def _small(pg, call: Call) -> bool:
    """Whether the call's CUDA tensors are staged because the call is small (placement
    ``auto``, :func:`~ccddp.backend.placement.stages_small`), judged by its largest tensor:
    the same on every rank (c10d's ops take tensors of matching shapes), so every rank's
    frames of the call take the same wire."""
    tensors = [*call.outs, *call.ins]
    if not tensors or not tensors[0].is_cuda:
        return False
    return stages_small(pg.settings.placement, max(t.numel() * t.element_size() for t in tensors))


def working(pg, t: torch.Tensor, on_device: bool = True) -> tuple[torch.Tensor, Callable[[], None]]:
    """The contiguous buffer an op works in for ``t`` and what writes it back into ``t``
    afterwards: ``t``'s own memory where possible, else a contiguous copy on its device,
    or a host copy when the op is staged."""
    if _through_host(pg, t, on_device):
        return stage_out(t)
    if t.is_contiguous():
        return t, _nothing
    buf = t.contiguous()
    return buf, lambda: t.copy_(buf)


def source(pg, t: torch.Tensor, on_device: bool = True) -> torch.Tensor:
    """A contiguous read-only input where the op runs (see :func:`working`)."""
    return stage_in(t) if _through_host(pg, t, on_device) else t.contiguous()


def stage(pg, call: Call, on_device: bool = True) -> None:
    """The call's buffers: CUDA tensors stay on the device unless their placement is
    staged or the call is small (:func:`_small`)."""
    on_device = on_device and not _small(pg, call)
    bufs, backs = [], []
    for t in call.outs:
        buf, back = working(pg, t, on_device)
        bufs.append(buf)
        backs.append(back)
    call.bufs, call.backs = bufs, backs
    call.srcs = [source(pg, t, on_device) for t in call.ins] if call.ins else []


def stage_on_host(pg, call: Call) -> None:
    """The call's buffers in host memory (the engine code of the op is host-only)."""
    stage(pg, call, on_device=False)


def write_back(pg, call: Call) -> None:
    for back in call.backs:
        back()


def write_back_at_root(pg, call: Call) -> None:
    if call.root == pg.rank():
        write_back(pg, call)


def flatten(tensors) -> list[torch.Tensor]:
    """The tensors of nested lists, in order."""
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            out.append(t)
        else:
            out.extend(flatten(t))
    return out


def device_of(tensors) -> torch.device | None:
    """The CUDA device an op's tensors are on (None: host memory only)."""
    devices = {t.device for t in tensors if t.is_cuda}  # (is_cuda: a fraction of .device's cost)
    if len(devices) > 1:
        raise ConfigError(f"the ccddp backend takes the tensors of one op on one device, got {sorted(map(str, devices))}")
    return devices.pop() if devices else None
