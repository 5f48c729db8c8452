"""Runs a schedule (``plan.Step`` list) with segments flowing through it.

This is the ``secure`` (and plaintext ``ring``) engine, after CryptMPI: every receive of
the collective is posted up front; the segment sent at step ``s`` is sealed as soon as
the same segment of step ``s-1`` has been opened and reduced, on a pool of crypto
threads (multi-chain), while earlier segments are in flight; sends are posted in order as
their seals finish. Before blocking on a receive, every finished seal is sent, so no
rank ever waits on a peer that waits on it.

Memory is bounded: segments run in rounds of at most :data:`ROUND_BYTES` of receive
frames, and a rank seals into :data:`SEND_SLOTS` send frames it reuses. Before sealing
into a slot it waits for the slot's last send to finish: gloo sends rendezvous with
receives, and the peer posted all of the round's when it entered the round, so this waits
on the peer's transport threads, never on a peer that waits for us. Send memory is then a
few segments instead of a round's worth (the time is unchanged: BENCHMARKS.md).
Segment ``j`` of step ``s`` depends only on segment ``j`` of step ``s-1``, so a round takes
a range of segment indices through every step; both ends walk rounds, steps and segments
in the same order, so frames, counters and nonces line up. Only collectives larger than a round (DDP's first-iteration bucket of a
large model) have more than one, and pay one pipeline drain per round.

With ``group_key`` all-gather, a frame received in the all-gather phase is forwarded
as ciphertext and opened once; only its owner sealed it.

Nothing here is a library feature: torch.distributed gives P2P, not pipelined secure
collectives, so this is written by hand.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from ccddp.comm.group import SecureGroup
from ccddp.comm.plan import Step, segment_bounds
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import FrameLabel

ANY_RANK = 0xFFFF

# Receive frames of one round. At group.py's cache limit, so the arena is allocated once
# and reused by every round and collective; a 64 MiB all-reduce of 4 MiB segments is one
# round up to 8 ranks.
ROUND_BYTES = 256 << 20
# Send frames a rank seals into, round-robin: enough that a slot's last send has usually
# finished by the time the slot comes round again (2, 4 and 8 timed alike at 4 ranks).
SEND_SLOTS = 4


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _pick(segs: list, js: range) -> list:
    """``(j, segs[j])`` for the indices ``js`` this list has."""
    return [(j, segs[j]) for j in range(js.start, min(js.stop, len(segs)))]


def _run_all(jobs) -> None:
    for job in jobs:
        job()


class _Pipeline:
    def __init__(self, g: SecureGroup, flat: torch.Tensor, steps: list[Step], op: Op, seq: int,
                 *, secure: bool, seg_bytes: int | None, group_key: bool, tag: int, gate,
                 reduction: Reduction = Reduction.SUM) -> None:
        self.g, self.flat, self.steps, self.op, self.seq = g, flat, steps, op, seq
        self.reduction = reduction
        self.tag, self.gate = tag, gate
        self.secure = secure
        self.group_key = group_key and secure
        self.isz = flat.element_size()
        self.u8 = flat.view(torch.uint8)
        self.dtype = dtype_name(flat)
        seg_elems = max(1, min(seg_bytes or MAX_FRAME_BYTES, MAX_FRAME_BYTES) // self.isz)
        self.send_segs = [segment_bounds(*st.send_region, seg_elems) if st.send_region else [] for st in steps]
        self.recv_segs = [segment_bounds(*st.recv_region, seg_elems) if st.recv_region else [] for st in steps]
        self.where = f"{op.name.lower()}#{seq}"
        self.rx_frames: dict[tuple[int, int], torch.Tensor] = {}
        self.rx_work: dict[tuple[int, int], object] = {}
        # Sends not yet waited for: of frames outside the slots (plaintext segments,
        # forwarded ciphertext), and per slot the last send from it, or "sealing".
        self.send_work: list[tuple[object, int]] = []
        self.slot_sends: list = []
        self.pending: deque = deque()

    # -- frames --------------------------------------------------------------------
    def _forwarding(self, s: int) -> bool:
        """Step ``s`` moves group-key frames (all-gather phase in group-key mode)."""
        return self.group_key and self.steps[s].phase == Phase.ALL_GATHER

    def _forwards(self, s: int) -> bool:
        """Step ``s`` sends a frame it received, unchanged, instead of sealing one."""
        return self._forwarding(s) and s > 0 and self.steps[s - 1].phase == Phase.ALL_GATHER

    def _ctx(self, s: int, j: int, src: int, dst: int, nbytes: int) -> bytes:
        st = self.steps[s]
        return FrameContext(self.g.session_id, self.seq, self.op, st.phase, st.wire_step, j,
                            src, dst, nbytes, self.dtype).pack()

    def _group_ctx(self, owner: int, j: int, nbytes: int) -> bytes:
        # Identical for every receiver: the frame is forwarded unchanged around the ring.
        return FrameContext(self.g.session_id, self.seq, self.op, Phase.ALL_GATHER, 0, j,
                            owner, ANY_RANK, nbytes, self.dtype).pack()

    def segments_per_round(self) -> int:
        """Segment indices per round: the most whose receive frames of every step fit
        :data:`ROUND_BYTES` (at least one)."""
        tag = TAG_BYTES if self.secure else 0
        per_index = max(1, sum(max(((b - a) * self.isz + tag for a, b in segs), default=0)
                               for segs in self.recv_segs))
        return max(1, ROUND_BYTES // per_index)

    def post_receives(self, js: range) -> None:
        """Post the receives of segments ``js`` of every step; allocate their send frames."""
        tag = TAG_BYTES if self.secure else 0
        mine = [_pick(segs, js) for segs in self.recv_segs]
        total = sum((b - a) * self.isz + tag for segs in mine for _, (a, b) in segs)
        arena = self.g.buffer("rx", total)
        self.rx_frames.clear()
        self.rx_work.clear()
        off = 0
        for s, st in enumerate(self.steps):
            if st.recv_peer is None:
                continue
            for j, (a, b) in mine[s]:
                if not self.secure and st.action == "copy":
                    frame = self.u8[a * self.isz:b * self.isz]
                else:
                    n = (b - a) * self.isz + tag
                    frame = arena[off:off + n]
                    off += n
                self.rx_frames[s, j] = frame
                if frame.numel():
                    self.rx_work[s, j] = self.g.transport.irecv(frame, st.recv_peer, self.tag)
        if self.secure:
            sealed = [b - a for s in range(len(self.steps)) if not self._forwards(s)
                      for _, (a, b) in _pick(self.send_segs[s], js)]
            self.slot_bytes = max(sealed, default=0) * self.isz + TAG_BYTES
            nslots = max(1, min(SEND_SLOTS, len(sealed)))
            self.slots = self.g.buffer("tx", nslots * self.slot_bytes)
            self.slot_sends = [None] * nslots
            self._next_slot = 0

    def recv_job(self, s: int, j: int):
        """The job that applies received segment ``(s, j)``; counters are taken now."""
        st = self.steps[s]
        a, b = self.recv_segs[s][j]
        region = self.flat[a:b]
        frame = self.rx_frames[s, j]
        if not self.secure:
            if st.action != "reduce":
                return None
            return lambda: self.reduction.combine(region, frame.view(self.flat.dtype))
        nbytes = (b - a) * self.isz
        if self._forwarding(s):
            ch, aad = self.g.group_channel(st.recv_chunk), self._group_ctx(st.recv_chunk, j, nbytes)
        else:
            ch, aad = self.g.rx(st.recv_peer), self._ctx(s, j, st.recv_peer, self.g.rank, nbytes)
        if j == 0:
            self.g.counters.add_message(sealed=False)
        if st.action == "copy":
            return ch.open_job(frame.numpy(), self.u8[a * self.isz:b * self.isz].numpy(), aad,
                               collective=self.where, step=s, segment=j)
        # Open in place (OpenSSL's GCM allows out == in): the frame's first bytes become
        # the plaintext, saving a scratch buffer and a pass over memory.
        plain = frame[:nbytes]
        opened = ch.open_job(frame.numpy(), plain.numpy(), aad, collective=self.where, step=s, segment=j)
        as_dtype = plain.view(self.flat.dtype)

        def open_and_reduce() -> None:
            opened()
            self.reduction.combine(region, as_dtype)

        return open_and_reduce

    def send_frame(self, s: int, j: int):
        """``(frame, job, slot)`` for sent segment ``(s, j)``: the job fills the frame;
        ``slot`` is None for a frame outside the send slots."""
        st = self.steps[s]
        a, b = self.send_segs[s][j]
        plain = self.u8[a * self.isz:b * self.isz]
        if not self.secure:
            return plain, None, None
        if self._forwards(s):
            return self.rx_frames[s - 1, j], None, None
        nbytes = (b - a) * self.isz
        k = self._take_slot()
        frame = self.slots[k * self.slot_bytes:k * self.slot_bytes + nbytes + TAG_BYTES]
        if self._forwarding(s):
            ch, aad = self.g.group_channel(self.g.rank), self._group_ctx(self.g.rank, j, nbytes)
        else:
            ch, aad = self.g.tx(st.send_peer), self._ctx(s, j, self.g.rank, st.send_peer, nbytes)
        if j == 0:
            self.g.counters.add_message(sealed=True)
        return frame, ch.seal_job(plain.numpy(), frame.numpy(), aad), k

    def _take_slot(self) -> int:
        """The next send slot, once the last frame sealed into it has been sent."""
        k = self._next_slot
        self._next_slot = (k + 1) % len(self.slot_sends)
        if self.slot_sends[k] == "sealing":
            self.flush(block=True)
        self._wait_slot(k)
        self.slot_sends[k] = "sealing"
        return k

    def _wait_slot(self, k: int) -> None:
        # A gloo send's completion is consumed by the wait that sees it (a second wait on
        # the same work blocks until the timeout), so each send is waited for once.
        if self.slot_sends[k] is not None:
            work, peer = self.slot_sends[k]
            self.slot_sends[k] = None
            # A peer that called a different collective never receives this send: check
            # the descriptors first, so that fails with what differs, not a timeout.
            self.gate()
            self.g.transport.wait(work, peer, FrameLabel(f"{self.g.rank}->{peer}", self.where))

    # -- flow ----------------------------------------------------------------------
    def flush(self, block: bool) -> None:
        while self.pending:
            fut, s, frame, k = self.pending[0]
            if fut is not None:
                if not block and not fut.done():
                    return
                fut.result()
            self.pending.popleft()
            if frame is not None and frame.numel():
                peer = self.steps[s].send_peer
                work = self.g.transport.isend(frame, peer, self.tag)
                if k is None:
                    self.send_work.append((work, peer))
                else:
                    self.slot_sends[k] = (work, peer)
            elif k is not None:
                self.slot_sends[k] = None

    def run(self) -> None:
        per_round = self.segments_per_round()
        most = max(len(segs) for segs in self.recv_segs + self.send_segs)
        for first in range(0, most, per_round):
            self.run_round(range(first, min(first + per_round, most)))

    def run_round(self, js: range) -> None:
        """Segments ``js`` through every step; returns when all their frames are done."""
        self.post_receives(js)
        steps, tr = self.steps, self.g.transport
        for s in range(len(steps) + 1):
            has_recv = s > 0 and steps[s - 1].recv_peer is not None
            has_send = s < len(steps) and steps[s].send_peer is not None
            if not (has_recv or has_send):
                continue
            if has_recv and has_send and self.recv_segs[s - 1] != self.send_segs[s]:
                raise AssertionError("schedule must send at step s what it received at step s-1")
            nseg = len(self.send_segs[s] if has_send else self.recv_segs[s - 1])
            for j in range(js.start, min(js.stop, nseg)):
                jobs = []
                if has_recv:
                    w = self.rx_work.get((s - 1, j))
                    if w is not None:
                        if not w.is_completed():
                            self.flush(block=True)
                        self.gate()
                        peer = steps[s - 1].recv_peer
                        tr.wait(w, peer, FrameLabel(f"{peer}->{self.g.rank}", self.where, s - 1, j))
                    job = self.recv_job(s - 1, j)
                    if job is not None:
                        jobs.append(job)
                frame, k = None, None
                if has_send:
                    frame, job, k = self.send_frame(s, j)
                    if job is not None:
                        jobs.append(job)
                fut = None
                if jobs and self.g.engine is not None:
                    fut = self.g.engine.submit(_run_all, jobs)
                else:
                    _run_all(jobs)
                self.pending.append((fut, s, frame, k))
                self.flush(block=False)
        self.flush(block=True)
        for w, peer in self.send_work:
            tr.wait(w, peer, FrameLabel(f"{self.g.rank}->{peer}", self.where))
        self.send_work.clear()
        for k in range(len(self.slot_sends)):
            self._wait_slot(k)


def run_pipelined(g: SecureGroup, flat: torch.Tensor, steps: list[Step], op: Op, seq: int, *,
                  secure: bool, seg_bytes: int | None, group_key: bool = False, tag: int,
                  gate: Callable[[], None], reduction: Reduction = Reduction.SUM) -> None:
    """Run ``steps`` on the 1-D contiguous CPU tensor ``flat`` in place, its messages on
    gloo tag ``tag``; ``gate`` runs before the first wait on a peer (it acts once);
    ``reduction`` combines a received segment with the local one in reduce steps."""
    _Pipeline(g, flat, steps, op, seq, secure=secure, seg_bytes=seg_bytes, group_key=group_key,
              tag=tag, gate=gate, reduction=reduction).run()
