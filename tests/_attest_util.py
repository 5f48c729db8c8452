"""What the attestation tests share: refusals checked by their claim, bit flips, and the
lines that make a ``[tdx]`` table of test quotes accept any RTMR and TCB."""

from __future__ import annotations

import pytest

from ccddp.errors import AttestationError

#: A [tdx] table's required fields but ``mrtds``, each "any": the test quotes are judged by
#: their MRTD (a production policy pins RTMR0..2 and the TCB floor).
ANY_BUT_MRTD = 'rtmr0 = "any"\nrtmr1 = "any"\nrtmr2 = "any"\nmin_tee_tcb_svn = "any"\n'


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
