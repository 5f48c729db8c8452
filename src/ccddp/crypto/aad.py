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

from ccddp.errors import ConfigError

# The dtype travels by its full name, zero-padded: a truncated name would make dtypes
# such as float8_e4m3fn and float8_e4m3fnuz indistinguishable to the receiver.
DTYPE_NAME_BYTES = 32
_FORMAT = struct.Struct(f">16sQBBIIIIQ{DTYPE_NAME_BYTES}s")


def dtype_field(name: str) -> bytes:
    """``name`` as the fixed-width field AADs and descriptors carry; refuses a name that
    would not fit whole (no torch dtype comes close)."""
    raw = name.encode()
    if len(raw) > DTYPE_NAME_BYTES or b"\0" in raw:
        raise ConfigError(f"dtype name {name!r} does not fit the {DTYPE_NAME_BYTES}-byte frame context")
    return raw


class Op(enum.IntEnum):
    ALL_REDUCE = 1
    REDUCE_SCATTER = 2
    ALL_GATHER = 3
    BROADCAST = 4
    TREE_ALL_REDUCE = 5
    DESCRIPTOR = 6
    BOUNCE = 7
    CONFIRM = 8
    ALL_TO_ALL = 9
    GATHER = 10
    SCATTER = 11
    SEND_RECV = 12
    # A small all-reduce of two ranks: one sealed exchange (``ccddp.comm.plan.exchange_plan``).
    EXCHANGE_ALL_REDUCE = 13


class Phase(enum.IntEnum):
    NONE = 0
    REDUCE_SCATTER = 1
    ALL_GATHER = 2
    TREE_UP = 3
    TREE_DOWN = 4
    BROADCAST = 5
    EXCHANGE = 6


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
                            self.segment, self.src, self.dst, self.nbytes, dtype_field(self.dtype))

    def where(self) -> str:
        return f"{self.op.name.lower()}#{self.seq}/{self.phase.name.lower()}"
