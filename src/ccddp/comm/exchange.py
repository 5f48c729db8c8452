"""Sealed pairwise exchanges: ``all_to_all``, ``gather`` and ``scatter``.

These collectives move each rank's data to one other rank and reduce nothing, so there
is no ring to pipeline: every receive is posted, every outgoing message is sealed for
its directed link and sent, then every incoming one is opened into its place. A
sealed descriptor goes both ways on every link the collective uses (as in the ring
collectives), so ranks that call different collectives fail with a ConfigError that
says so instead of a failed tag.

Example::

    outs = [torch.empty(4) for _ in range(group.world_size)]
    all_to_all(outs, [torch.full((4,), float(group.rank))] * group.world_size, group)
"""

from __future__ import annotations

import torch

from ccddp.comm.descriptors import pair_sizes, post_descriptors
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.pipeline import dtype_name
from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import ConfigError, FrameLabel


def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ConfigError(f"{what}: ccddp's secure collectives take CPU tensors (got {t.device}); "
                          "copy to host memory first")
    if not t.is_contiguous():
        raise ConfigError(f"{what}: tensor must be contiguous")
    return t.view(-1)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _pairwise(g: Endpoint, op: Op, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor],
              dtype: str, numel: int, root: int) -> None:
    """Send ``sends[p]`` to ``p`` and receive ``recvs[p]`` from ``p`` (flat CPU tensors of
    one dtype), each message sealed for its link."""
    where = op.name.lower()
    for t in list(sends.values()) + list(recvs.values()):
        if t.numel() * t.element_size() > MAX_FRAME_BYTES:
            raise ConfigError(f"{where}: one message is larger than {MAX_FRAME_BYTES >> 30} GiB; split the tensor")
    seq = g.next_seq()
    where = f"{where}#{seq}"
    peers = sorted(set(sends) | set(recvs))
    # all_to_all's sizes may differ per pair: each pair's descriptor (and so the tag of its
    # data) holds both directions' counts, so a pair whose ranks disagree never puts a frame
    # of another size before gloo (which aborts the process on a longer message) and both
    # ranks raise a ConfigError naming the sizes.
    pair = {p: pair_sizes(g.rank, p, sends[p].numel(), recvs[p].numel()) for p in peers} if op is Op.ALL_TO_ALL else None
    desc = post_descriptors(g, seq, op, numel, dtype, root, peers, peers, per_peer_numel=pair)
    tr = g.transport

    def aad(src: int, dst: int, nbytes: int) -> bytes:
        return FrameContext(g.session_id, seq, op, Phase.NONE, 0, 0, src, dst, nbytes, dtype).pack()

    incoming = []
    for p in sorted(recvs):
        out = _bytes(recvs[p])
        frame = torch.empty(out.numel() + TAG_BYTES, dtype=torch.uint8)
        incoming.append((p, out, frame, tr.irecv(frame, p, desc.tag_with(p))))
    outgoing = []
    for p in sorted(sends):
        plain = _bytes(sends[p])
        frame = torch.empty(plain.numel() + TAG_BYTES, dtype=torch.uint8)
        g.channels.tx(p).seal(plain.numpy(), frame.numpy(), aad(g.rank, p, plain.numel()))
        g.counters.add_message(sealed=True)
        outgoing.append((tr.isend(frame, p, desc.tag_with(p)), p))
    if incoming:
        desc.verify()
    for p, out, frame, work in incoming:
        tr.wait(work, p, FrameLabel(f"{p}->{g.rank}", where, 0, 0))
        g.channels.rx(p).open(frame.numpy(), out.numpy(), aad(p, g.rank, out.numel()), collective=where, step=0)
        g.counters.add_message(sealed=False)
    for work, p in outgoing:
        tr.wait(work, p, FrameLabel(f"{g.rank}->{p}", where))
    desc.verify()


def _dtype_of(tensors: list[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ConfigError(f"{what}: tensors must share one dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def all_to_all(outputs: list[torch.Tensor], inputs: list[torch.Tensor], group: Endpoint) -> list[torch.Tensor]:
    """``outputs[p]`` on rank r = ``inputs[r]`` on rank p; sizes may differ per pair."""
    n, r = group.world_size, group.rank
    if len(outputs) != n or len(inputs) != n:
        raise ConfigError(f"all_to_all: need {n} input and {n} output tensors, got {len(inputs)} and {len(outputs)}")
    outs = [_flat(t, "all_to_all output") for t in outputs]
    ins = [_flat(t, "all_to_all input") for t in inputs]
    dtype = _dtype_of(outs + ins, "all_to_all")
    if outs[r].numel() != ins[r].numel():
        raise ConfigError(f"all_to_all: rank {r} sends itself {ins[r].numel()} elements "
                          f"but expects {outs[r].numel()}")
    outs[r].copy_(ins[r])
    _pairwise(group, Op.ALL_TO_ALL, {p: ins[p] for p in range(n) if p != r},
              {p: outs[p] for p in range(n) if p != r}, str(dtype).removeprefix("torch."), 0, 0)
    return outputs


def gather(outputs: list[torch.Tensor] | None, input: torch.Tensor, dst: int, group: Endpoint) -> None:
    """On rank ``dst``, ``outputs[p]`` = ``input`` of rank p; other ranks pass ``outputs=None``."""
    n, r = group.world_size, group.rank
    if not 0 <= dst < n:
        raise ConfigError(f"gather: dst {dst} is not a rank of a group of {n}")
    inp = _flat(input, "gather input")
    if r == dst:
        if outputs is None or len(outputs) != n:
            raise ConfigError(f"gather: the destination rank needs {n} output tensors")
        outs = [_flat(t, "gather output") for t in outputs]
        if any(o.numel() != inp.numel() for o in outs):
            raise ConfigError("gather: every output tensor must have the input's number of elements")
        _dtype_of(outs + [inp], "gather")
        outs[r].copy_(inp)
        _pairwise(group, Op.GATHER, {}, {p: outs[p] for p in range(n) if p != r}, dtype_name(inp), inp.numel(), dst)
    else:
        _pairwise(group, Op.GATHER, {dst: inp}, {}, dtype_name(inp), inp.numel(), dst)


def scatter(output: torch.Tensor, inputs: list[torch.Tensor] | None, src: int, group: Endpoint) -> None:
    """``output`` on rank p = ``inputs[p]`` of rank ``src``; other ranks pass ``inputs=None``."""
    n, r = group.world_size, group.rank
    if not 0 <= src < n:
        raise ConfigError(f"scatter: src {src} is not a rank of a group of {n}")
    out = _flat(output, "scatter output")
    if r == src:
        if inputs is None or len(inputs) != n:
            raise ConfigError(f"scatter: the source rank needs {n} input tensors")
        ins = [_flat(t, "scatter input") for t in inputs]
        if any(i.numel() != out.numel() for i in ins):
            raise ConfigError("scatter: every input tensor must have the output's number of elements")
        _dtype_of(ins + [out], "scatter")
        out.copy_(ins[r])
        _pairwise(group, Op.SCATTER, {p: ins[p] for p in range(n) if p != r}, {}, dtype_name(out), out.numel(), src)
    else:
        _pairwise(group, Op.SCATTER, {}, {src: out}, dtype_name(out), out.numel(), src)
