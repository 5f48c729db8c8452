"""The authenticated context of a frame (AES-GCM associated data).

The receiver builds the AAD from what *it* expects, never from the wire, so a frame
replayed from another collective, step, segment, link or session, or one whose length or
dtype differs, fails its tag.

Example::

    ctx = FrameContext(session=b"s" * 16, seq=3, op=Op.ALL_REDUCE, phase=Phase.REDUCE_SCATTER,
                       step=0, segment=2, src=0, dst=1, nbytes=4096, dtype="float32")
    aad = ctx.pack()
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

_FORMAT = struct.Struct(">16sQBBIIIIQ12s")


class Op(enum.IntEnum):
    ALL_REDUCE = 1
    REDUCE_SCATTER = 2
    ALL_GATHER = 3
    BROADCAST = 4
    TREE_ALL_REDUCE = 5
    DESCRIPTOR = 6
    BOUNCE = 7
    CONFIRM = 8


class Phase(enum.IntEnum):
    NONE = 0
    REDUCE_SCATTER = 1
    ALL_GATHER = 2
    TREE_UP = 3
    TREE_DOWN = 4
    BROADCAST = 5


@dataclass(frozen=True)
class FrameContext:
    session: bytes
    seq: int
    op: Op
    phase: Phase
    step: int
    segment: int
    src: int
    dst: int
    nbytes: int
    dtype: str

    def pack(self) -> bytes:
        return _FORMAT.pack(self.session, self.seq, int(self.op), int(self.phase), self.step,
                            self.segment, self.src, self.dst, self.nbytes, self.dtype.encode()[:12])

    def where(self) -> str:
        return f"{self.op.name.lower()}#{self.seq}/{self.phase.name.lower()}"
