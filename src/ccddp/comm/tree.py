"""Tree all-reduce: reduce up a binary tree rooted at rank 0, broadcast back down.

Kept to measure the paper's ring-vs-tree argument (§IV-C-2): a middle rank opens frames
from two children and its parent and seals for its parent and two children, each frame
the whole buffer, while a ring rank handles ``1/n`` of it per step. Segments are sent
asynchronously as soon as they are ready; crypto runs on the calling thread.

Memory is bounded as in the pipelined ring: segment ``j`` goes down the tree once it has
come up, so segments run in rounds whose receive frames fit ``ROUND_BYTES``; both ends of
every link walk rounds and segments in the same order, so frames and nonces line up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ccddp.comm import pipeline
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.pipeline import dtype_name
from ccddp.comm.plan import segment_bounds
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import FrameLabel


def tree_links(rank: int, n: int) -> tuple[int | None, list[int]]:
    """``(parent, children)`` of ``rank`` in the binary tree rooted at 0."""
    parent = None if rank == 0 else (rank - 1) // 2
    return parent, [c for c in (2 * rank + 1, 2 * rank + 2) if c < n]


def _links_in(rank: int, n: int) -> int:
    """Links ``rank`` receives on: one from each child and, going down, one from its parent."""
    parent, children = tree_links(rank, n)
    return len(children) + (parent is not None)


def run_tree_allreduce(g: Endpoint, flat: torch.Tensor, seq: int, *, secure: bool,
                       seg_bytes: int | None, tag: int, gate: Callable[[], None],
                       reduction: Reduction = Reduction.SUM) -> None:
    """Reduce ``flat`` over the group in place (``reduction``, SUM by default), its messages
    on gloo tag ``tag``; ``gate`` runs before every receive is waited on (it acts once)."""
    parent, children = tree_links(g.rank, g.world_size)
    isz = flat.element_size()
    segs = segment_bounds(0, flat.numel(), max(1, min(seg_bytes or MAX_FRAME_BYTES, MAX_FRAME_BYTES) // isz))
    tag_bytes = TAG_BYTES if secure else 0
    # Every rank takes the same segment indices per round (sized for the rank with the
    # most receiving links), so both ends of a link agree on where rounds end.
    most_links = max(_links_in(r, g.world_size) for r in range(g.world_size))
    per_index = max(1, most_links * (max(b - a for a, b in segs) * isz + tag_bytes))
    per_round = max(1, pipeline.ROUND_BYTES // per_index)
    for first in range(0, len(segs), per_round):
        _tree_round(g, flat, seq, secure, segs, range(first, min(first + per_round, len(segs))), parent, children,
                    tag, gate, reduction)
    if secure:
        # Messages: one per link direction, however many segments or rounds it was cut into.
        for _ in range(_links_in(g.rank, g.world_size)):
            g.counters.add_message(sealed=True)
            g.counters.add_message(sealed=False)


def _tree_round(g: Endpoint, flat: torch.Tensor, seq: int, secure: bool, all_segs: list, js: range,
                parent: int | None, children: list[int], tag: int, gate: Callable[[], None],
                reduction: Reduction) -> None:
    """Segments ``js`` up the tree and back down; returns when all their frames are done."""
    isz, u8, dtype, tr = flat.element_size(), flat.view(torch.uint8), dtype_name(flat), g.transport
    op, where = Op.TREE_ALL_REDUCE, f"tree_all_reduce#{seq}"
    segs = {j: all_segs[j] for j in js}
    tag_bytes = TAG_BYTES if secure else 0
    per_frame = {j: (b - a) * isz for j, (a, b) in segs.items()}

    def ctx(phase: Phase, j: int, src: int, dst: int) -> bytes:
        return FrameContext(g.session_id, seq, op, phase, 0, j, src, dst, per_frame[j], dtype).pack()

    def frames(name: str, count: int) -> list[dict[int, torch.Tensor]]:
        sizes = [per_frame[j] + tag_bytes for _ in range(count) for j in js]
        views = iter(g.arena_for(flat.device).layout(name, sizes))
        return [{j: next(views) for j in js} for _ in range(count)]

    up_rx = frames("tree-up-rx", len(children))
    up_work = [{j: tr.irecv(f, c, tag) for j, f in up_rx[i].items()} for i, c in enumerate(children)]
    down_rx = frames("tree-down-rx", 1 if parent is not None else 0)
    down_work = {j: tr.irecv(f, parent, tag) for j, f in down_rx[0].items()} if parent is not None else {}
    tx = frames("tree-tx", 1 + len(children)) if secure else None
    sends = []
    plain = g.arena_for(flat.device).take("plain", max(per_frame.values())) if secure else None

    def seal_and_send(j: int, dst: int, slot: int, phase: Phase) -> None:
        a, b = segs[j]
        region = u8[a * isz:b * isz]
        if secure:
            frame = tx[slot][j]
            g.channels.tx(dst).seal(region, frame, ctx(phase, j, g.rank, dst))
        else:
            frame = region
        sends.append((tr.isend(frame, dst, tag), dst))

    def wait_rx(work, peer: int, step: int, j: int) -> None:
        gate()
        tr.wait(work, peer, FrameLabel(f"{peer}->{g.rank}", where, step, j))

    for j in js:
        a, b = segs[j]
        for i, c in enumerate(children):
            wait_rx(up_work[i][j], c, 0, j)
            frame = up_rx[i][j]
            if secure:
                out = plain[:per_frame[j]]
                g.channels.rx(c).open(frame, out, ctx(Phase.TREE_UP, j, c, g.rank), collective=where, step=0,
                             segment=j)
                frame = out
            reduction.combine(flat[a:b], frame.view(flat.dtype))
        if parent is not None:
            seal_and_send(j, parent, 0, Phase.TREE_UP)
    for j in js:
        a, b = segs[j]
        if parent is not None:
            wait_rx(down_work[j], parent, 1, j)
            region = u8[a * isz:b * isz]
            if secure:
                g.channels.rx(parent).open(down_rx[0][j], region, ctx(Phase.TREE_DOWN, j, parent, g.rank),
                                  collective=where, step=1, segment=j)
            else:
                region.copy_(down_rx[0][j])
        for i, c in enumerate(children):
            seal_and_send(j, c, 1 + i, Phase.TREE_DOWN)
    for w, peer in sends:
        tr.wait(w, peer, FrameLabel(f"{g.rank}->{peer}", where))
