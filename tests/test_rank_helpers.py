"""The rank helpers (``dist_util.run_ranks``: processes, ``thread_ranks.run_thread_ranks``:
threads) raise the failure of the rank that failed first, and note its peers' failures
after it: a peer's "connection closed by peer" is an echo of the cause, whatever its rank
number (before, rank 0's echo hid rank 1's cause)."""

from __future__ import annotations

import time

import pytest

from _security_util import spawn, values
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


def _what_the_rank_started_with(rank, n):
    import gc
    import sys

    from dist_util import PRELOAD

    return {"missing": [m for m in PRELOAD if m not in sys.modules], "frozen": gc.get_freeze_count(),
            "collecting": gc.isenabled()}


@pytest.mark.parametrize("runner", [run_ranks, lambda fn, n: values(spawn(fn, n))], ids=["run_ranks", "spawn"])
def test_a_process_rank_starts_with_torch_loaded_and_frozen(runner):
    """The fork server imports :data:`dist_util.PRELOAD` before any rank, and ignores one
    that fails to import: then every rank would import torch itself again (seconds). The
    rank then freezes it: else its collector walks torch's objects on every full pass."""
    for rank in runner(_what_the_rank_started_with, 2):
        assert not rank["missing"] and rank["collecting"], rank
        assert rank["frozen"] > 100_000, rank
