"""Every wait on a peer ends within its limit, also a limit under a millisecond: gloo counts
whole milliseconds and reads 0 as "no timeout", so a limit of 0.5 ms handed to it as it is
would wait for the peer forever (``ccddp.comm.transport.gloo_timeout``).

Each case's peer stays silent for 5 s, then leaves (gloo closes the connection when a wait
times out, so there is nothing to send after): a wait that ignored its limit ends only
then, and the test fails on the time instead of hanging."""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from thread_ranks import run_thread_ranks

SECRET = "2c9e1b7a4f3d8e6c0a5b9d2f7e1c4a8b3d6f0e9c2b5a8d1f4e7c0b3a6d9f2e5c"
NEVER_SENT = 21               # the tag rank 0 waits on
SILENCE_S = 5.0


def _silent_peer(pg) -> None:
    """Rank 1: wait ``SILENCE_S`` for a message rank 0 never sends, then leave (a wait of
    rank 0's that times out closes the connection: that ends this one sooner)."""
    try:
        pg.recv([torch.empty(1)], 0, NEVER_SENT).wait(timedelta(seconds=SILENCE_S))
    except RuntimeError:
        pass


def _timed(wait) -> tuple[str, float]:
    start = time.monotonic()
    try:
        wait()
        outcome = "completed"
    except Exception as e:  # noqa: BLE001 - the test asserts on the type
        outcome = type(e).__name__
    return outcome, time.monotonic() - start


def _transport_rank(rank, n):
    import torch.distributed as dist

    from ccddp.comm.transport import Transport
    from ccddp.errors import FrameLabel

    pg = dist.group.WORLD
    if rank == 1:
        return _silent_peer(pg)
    work = pg.recv([torch.empty(1)], 1, NEVER_SENT)
    return _timed(lambda: Transport(pg, 0.0005).wait(work, 1, FrameLabel("1->0", "a frame")))


def test_a_transport_limit_under_a_millisecond_still_ends_the_wait():
    outcome, seconds = run_thread_ranks(_transport_rank, 2, timeout=60)[0]
    assert outcome == "PeerTimeoutError" and seconds < 2.0, (outcome, seconds)


def _receive_rank(rank, n):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    pg = dist.new_group(backend="ccddp", timeout=timedelta(seconds=20))
    if rank == 1:
        return _silent_peer(dist.group.WORLD)
    work = dist.irecv(torch.empty(4), 1, group=pg, tag=NEVER_SENT)
    result = _timed(lambda: work.wait(timedelta(microseconds=500)))
    dist.group.WORLD.send([torch.ones(1)], 1, NEVER_SENT).wait(timedelta(seconds=SILENCE_S))   # rank 1 may go
    return result


def test_a_sealed_receive_waited_for_under_a_millisecond_ends_with_a_typed_error():
    """``work.wait(timedelta(microseconds=500))`` on a ccddp receive whose sender is silent."""
    outcome, seconds = run_thread_ranks(_receive_rank, 2, timeout=60)[0]
    assert outcome == "PeerTimeoutError" and seconds < 2.0, (outcome, seconds)
