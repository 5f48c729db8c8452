"""What the attestation tests share: refusals checked by their claim, and bit flips."""

from __future__ import annotations

import pytest

from ccddp.errors import AttestationError


def refused(claim: str, fn, *args, **kw) -> AttestationError:
    """``fn(*args, **kw)`` raises an AttestationError for ``claim``, and says so."""
    with pytest.raises(AttestationError) as ei:
        fn(*args, **kw)
    assert ei.value.claim == claim, (ei.value.claim, str(ei.value))
    assert claim in str(ei.value)
    return ei.value


def flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    """``data`` with one bit flipped."""
    b = bytearray(data)
    b[offset] ^= 1 << bit
    return bytes(b)
