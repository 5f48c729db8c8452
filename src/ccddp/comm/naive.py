"""``secure-naive``: the paper's emulation of CC-on ring collectives, kept as the baseline.

Per step: seal the whole chunk, send it, receive the peer's whole chunk, open it, reduce
it; nothing overlaps and all crypto runs on the calling thread (one chain).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ccddp.comm.group import SecureGroup
from ccddp.comm.pipeline import dtype_name
from ccddp.comm.plan import Step, segment_bounds
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import FrameContext, Op
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import FrameLabel


def run_naive(g: SecureGroup, flat: torch.Tensor, steps: list[Step], op: Op, seq: int, *,
              tag: int, gate: Callable[[], None], reduction: Reduction = Reduction.SUM) -> None:
    """Run ``steps`` on ``flat`` in place, one whole-chunk message per step (cut into
    frames only where a chunk exceeds what one AES-GCM call takes), on gloo tag ``tag``;
    ``gate`` runs before a step's receives are waited on (it acts once)."""
    for st in steps:
        # One call per step: its chunk-sized frames are released before the next step
        # allocates its own (for DDP's first-iteration bucket each is GBs).
        _run_step(g, flat, st, op, seq, tag, gate, reduction)


def _frames(g: SecureGroup, region: tuple[int, int], isz: int, name: str) -> list:
    """``(j, a, b, nbytes, frame)`` per AEAD frame of ``region``, in one arena."""
    segs = segment_bounds(*region, max(1, MAX_FRAME_BYTES // isz))
    arena = g.buffer(name, sum((b - a) * isz + TAG_BYTES for a, b in segs))
    out, off = [], 0
    for j, (a, b) in enumerate(segs):
        n = (b - a) * isz
        out.append((j, a, b, n, arena[off:off + n + TAG_BYTES]))
        off += n + TAG_BYTES
    return out


def _run_step(g: SecureGroup, flat: torch.Tensor, st: Step, op: Op, seq: int, tag: int, gate,
              reduction: Reduction) -> None:
    isz, u8, dtype, tr = flat.element_size(), flat.view(torch.uint8), dtype_name(flat), g.transport
    where = f"{op.name.lower()}#{seq}"
    recvs, sends = [], []
    if st.recv_peer is not None:
        recvs = [(f, tr.irecv(f[4], st.recv_peer, tag)) for f in _frames(g, st.recv_region, isz, "rx")]
    if st.send_peer is not None:
        for j, a, b, n, frame in _frames(g, st.send_region, isz, "tx"):
            aad = FrameContext(g.session_id, seq, op, st.phase, st.wire_step, j, g.rank, st.send_peer,
                               n, dtype).pack()
            g.tx(st.send_peer).seal(u8[a * isz:b * isz].numpy(), frame.numpy(), aad)
            sends.append(tr.isend(frame, st.send_peer, tag))
        g.counters.add_message(sealed=True)
    if recvs:
        gate()
    for (j, a, b, n, rx_frame), work in recvs:
        tr.wait(work, st.recv_peer, FrameLabel(f"{st.recv_peer}->{g.rank}", where, st.index, j))
        aad = FrameContext(g.session_id, seq, op, st.phase, st.wire_step, j, st.recv_peer, g.rank,
                           n, dtype).pack()
        if st.action == "copy":
            g.rx(st.recv_peer).open(rx_frame.numpy(), u8[a * isz:b * isz].numpy(), aad,
                                    collective=where, step=st.index, segment=j)
        else:
            plain = rx_frame[:n]  # opened in place, as in the pipelined engine
            g.rx(st.recv_peer).open(rx_frame.numpy(), plain.numpy(), aad, collective=where, step=st.index,
                                    segment=j)
            reduction.combine(flat[a:b], plain.view(flat.dtype))
    if recvs:
        g.counters.add_message(sealed=False)
    for work in sends:
        tr.wait(work, st.send_peer, FrameLabel(f"{g.rank}->{st.send_peer}", where, st.index))
