"""Pads: keystream generated ahead for the counters a link will use next (pre-computed
encryption pads). A seal or open that finds its pad is an XOR and a GHASH.

A link's nonces are known before its data exists (link id || counter), so while the link
is idle its channel fills a :class:`PadBuffer`: one arena tensor of ``budget`` bytes on
the device, holding the pads of its next counters in order. A pad is never used twice:

- it is made for one counter of one key epoch, and only for counters the link has not
  taken (a watermark of counters already given a pad only moves up, so no counter gets
  a second pad);
- it is handed out once, to the take of its own counter, and leaves the buffer then;
- its arena bytes are written again only after the job that used it has launched (kernels
  run in launch order on the device's stream).

Example::

    pads = PadBuffer(budget=1 << 20, device="cuda")
    made = pads.refill(aead, nonce_of, next_counter=5, epoch=0, epoch_end=1 << 32, nbytes=4096)
    pad = pads.take(5, epoch=0, nbytes=4096)      # or None: seal computes its keystream
    ...                                           # launch the seal with pad.offset
    pads.release(pad)
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from ccddp.crypto.device.engine import DeviceAESGCM, Segment, pad_bytes
from ccddp.errors import ConfigError


class PadEvent(enum.Enum):
    MADE = "made"
    USED = "used"


@dataclass(frozen=True)
class Pad:
    """The keystream of counter ``counter`` (key epoch ``epoch``) for messages of up to
    ``nbytes`` bytes, at ``offset`` in the arena."""

    counter: int
    epoch: int
    nbytes: int
    offset: int

    @property
    def end(self) -> int:
        return self.offset + pad_bytes(self.nbytes)


class PadBuffer:
    """Pads of one direction of one link, in counter order, within ``budget`` bytes."""

    def __init__(self, budget: int, device: torch.device | str) -> None:
        if budget < pad_bytes(1):
            raise ConfigError(f"pad budget must be at least {pad_bytes(1)} bytes, got {budget}")
        self.budget = budget
        self.arena = torch.empty(budget, dtype=torch.uint8, device=device)
        self._ready: deque[Pad] = deque()
        self._in_use: set[Pad] = set()
        self._watermark = 0          # every counter below has had its one chance of a pad
        self._tail = 0               # where the newest pad ends

    @property
    def device(self) -> torch.device:
        return self.arena.device

    def ready(self) -> int:
        return len(self._ready)

    def take(self, counter: int, epoch: int, nbytes: int) -> Pad | None:
        """The pad of ``counter`` if it was made and covers ``nbytes`` bytes; it leaves the
        buffer either way, as do pads of earlier counters (those counters are gone)."""
        while self._ready and self._ready[0].counter < counter:
            self._ready.popleft()
        if not self._ready or self._ready[0].counter != counter:
            return None
        pad = self._ready.popleft()
        if pad.epoch != epoch or pad.nbytes < nbytes:
            return None
        self._in_use.add(pad)
        return pad

    def release(self, pad: Pad) -> None:
        """The job that used ``pad`` has launched: its bytes may be written again."""
        self._in_use.discard(pad)

    def refill(self, aead: DeviceAESGCM, nonce_of: Callable[[int], bytes], *, next_counter: int, epoch: int,
               epoch_end: int, nbytes: int) -> list[Pad]:
        """Make pads for messages of ``nbytes`` for the next counters (from ``next_counter``,
        below ``epoch_end``, none made before) while the budget allows; return them."""
        while self._ready and self._ready[0].counter < next_counter:
            self._ready.popleft()
        counter = max(self._watermark, next_counter)
        made: list[Pad] = []
        while counter < epoch_end:
            offset = self._place(pad_bytes(nbytes))
            if offset is None:
                break
            pad = Pad(counter, epoch, nbytes, offset)
            made.append(pad)
            self._ready.append(pad)
            self._tail = pad.end
            counter += 1
        if made:
            self._watermark = counter
            aead.keystream_segments([Segment(nonce_of(p.counter), b"", 0, p.nbytes, 0, pad_offset=p.offset)
                                     for p in made], self.arena)
        return made

    def _place(self, size: int) -> int | None:
        """An arena offset for ``size`` bytes after the newest pad (or wrapped to 0) that
        no ready or in-use pad occupies."""
        offset = self._tail if self._tail + size <= self.budget else 0
        if offset + size > self.budget:
            return None
        for p in (*self._ready, *self._in_use):
            if offset < p.end and p.offset < offset + size:
                return None
        return offset
