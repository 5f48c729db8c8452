"""One channel's device pads: keystream made ahead for the counters its link uses next, so
a device seal or open that finds its pad is an XOR and a GHASH (no AES).

Invariants:

- pads are made only within ``budget`` bytes (none when it is 0, or too small for a
  frame), only for counters the channel has not taken yet, and only below the end of the
  key epoch in force (the next epoch's key does not exist before its first frame); no
  counter gets a second pad (:class:`~ccddp.crypto.device.PadBuffer`'s watermark);
- a pad is handed out once, to the take of its own counter and epoch, on the device the
  frame runs on and covering the frame's bytes; otherwise the frame goes without one (its
  engine computes the keystream) and the pad is dropped;
- a job that took a pad waits on the pad's own keystream kernel before it launches, and
  releases the pad with a fence recorded after its kernels on the stream it launched them
  on: the pad's bytes are written again only once those kernels are done, so refills and
  frames may run on different streams;
- every pad made and every pad used is reported to ``recorder`` (``PadEvent.MADE`` /
  ``USED`` with the key id and the nonce), as the channel reports nonces;
- this object holds no counter and no key: the channel passes its next counter, epoch and
  key with each call, under its own lock (so the counter is still its next); a lock of
  its own guards the buffer, which a job's release touches from any thread.

Nothing here imports torch or Triton before the first pad is made or released.

Example::

    pads = ChannelPads(budget=1 << 20)
    pads.top_up(aead.device, nonce_of, next_counter=5, epoch=0, epoch_end=1 << 32,
                nbytes=4096, device=dev, key_id=key_id)
    lease = pads.take(5, epoch=0, nbytes=4096, device=dev, key_id=key_id, nonce=nonce_of(5))
    if lease is not None:
        lease.wait_written()          # this stream reads the pad after it is made
        ...                           # launch the seal with lease.arena, lease.offset
        pads.release(lease, dev)      # its bytes stay occupied until the seal ran
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

    from ccddp.crypto.device import DeviceAESGCM, Pad, PadBuffer, PadEvent

PadRecorder = Callable[["PadEvent", bytes, bytes], None]


@dataclass(frozen=True)
class PadLease:
    """A pad taken for one frame and the buffer it came from (the channel may replace its
    buffer, on another device, before the frame's job runs)."""

    pad: Pad
    buffer: PadBuffer

    @property
    def arena(self) -> torch.Tensor:
        return self.buffer.arena

    @property
    def offset(self) -> int:
        return self.pad.offset

    def wait_written(self) -> None:
        """Make what this thread launches from now on run after the pad's keystream kernel."""
        self.pad.written.wait()


class ChannelPads:
    """The pads of one channel (see the module docstring)."""

    def __init__(self, budget: int = 0, recorder: PadRecorder | None = None) -> None:
        self.budget = budget
        self.recorder = recorder
        self._buffer: PadBuffer | None = None
        self._lock = threading.Lock()

    def ready(self) -> int:
        """How many pads wait for their counters."""
        with self._lock:
            return self._buffer.ready() if self._buffer is not None else 0

    def take(self, counter: int, epoch: int, nbytes: int, device, *, key_id: bytes, nonce: bytes) -> PadLease | None:
        """The pad of ``counter`` for a frame of ``nbytes`` on ``device``, or None."""
        with self._lock:
            buffer = self._buffer
            if buffer is None or buffer.device != device:
                return None
            pad = buffer.take(counter, epoch, nbytes)
        if pad is None:
            return None
        if self.recorder is not None:
            from ccddp.crypto.device import PadEvent

            self.recorder(PadEvent.USED, key_id, nonce)
        return PadLease(pad, buffer)

    def release(self, lease: PadLease, device) -> None:
        """The frame's kernels are launched (or failed to): the pad's bytes may be written
        again once what this thread launched on its current stream, them included, is done."""
        # Through the module, not a name bound once: tests swap in fences they control.
        from ccddp.crypto.device import pads as device_pads

        fence = device_pads.stream_fence(device)
        with self._lock:
            lease.buffer.release(lease.pad, fence)

    def top_up(self, aead: Callable[[], DeviceAESGCM], nonce_of: Callable[[int], bytes], *, next_counter: int,
               epoch: int, epoch_end: int, nbytes: int, device, key_id: bytes) -> None:
        """Make pads for frames of ``nbytes`` on ``device`` for counters from ``next_counter``
        below ``epoch_end`` (the first counter of the next key epoch), in the free bytes of
        the budget. ``aead`` gives the epoch's device engine (made only if a pad is)."""
        from ccddp.crypto.device import PadBuffer, PadEvent, pad_bytes

        if self.budget < pad_bytes(nbytes):
            return
        with self._lock:
            if self._buffer is None or self._buffer.device != device:
                self._buffer = PadBuffer(self.budget, device)
            if next_counter >= epoch_end:
                return
            made = self._buffer.refill(aead(), nonce_of, next_counter=next_counter, epoch=epoch,
                                       epoch_end=epoch_end, nbytes=nbytes)
        if self.recorder is not None:
            for p in made:
                self.recorder(PadEvent.MADE, key_id, nonce_of(p.counter))
