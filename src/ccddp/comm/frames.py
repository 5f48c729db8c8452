"""Frames of a collective: what each message is (typed specs) and where its bytes live
(one arena per group, on one device).

Invariants:

- A :class:`FrameSpec` names what both ends of a frame derive alike from the plan: the
  step, the segment index within the step's message, the peer, the element region of the
  collective's buffer. The frame's AAD is built from it, so a frame opens only where the
  receiver derived the same spec.
- Every frame buffer of a group comes from its :class:`FrameArena`: named buffers that
  grow and never shrink, on the arena's device; a request above ``max_cached_bytes`` gets
  memory of its own that is released with the collective (DDP's first-iteration bucket
  of a large model would otherwise stay allocated for the whole run).
- A send slot is :attr:`SlotState.FREE`, :attr:`~SlotState.SEALING` (a seal job writes
  its frame) or :attr:`~SlotState.SENDING` (its frame is on the wire until the send's work
  has been waited for); a slot is sealed into again only when FREE.

Example::

    sends, recvs = step_frames(ring_plan(0, 4, 1 << 20, "all_reduce"), seg_elems=1 << 18, isz=4)
    [(f.step, f.segment, f.peer, f.nbytes) for f in sends[0]]
    arena = FrameArena("cpu")
    rx = arena.layout("rx", [f.nbytes + 16 for f in recvs[0]])     # views into one buffer
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from ccddp.comm.plan import Step, segment_bounds

MAX_CACHED_BYTES = 256 << 20


@dataclass(frozen=True)
class FrameSpec:
    """One frame of a plan: segment ``segment`` of step ``step``'s message to or from
    ``peer``, covering elements ``[start, end)`` of the collective's buffer (``isz`` bytes
    each)."""

    step: int
    segment: int
    peer: int
    start: int
    end: int
    isz: int

    @property
    def nbytes(self) -> int:
        """Plaintext bytes of the frame (its sealed form adds the tag)."""
        return (self.end - self.start) * self.isz

    def plain(self, u8: torch.Tensor) -> torch.Tensor:
        """The frame's plaintext region of ``u8``, the collective's buffer as bytes."""
        return u8[self.start * self.isz:self.end * self.isz]


def frames_of(step: int, peer: int | None, region: tuple[int, int] | None, seg_elems: int | None,
              isz: int) -> list[FrameSpec]:
    """The frames one side of a step moves: none without a peer, else the region cut into
    segments of ``seg_elems`` elements (at least one frame, possibly empty, so both ends
    agree on a message even for an empty chunk)."""
    if peer is None or region is None:
        return []
    return [FrameSpec(step, j, peer, a, b, isz) for j, (a, b) in enumerate(segment_bounds(*region, seg_elems))]


def step_frames(steps: list[Step], seg_elems: int | None, isz: int) -> tuple[list[list[FrameSpec]],
                                                                           list[list[FrameSpec]]]:
    """``(sends, recvs)``: per step of ``steps``, the frames it sends and receives."""
    sends = [frames_of(s, st.send_peer, st.send_region, seg_elems, isz) for s, st in enumerate(steps)]
    recvs = [frames_of(s, st.recv_peer, st.recv_region, seg_elems, isz) for s, st in enumerate(steps)]
    return sends, recvs


class SlotState(enum.Enum):
    FREE = "free"
    SEALING = "sealing"
    SENDING = "sending"


class FrameArena:
    """Reusable frame memory on one device (see the module's invariants)."""

    def __init__(self, device: str | torch.device = "cpu", max_cached_bytes: int = MAX_CACHED_BYTES) -> None:
        self.device = torch.device(device)
        self.max_cached_bytes = max_cached_bytes
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` named ``name``; the same memory the next time the
        name is asked for (its contents are not kept)."""
        if nbytes > self.max_cached_bytes:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
            self._buffers[name] = buf
        return buf[:nbytes]

    def layout(self, name: str, sizes: list[int]) -> list[torch.Tensor]:
        """Consecutive views of the sizes ``sizes`` in buffer ``name``."""
        buf = self.take(name, sum(sizes))
        out, off = [], 0
        for n in sizes:
            out.append(buf[off:off + n])
            off += n
        return out

    def cached_bytes(self, name: str) -> int:
        """Bytes the arena keeps under ``name`` (0 if none)."""
        buf = self._buffers.get(name)
        return 0 if buf is None else buf.numel()

    def clear(self) -> None:
        self._buffers.clear()
