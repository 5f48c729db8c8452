"""The rank helpers (``dist_util.run_ranks``: processes, ``thread_ranks.run_thread_ranks``:
threads) raise the failure of the rank that failed first, and note its peers' failures
after it: a peer's "connection closed by peer" is an echo of the cause, whatever its rank
number (before, rank 0's echo hid rank 1's cause)."""

from __future__ import annotations

import time

import pytest

from dist_util import RankFailure, run_ranks
from thread_ranks import run_thread_ranks


def _rank_1_fails_first(rank, n):
    if rank == 1:
        raise ValueError("the cause")
    time.sleep(0.5)
    raise RuntimeError("connection closed by peer")


@pytest.mark.parametrize("runner", [run_ranks, run_thread_ranks], ids=["processes", "threads"])
def test_the_first_rank_to_fail_is_raised_and_its_echoes_noted(runner):
    with pytest.raises(RankFailure) as failed:
        runner(_rank_1_fails_first, 2)
    assert failed.value.rank == 1 and failed.value.type_name == "ValueError", failed.value
    assert failed.value.__notes__ == ["then rank 0: RuntimeError: connection closed by peer"]
