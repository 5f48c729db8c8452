"""No AES-GCM call gets an output that overlaps its input.

cryptography 51 refuses such calls ("data and buf must not overlap"): the pipelined and
naive schedules once opened a reduced frame in place, and every sealed reduce failed on a
fresh install. These cases catch that on any cryptography version, by checking the buffers
each open is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thread_ranks import run_thread_ranks as run_ranks

SECRET = bytes.fromhex("80a1ef968996f68127072dc1ef099048d83d39e3cbc8858a8292625323edcfc0")


def _overlapping_opens(rank, n, impl, numel):
    from ccddp.bench.reference import all_reduce
    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto import GroupSecret

    g = SecureGroup(CommSettings(impl=impl, timeout_s=20, segment_bytes=4096), secret=GroupSecret(SECRET),
                    transport=Transport.open(None, 20))
    overlaps = []
    channel = g.channels.rx(1 - rank)
    real = channel.open_job

    def checked(frame, out, aad, **kw):
        if np.shares_memory(np.asarray(frame), np.asarray(out)):
            overlaps.append(len(out))
        return real(frame, out, aad, **kw)

    channel.open_job = checked
    channel.open = lambda frame, out, aad, **kw: checked(frame, out, aad, **kw)()
    x = torch.full((numel,), float(rank + 1))
    got = all_reduce(x, g)
    g.close()
    return overlaps, bool(torch.all(got == 3.0))


@pytest.mark.parametrize("impl, numel", [("secure", 1000),        # the two-rank exchange
                                         ("secure", 1 << 19),     # the ring, several segments
                                         ("secure-naive", 5000)])
def test_no_open_writes_over_its_own_frame(impl, numel):
    for overlaps, correct in run_ranks(_overlapping_opens, 2, impl, numel):
        assert correct
        assert overlaps == [], f"{impl}: {len(overlaps)} opens wrote plaintext over their frame"
