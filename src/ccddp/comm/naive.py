"""``secure-naive``: the paper's emulation of CC-on ring collectives, kept as the baseline.

Per step: seal the whole chunk, send it, receive the peer's whole chunk, open it, reduce
it; nothing overlaps and all crypto runs on the calling thread (one chain).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ccddp.comm.frames import FrameSpec, frames_of
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.pipeline import dtype_name
from ccddp.comm.plan import Step
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import FrameContext, Op
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import FrameLabel


def run_naive(g: Endpoint, flat: torch.Tensor, steps: list[Step], op: Op, seq: int, *,
              tag: int, gate: Callable[[], None], reduction: Reduction = Reduction.SUM) -> None:
    """Run ``steps`` on ``flat`` in place, one whole-chunk message per step (cut into
    frames only where a chunk exceeds what one AES-GCM call takes), on gloo tag ``tag``;
    ``gate`` runs before a step's receives are waited on (it acts once)."""
    for st in steps:
        # One call per step: its chunk-sized frames are released before the next step
        # allocates its own (for DDP's first-iteration bucket each is GBs).
        _run_step(g, flat, st, op, seq, tag, gate, reduction)


def _run_step(g: Endpoint, flat: torch.Tensor, st: Step, op: Op, seq: int, tag: int, gate,
              reduction: Reduction) -> None:
    isz, u8, dtype, tr = flat.element_size(), flat.view(torch.uint8), dtype_name(flat), g.transport
    where = f"{op.name.lower()}#{seq}"
    seg_elems = max(1, MAX_FRAME_BYTES // isz)  # one frame per chunk unless AES-GCM's limit cuts it
    sends = frames_of(st.index, st.send_peer, st.send_region, seg_elems, isz)
    recvs = frames_of(st.index, st.recv_peer, st.recv_region, seg_elems, isz)

    def aad(f: FrameSpec, src: int, dst: int) -> bytes:
        return FrameContext(g.session_id, seq, op, st.phase, st.wire_step, f.segment, src, dst, f.nbytes,
                            dtype).pack()

    rx = g.arena_for(flat.device).layout("rx", [f.nbytes + TAG_BYTES for f in recvs])
    posted = [(f, frame, tr.irecv(frame, f.peer, tag)) for f, frame in zip(recvs, rx)]
    sent = []
    for f, frame in zip(sends, g.arena_for(flat.device).layout("tx", [f.nbytes + TAG_BYTES for f in sends])):
        g.channels.tx(f.peer).seal(f.plain(u8), frame, aad(f, g.rank, f.peer))
        sent.append(tr.isend(frame, f.peer, tag))
    if sends:
        g.counters.add_message(sealed=True)
    if posted:
        gate()
    for f, frame, work in posted:
        tr.wait(work, f.peer, FrameLabel(f"{f.peer}->{g.rank}", where, st.index, f.segment))
        if st.action == "copy":
            g.channels.rx(f.peer).open(frame, f.plain(u8), aad(f, f.peer, g.rank), collective=where,
                              step=st.index, segment=f.segment)
        else:
            # Not in place: pyca's AES-GCM (cryptography >= 51) refuses overlapping buffers.
            plain = g.arena_for(flat.device).take("opened", f.nbytes)
            g.channels.rx(f.peer).open(frame, plain, aad(f, f.peer, g.rank), collective=where,
                              step=st.index, segment=f.segment)
            reduction.combine(flat[f.start:f.end], plain.view(flat.dtype))
    if posted:
        g.counters.add_message(sealed=False)
    for work in sent:
        tr.wait(work, st.send_peer, FrameLabel(f"{g.rank}->{st.send_peer}", where, st.index))
