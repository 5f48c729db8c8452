"""``secure-naive``: the paper's emulation of CC-on ring collectives, kept as the baseline.

Per step: seal the whole chunk, send it, receive the peer's whole chunk, open it, reduce
it; nothing overlaps and all crypto runs on the calling thread (one chain).
"""

from __future__ import annotations

import torch

from ccddp.comm.group import SecureGroup
from ccddp.comm.pipeline import dtype_name
from ccddp.comm.plan import Step
from ccddp.crypto.aad import FrameContext, Op
from ccddp.crypto.channel import TAG_BYTES


def run_naive(g: SecureGroup, flat: torch.Tensor, steps: list[Step], op: Op, seq: int) -> None:
    """Run ``steps`` on ``flat`` in place, one whole-chunk message per step."""
    isz, u8, dtype, tr = flat.element_size(), flat.view(torch.uint8), dtype_name(flat), g.transport
    where = f"{op.name.lower()}#{seq}"
    for st in steps:
        recv_work = send_work = None
        if st.recv_peer is not None:
            a, b = st.recv_region
            n = (b - a) * isz
            rx_frame = g.buffer("rx", n + TAG_BYTES)
            recv_work = tr.irecv(rx_frame, st.recv_peer)
        if st.send_peer is not None:
            a, b = st.send_region
            n = (b - a) * isz
            frame = g.buffer("tx", n + TAG_BYTES)
            aad = FrameContext(g.session_id, seq, op, st.phase, st.wire_step, 0, g.rank, st.send_peer,
                               n, dtype).pack()
            g.tx(st.send_peer).seal(u8[a * isz:b * isz].numpy(), frame.numpy(), aad)
            g.counters.add_message(sealed=True)
            send_work = tr.isend(frame, st.send_peer)
        if recv_work is not None:
            tr.wait(recv_work, st.recv_peer, f"receive in {where} step {st.index}")
            a, b = st.recv_region
            n = (b - a) * isz
            aad = FrameContext(g.session_id, seq, op, st.phase, st.wire_step, 0, st.recv_peer, g.rank,
                               n, dtype).pack()
            if st.action == "copy":
                g.rx(st.recv_peer).open(rx_frame.numpy(), u8[a * isz:b * isz].numpy(), aad,
                                        collective=where, step=st.index)
            else:
                plain = rx_frame[:n]  # opened in place, as in the pipelined engine
                g.rx(st.recv_peer).open(rx_frame.numpy(), plain.numpy(), aad, collective=where, step=st.index)
                flat[a:b].add_(plain.view(flat.dtype))
            g.counters.add_message(sealed=False)
        if send_work is not None:
            tr.wait(send_work, st.send_peer, f"send in {where} step {st.index}")
