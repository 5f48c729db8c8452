"""Pads: keystream generated ahead for the counters a link will use next (pre-computed
encryption pads). A seal or open that finds its pad is an XOR and a GHASH.

A link's nonces are known before its data exists (link id || counter), so while the link
is idle its channel fills a :class:`PadBuffer`: one arena tensor of ``budget`` bytes on
the device, holding the pads of its next counters in order. A pad is never used twice:

- it is made for one counter of one key epoch, and only for counters the link has not
  taken (a watermark of counters already given a pad only moves up, so no counter gets
  a second pad);
- it is handed out once, to the take of its own counter, and leaves the buffer then;
- its arena bytes are written again only after every kernel that reads or writes them
  has finished, whatever streams they ran on. A job that used a pad releases it with a
  :class:`Fence` recorded after its kernels on the stream it launched them on (on a GPU a
  ``torch.cuda.Event``; CPU tensors run in Triton's interpreter, which is done when the
  launch returns); a pad dropped unused keeps its bytes until the fence of the kernel
  that wrote it. A refill places pads only in bytes that no ready, taken or fenced pad
  occupies: a fence not done yet keeps its bytes occupied, and a refill that finds no
  free bytes makes fewer pads (it never waits, never overwrites). Bytes are free only
  once their fence is done, so the refill's kernel, on whatever stream, writes after
  their last reader. The other way round, a job waits on its pad's ``written`` fence
  before it launches, so it never reads keystream still being made on another stream.

Example::

    pads = PadBuffer(budget=1 << 20, device="cuda")
    made = pads.refill(aead, nonce_of, next_counter=5, epoch=0, epoch_end=1 << 32, nbytes=4096)
    pad = pads.take(5, epoch=0, nbytes=4096)      # or None: seal computes its keystream
    pad.written.wait()                            # this stream reads the pad after it is made
    ...                                           # launch the seal with pad.offset
    pads.release(pad, stream_fence("cuda"))       # its bytes stay occupied until the seal ran
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Protocol

import torch

from ccddp.crypto.device.engine import DeviceAESGCM, Segment, pad_bytes
from ccddp.errors import ConfigError


class PadEvent(enum.Enum):
    MADE = "made"
    USED = "used"


class Fence(Protocol):
    """A point in one device stream's work, after the kernels launched on it so far
    (``torch.cuda.Event`` has this shape)."""

    def query(self) -> bool:
        """Whether every kernel launched before the fence has finished; never blocks."""
        ...

    def wait(self) -> None:
        """Make work launched from now on by this thread (its current stream) run after
        the fence."""
        ...


class _Complete:
    """The fence of work that is over when its launch returns: Triton's interpreter runs
    kernels on CPU tensors synchronously."""

    def query(self) -> bool:
        return True

    def wait(self) -> None:
        pass


COMPLETE: Fence = _Complete()


class _CudaFence:
    """A ``torch.cuda.Event`` recorded on one stream of ``device``."""

    def __init__(self, event: torch.cuda.Event, device: torch.device) -> None:
        self._event = event
        self._device = device

    def query(self) -> bool:
        return self._event.query()

    def wait(self) -> None:
        torch.cuda.current_stream(self._device).wait_event(self._event)


def stream_fence(device: torch.device | str) -> Fence:
    """A fence after everything this thread has launched so far on ``device``'s current
    stream (the stream Triton launched its kernels on).

    Example::

        aead.encrypt_segments(segments, data, frame, pad=pads.arena)
        pads.release(pad, stream_fence(frame.device))
    """
    device = torch.device(device)
    if device.type == "cpu":
        return COMPLETE
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return _CudaFence(event, device)
    # Assuming an unknown device's work done at launch could hand out bytes still read.
    raise ConfigError(f"pads on {device.type} devices: no way to tell when their kernels are done")


@dataclass(frozen=True)
class Pad:
    """The keystream of counter ``counter`` (key epoch ``epoch``) for messages of up to
    ``nbytes`` bytes, at ``offset`` in the arena; ``written`` is done once the kernel that
    writes it has run (wait on it before launching a kernel that reads the pad)."""

    counter: int
    epoch: int
    nbytes: int
    offset: int
    written: Fence = field(default=COMPLETE, compare=False, repr=False)

    @property
    def end(self) -> int:
        return self.offset + pad_bytes(self.nbytes)

    def overlaps(self, offset: int, size: int) -> bool:
        return offset < self.end and self.offset < offset + size


class PadBuffer:
    """Pads of one direction of one link, in counter order, within ``budget`` bytes.

    Every pad is in one of three places until its bytes are free again: ready (made, its
    counter not taken yet), taken (handed to a job that has not launched), or fenced
    (its bytes busy until a fence is done: the kernels of the job that used it, or the
    kernel that wrote it if it was dropped unused)."""

    def __init__(self, budget: int, device: torch.device | str) -> None:
        if budget < pad_bytes(1):
            raise ConfigError(f"pad budget must be at least {pad_bytes(1)} bytes, got {budget}")
        self.budget = budget
        self.arena = torch.empty(budget, dtype=torch.uint8, device=device)
        self._ready: deque[Pad] = deque()
        self._taken: set[Pad] = set()
        self._fenced: list[tuple[Pad, Fence]] = []
        self._watermark = 0          # every counter below has had its one chance of a pad
        self._tail = 0               # where the newest pad ends

    @property
    def device(self) -> torch.device:
        return self.arena.device

    def ready(self) -> int:
        return len(self._ready)

    def occupied(self) -> list[Pad]:
        """The pads whose bytes a refill must not write: ready, taken, or fenced by a
        fence not known to be done."""
        return [*self._ready, *self._taken, *(p for p, _ in self._fenced)]

    def take(self, counter: int, epoch: int, nbytes: int) -> Pad | None:
        """The pad of ``counter`` if it was made and covers ``nbytes`` bytes; it leaves the
        buffer either way, as do pads of earlier counters (those counters are gone)."""
        self._drop_below(counter)
        if not self._ready or self._ready[0].counter != counter:
            return None
        pad = self._ready.popleft()
        if pad.epoch != epoch or pad.nbytes < nbytes:
            self._fenced.append((pad, pad.written))
            return None
        self._taken.add(pad)
        return pad

    def release(self, pad: Pad, fence: Fence) -> None:
        """The job that used ``pad`` has launched its kernels, and ``fence`` (recorded after
        them, on their stream) tells when they are done: until then its bytes stay occupied.
        A pad not taken, or released already, is left as it is."""
        if pad in self._taken:
            self._taken.discard(pad)
            self._fenced.append((pad, fence))

    def refill(self, aead: DeviceAESGCM, nonce_of: Callable[[int], bytes], *, next_counter: int, epoch: int,
               epoch_end: int, nbytes: int) -> list[Pad]:
        """Make pads for messages of ``nbytes`` for the next counters (from ``next_counter``,
        below ``epoch_end``, none made before) in the free bytes of the arena; return them."""
        self._drop_below(next_counter)
        self._forget_done()
        counter = max(self._watermark, next_counter)
        placed: list[Pad] = []
        while counter < epoch_end:
            offset = self._place(pad_bytes(nbytes), placed)
            if offset is None:
                break
            placed.append(Pad(counter, epoch, nbytes, offset))
            self._tail = placed[-1].end
            counter += 1
        if not placed:
            return []
        self._watermark = counter
        aead.keystream_segments([Segment(nonce_of(p.counter), b"", 0, p.nbytes, 0, pad_offset=p.offset)
                                 for p in placed], self.arena)
        written = stream_fence(self.device)
        made = [replace(p, written=written) for p in placed]
        self._ready.extend(made)
        return made

    def _drop_below(self, counter: int) -> None:
        """Pads of counters below ``counter`` will never be taken: their bytes are free
        once the kernel that wrote them is done."""
        while self._ready and self._ready[0].counter < counter:
            pad = self._ready.popleft()
            self._fenced.append((pad, pad.written))

    def _forget_done(self) -> None:
        self._fenced = [(p, f) for p, f in self._fenced if not f.query()]

    def _place(self, size: int, placing: Iterable[Pad]) -> int | None:
        """An arena offset for ``size`` bytes after the newest pad (or wrapped to 0) that
        no occupied pad, nor one being placed, overlaps."""
        offset = self._tail if self._tail + size <= self.budget else 0
        if offset + size > self.budget:
            return None
        if any(p.overlaps(offset, size) for p in (*self.occupied(), *placing)):
            return None
        return offset
