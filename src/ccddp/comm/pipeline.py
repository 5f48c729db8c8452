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

On an ordered wire (NCCL: tags ignored, a rank's operations run in order) the receives
are not posted up front: each send goes out in one group with a receive, after the
collective's descriptors are checked (``run_round_ordered`` says why this cannot deadlock).
Device frames that gloo carries are copied to host memory behind their seal and sent when
the copy is done, like a host seal's future.

With ``group_key`` all-gather, a frame received in the all-gather phase is forwarded
as ciphertext and opened once; only its owner sealed it.

Nothing here is a library feature: torch.distributed gives P2P, not pipelined secure
collectives, so this is written by hand.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ccddp.comm import probe, transport
from ccddp.comm.frames import FrameSpec, SlotState, step_frames
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.ordered import OrderedWire
from ccddp.comm.plan import Step
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


def _pick(frames: list[FrameSpec], js: range) -> list[FrameSpec]:
    """The frames of segment indices ``js`` (those this step has)."""
    return frames[js.start:js.stop]


@dataclass
class SendSlot:
    """A reused send frame: its state, and while SENDING the send's work and peer."""

    state: SlotState = SlotState.FREE
    work: object = None
    peer: int = -1


class _CopyDone:
    """The future of an asynchronous copy to host: done when its event is."""

    def __init__(self, event) -> None:
        self.event = event

    def done(self) -> bool:
        return self.event.query()

    def result(self) -> None:
        self.event.synchronize()


def copy_to_host(frame: torch.Tensor):
    """``(host, future)``: a host copy of device ``frame``, queued on the current stream
    after what wrote it (pinned memory: the copy does not block), and the future that
    says when its bytes are there (None: already there)."""
    host = transport.host_buffer(frame)      # through the module: tests count the copies
    if frame.device.type != "cuda":
        host.copy_(frame)
        return host, None
    host.copy_(frame, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, _CopyDone(event)


@functools.lru_cache(maxsize=256)
def _frames(steps: tuple[Step, ...], seg_elems: int, isz: int):
    """``step_frames`` as tuples, kept: training repeats the same collectives (a bucket,
    an FSDP unit) every step, and building the specs is a fixed cost of every op (issue
    42). Steps and frame specs are frozen, so a kept result cannot change under a caller."""
    sends, recvs = step_frames(list(steps), seg_elems, isz)
    return tuple(map(tuple, sends)), tuple(map(tuple, recvs))


def _parallel(steps, sends) -> bool:
    """Whether crypto threads could run anything of ``steps`` side by side: some step has
    several segments, and no step sends the region it reduces into (an exchange)."""
    if any(st.action == "reduce" and st.send_region is not None and st.send_region == st.recv_region
           for st in steps):
        return False
    return any(len(frames) > 1 for frames in sends)


def _run_all(jobs) -> None:
    for job in jobs:
        job()


class _Pipeline:
    def __init__(self, g: Endpoint, flat: torch.Tensor, steps: list[Step], op: Op, seq: int,
                 *, secure: bool, seg_bytes: int | None, group_key: bool, tag: int, gate,
                 reduction: Reduction = Reduction.SUM, wire: OrderedWire | None = None) -> None:
        self.g, self.flat, self.steps, self.op, self.seq = g, flat, steps, op, seq
        # On an ordered wire (NCCL) frames go in step groups, not on tags (``run_round_ordered``).
        self.wire = wire
        self.waiter = wire if wire is not None else g.transport
        self.reduction = reduction
        self.tag, self.gate = tag, gate
        self.secure = secure
        self.group_key = group_key and secure
        self.isz = flat.element_size()
        self.u8 = flat.view(torch.uint8)
        # Frames live where the tensor does (device memory for a device tensor).
        self.arena = g.arena_for(flat.device)
        # Device frames are sealed by kernels launched in order on the calling thread's
        # stream (the launch is the host's whole share of the work); host frames go to
        # the crypto threads.
        self.pool = g.engine if flat.device.type == "cpu" and wire is None else None
        self.dtype = dtype_name(flat)
        seg_elems = max(1, min(seg_bytes or MAX_FRAME_BYTES, MAX_FRAME_BYTES) // self.isz)
        self.sends, self.recvs = _frames(tuple(steps), seg_elems, self.isz)
        if self.pool is not None and not _parallel(steps, self.sends):
            # Nothing to run side by side (every step one segment, or a step that sends the
            # region it reduces into: its seal must finish before its reduce starts): the
            # crypto runs here, in the same order, without a hand-off to a pool thread and
            # back (issue 42: tens of microseconds each on a busy machine).
            self.pool = None
        # Device frames that gloo carries are copied to host memory here, asynchronously.
        self.to_host = wire is None and flat.device.type not in g.transport.host_device_types
        # What the channel gets: host memory as numpy views (made here, once per frame,
        # not again inside every job), device memory as tensors.
        self.crypto_buffer = (lambda t: t.numpy()) if flat.device.type == "cpu" else (lambda t: t)
        self.where = f"{op.name.lower()}#{seq}"
        self.rx_frames: dict[tuple[int, int], torch.Tensor] = {}
        self.opened: dict[tuple[int, int], torch.Tensor] = {}
        self.rx_work: dict[tuple[int, int], object] = {}
        # Sends of frames outside the slots (plaintext segments, forwarded ciphertext) not
        # yet waited for.
        self.send_work: list[tuple[object, int]] = []
        self.slots: list[SendSlot] = []
        self.pending: deque = deque()

    # -- frames --------------------------------------------------------------------
    def _forwarding(self, s: int) -> bool:
        """Step ``s`` moves group-key frames (all-gather phase in group-key mode)."""
        return self.group_key and self.steps[s].phase == Phase.ALL_GATHER

    def _forwards(self, s: int) -> bool:
        """Step ``s`` sends a frame it received, unchanged, instead of sealing one."""
        return self._forwarding(s) and s > 0 and self.steps[s - 1].phase == Phase.ALL_GATHER

    def _ctx(self, f: FrameSpec, src: int, dst: int) -> bytes:
        st = self.steps[f.step]
        return FrameContext(self.g.session_id, self.seq, self.op, st.phase, st.wire_step, f.segment,
                            src, dst, f.nbytes, self.dtype).pack()

    def _group_ctx(self, owner: int, f: FrameSpec) -> bytes:
        # Identical for every receiver: the frame is forwarded unchanged around the ring.
        return FrameContext(self.g.session_id, self.seq, self.op, Phase.ALL_GATHER, 0, f.segment,
                            owner, ANY_RANK, f.nbytes, self.dtype).pack()

    def segments_per_round(self) -> int:
        """Segment indices per round: the most whose receive frames of every step fit
        :data:`ROUND_BYTES` (at least one)."""
        tag = TAG_BYTES if self.secure else 0
        per_index = max(1, sum(max((f.nbytes + tag for f in frames), default=0) for frames in self.recvs))
        return max(1, ROUND_BYTES // per_index)

    def post_receives(self, js: range) -> None:
        """Post the receives of segments ``js`` of every step; size the send slots."""
        frames = self.allocate(js)
        if probe.ON:
            probe.stamp("pipeline: arena frames + slots")
        for (s, j), frame in frames.items():
            if frame.numel():
                self.rx_work[s, j] = self.g.transport.irecv(frame, self.recvs[s][j].peer, self.tag)

    def allocate(self, js: range) -> dict[tuple[int, int], torch.Tensor]:
        """The receive frames of segments ``js`` of every step, in (step, segment) order;
        the send slots, sized."""
        tag = TAG_BYTES if self.secure else 0
        # Plaintext copies land in place; everything else in the arena's receive buffer.
        in_place = [not self.secure and st.action == "copy" for st in self.steps]
        mine = [f for s, frames in enumerate(self.recvs) for f in _pick(frames, js)]
        arena = iter(self.arena.layout("rx", [f.nbytes + tag for f in mine if not in_place[f.step]]))
        self.rx_frames.clear()
        self.rx_work.clear()
        for f in mine:
            self.rx_frames[f.step, f.segment] = f.plain(self.u8) if in_place[f.step] else next(arena)
        # pyca's AES-GCM (cryptography >= 51) refuses an output that overlaps its input, so
        # a sealed host frame that is reduced is opened into a buffer of its own; the device
        # engine opens in place (its frame's first bytes become the plaintext).
        reduced = [f for f in mine if self.secure and self.flat.device.type == "cpu"
                   and self.steps[f.step].action == "reduce"]
        keys = [(f.step, f.segment) for f in reduced]
        if self.pool is None:
            # The jobs run one after another on this thread, each reducing what it opened
            # before the next starts: one buffer serves them all (and stays in cache).
            one = self.arena.take("opened", max((f.nbytes for f in reduced), default=0))
            self.opened = {k: one[:f.nbytes] for k, f in zip(keys, reduced)}
        else:
            self.opened = dict(zip(keys, self.arena.layout("opened", [f.nbytes for f in reduced])))
        if self.secure:
            sealed = [f.nbytes for s in range(len(self.steps)) if not self._forwards(s)
                      for f in _pick(self.sends[s], js)]
            self.slot_bytes = max(sealed, default=0) + TAG_BYTES
            nslots = max(1, min(SEND_SLOTS, len(sealed)))
            self.slot_memory = self.arena.take("tx", nslots * self.slot_bytes)
            self.slots = [SendSlot() for _ in range(nslots)]
            self._next_slot = 0
        return self.rx_frames

    def recv_job(self, s: int, j: int):
        """The job that applies received segment ``(s, j)``; counters are taken now."""
        st = self.steps[s]
        f = self.recvs[s][j]
        region = self.flat[f.start:f.end]
        frame = self.rx_frames[s, j]
        if not self.secure:
            if st.action != "reduce":
                return None
            return lambda: self.reduction.combine(region, frame.view(self.flat.dtype))
        if self._forwarding(s):
            ch, aad = self.g.channels.group_channel(st.recv_chunk), self._group_ctx(st.recv_chunk, f)
        else:
            ch, aad = self.g.channels.rx(f.peer), self._ctx(f, f.peer, self.g.rank)
        if j == 0:
            self.g.counters.add_message(sealed=False)
        if st.action == "copy":
            return ch.open_job(self.crypto_buffer(frame), self.crypto_buffer(f.plain(self.u8)), aad,
                               collective=self.where, step=s, segment=j)
        plain = self.opened.get((s, j))
        if plain is None:
            plain = frame[:f.nbytes]  # the device engine opens in place (see allocate)
        opened = ch.open_job(self.crypto_buffer(frame), self.crypto_buffer(plain), aad, collective=self.where,
                             step=s, segment=j)
        as_dtype = plain.view(self.flat.dtype)

        def open_and_reduce() -> None:
            opened()
            self.reduction.combine(region, as_dtype)

        return open_and_reduce

    def send_frame(self, s: int, j: int):
        """``(frame, job, slot)`` for sent segment ``(s, j)``: the job fills the frame;
        ``slot`` is None for a frame outside the send slots."""
        f = self.sends[s][j]
        plain = f.plain(self.u8)
        if not self.secure:
            return plain, None, None
        if self._forwards(s):
            return self.rx_frames[s - 1, j], None, None
        k = self._take_slot()
        frame = self.slot_memory[k * self.slot_bytes:k * self.slot_bytes + f.nbytes + TAG_BYTES]
        if self._forwarding(s):
            ch, aad = self.g.channels.group_channel(self.g.rank), self._group_ctx(self.g.rank, f)
        else:
            ch, aad = self.g.channels.tx(f.peer), self._ctx(f, self.g.rank, f.peer)
        if j == 0:
            self.g.counters.add_message(sealed=True)
        return frame, ch.seal_job(self.crypto_buffer(plain), self.crypto_buffer(frame), aad), k

    def _take_slot(self) -> int:
        """The next send slot, once the last frame sealed into it has been sent."""
        k = self._next_slot
        self._next_slot = (k + 1) % len(self.slots)
        if self.slots[k].state is SlotState.SEALING:
            self.flush(block=True)
        self._wait_slot(k)
        self.slots[k].state = SlotState.SEALING
        return k

    def _wait_slot(self, k: int) -> None:
        # A gloo send's completion is consumed by the wait that sees it (a second wait on
        # the same work blocks until the timeout), so each send is waited for once.
        slot = self.slots[k]
        if slot.state is SlotState.SENDING:
            work, peer = slot.work, slot.peer
            self.slots[k] = SendSlot()
            # A peer that called a different collective never receives this send: check
            # the descriptors first, so that fails with what differs, not a timeout.
            self.gate()
            self.waiter.wait(work, peer, FrameLabel(f"{self.g.rank}->{peer}", self.where))

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
                    self.slots[k] = SendSlot(SlotState.SENDING, work, peer)
            elif k is not None:
                self.slots[k] = SendSlot()

    def run(self) -> None:
        if probe.ON:
            probe.stamp("pipeline: setup (frame specs)")
        per_round = self.segments_per_round()
        most = max(len(frames) for frames in self.recvs + self.sends)
        if self.wire is not None:
            # No tag keeps two collectives apart on an ordered wire: the peers' descriptors
            # are checked before the first frame is posted.
            self.gate()
        for first in range(0, most, per_round):
            js = range(first, min(first + per_round, most))
            if self.wire is None:
                self.run_round(js)
                continue
            try:
                self.run_round_ordered(js)
            except BaseException as e:
                # Frames of this collective may be posted and never matched: the wire
                # must not pair them with the next collective's.
                self.wire.fail(f"{self.where} stopped: {type(e).__name__}")
                raise

    def run_round(self, js: range) -> None:
        """Segments ``js`` through every step; returns when all their frames are done."""
        self.post_receives(js)
        if probe.ON:
            probe.stamp("pipeline: data irecv posts")
        steps, tr = self.steps, self.g.transport
        for s in range(len(steps) + 1):
            has_recv = s > 0 and steps[s - 1].recv_peer is not None
            has_send = s < len(steps) and steps[s].send_peer is not None
            if not (has_recv or has_send):
                continue
            if has_recv and has_send and ([(f.start, f.end) for f in self.recvs[s - 1]]
                                          != [(f.start, f.end) for f in self.sends[s]]):
                raise AssertionError("schedule must send at step s what it received at step s-1")
            nseg = len(self.sends[s] if has_send else self.recvs[s - 1])
            for j in range(js.start, min(js.stop, nseg)):
                jobs = []
                if has_recv:
                    w = self.rx_work.get((s - 1, j))
                    if w is not None:
                        if not w.is_completed():
                            self.flush(block=True)
                            if probe.ON:
                                probe.stamp("send: isend")
                        self.gate()
                        if probe.ON:
                            probe.stamp("descriptor: wait + open (gate)")
                        peer = steps[s - 1].recv_peer
                        tr.wait(w, peer, FrameLabel(f"{peer}->{self.g.rank}", self.where, s - 1, j))
                        if probe.ON:
                            probe.stamp("wait: data frame")
                    job = self.recv_job(s - 1, j)
                    if job is not None:
                        jobs.append(job)
                frame, k = None, None
                if has_send:
                    frame, job, k = self.send_frame(s, j)
                    if job is not None:
                        jobs.append(job)
                if probe.ON:
                    probe.stamp("frame jobs: AAD, counters, slot")
                fut = None
                if jobs and self.pool is not None:
                    fut = self.pool.submit(_run_all, jobs)
                else:
                    _run_all(jobs)
                if probe.ON:
                    probe.stamp("seal / open + reduce" if self.pool is None else "crypto: pool submit")
                if self.to_host and frame is not None and frame.numel():
                    # A device frame for gloo: its copy to host is queued behind the seal and
                    # sent once done (flush), so the next segment's seal is launched meanwhile.
                    frame, fut = copy_to_host(frame)
                self.pending.append((fut, s, frame, k))
                self.flush(block=False)
                if probe.ON:
                    probe.stamp("send: isend")
        self.flush(block=True)
        if probe.ON:
            probe.stamp("send: isend")
        for w, peer in self.send_work:
            tr.wait(w, peer, FrameLabel(f"{self.g.rank}->{peer}", self.where))
        self.send_work.clear()
        for k in range(len(self.slots)):
            self._wait_slot(k)
        if probe.ON:
            probe.stamp("wait: send completions")

    # -- on an ordered wire ----------------------------------------------------------
    # NCCL matches the k-th send of a pair with the k-th receive and runs a rank's groups
    # one after another. Each group here is the rank's i-th send and its i-th receive, in
    # (step, segment) order: the i-th send of rank r is the i-th receive of r+1, so on a ring
    # the i-th groups of all ranks match one another and run together, after the (i-1)-th.
    # A rank waits for receive m before it seals send i > m (a step sends what the step
    # before received, and step 0 sends first), so on a ring no receive is ever posted
    # alone before its pair. A chain (broadcast) rank must have its first segment before
    # it sends anything: that one receive goes alone, and each send then carries the next
    # receive along, so a segment is forwarded while the next one arrives. A rank that
    # sends nothing in a round posts its receives at once: no peer waits on it.
    def run_round_ordered(self, js: range) -> None:
        """Segments ``js`` through every step on the ordered wire; returns when their
        frames are done."""
        frames = self.allocate(js)
        queue = deque(key for key, frame in frames.items() if frame.numel())
        steps = self.steps
        if not any(st.send_peer is not None and self.sends[s] for s, st in enumerate(steps)):
            while queue:
                self._post_ordered(None, queue)
        for s in range(len(steps) + 1):
            has_recv = s > 0 and steps[s - 1].recv_peer is not None
            has_send = s < len(steps) and steps[s].send_peer is not None
            nseg = max(len(self.sends[s]) if has_send else 0, len(self.recvs[s - 1]) if has_recv else 0)
            for j in range(js.start, min(js.stop, nseg)):
                if has_recv and j < len(self.recvs[s - 1]):
                    key = (s - 1, j)
                    while key not in self.rx_work and key in queue:
                        self._post_ordered(None, queue)
                    w = self.rx_work.get(key)
                    if w is not None:
                        peer = steps[s - 1].recv_peer
                        self.wire.wait(w, peer, FrameLabel(f"{peer}->{self.g.rank}", self.where, s - 1, j))
                    job = self.recv_job(s - 1, j)
                    if job is not None:
                        job()
                send = None
                if has_send and j < len(self.sends[s]):
                    frame, job, k = self.send_frame(s, j)
                    if job is not None:
                        job()
                    if frame.numel():
                        send = (frame, steps[s].send_peer, k)
                    elif k is not None:
                        self.slots[k] = SendSlot()
                if send is not None:
                    self._post_ordered(send, queue)
        while queue:                       # receives no send carried (uneven segment counts)
            self._post_ordered(None, queue)
        for w, peer in self.send_work:
            self.wire.wait(w, peer, FrameLabel(f"{self.g.rank}->{peer}", self.where))
        self.send_work.clear()
        for k in range(len(self.slots)):
            self._wait_slot(k)

    def _post_ordered(self, send, queue: deque) -> None:
        """Post one group: ``send`` (frame, peer, slot) if any, and the next receive of
        ``queue``, if any."""
        key = queue.popleft() if queue else None
        recv = None if key is None else (self.rx_frames[key], self.recvs[key[0]][key[1]].peer)
        if send is None and recv is None:
            return
        work = self.wire.post(send=None if send is None else send[:2], recv=recv)
        if key is not None:
            self.rx_work[key] = work
        if send is not None:
            frame, peer, k = send
            if k is None:
                self.send_work.append((work, peer))
            else:
                self.slots[k] = SendSlot(SlotState.SENDING, work, peer)


def run_pipelined(g: Endpoint, flat: torch.Tensor, steps: list[Step], op: Op, seq: int, *,
                  secure: bool, seg_bytes: int | None, group_key: bool = False, tag: int,
                  gate: Callable[[], None], reduction: Reduction = Reduction.SUM,
                  wire: OrderedWire | None = None) -> None:
    """Run ``steps`` on the 1-D contiguous tensor ``flat`` (host or device memory) in place, its messages on
    gloo tag ``tag`` -- or in step groups on the ordered ``wire`` (NCCL), after ``gate``;
    ``gate`` runs before the first wait on a peer (it acts once); ``reduction`` combines a
    received segment with the local one in reduce steps."""
    _Pipeline(g, flat, steps, op, seq, secure=secure, seg_bytes=seg_bytes, group_key=group_key,
              tag=tag, gate=gate, reduction=reduction, wire=wire).run()
