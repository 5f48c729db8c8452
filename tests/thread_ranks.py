"""Ranks as threads: ``run_thread_ranks(fn, n)`` runs ``fn(rank, n)`` on ``n`` threads of
this process, each with its own c10d world (torch's threaded test worlds, as
``test_c10d_pypg.py`` drives DDP), its own gloo default group over one in-process store,
and returns the results by rank -- the contract of ``dist_util.run_ranks`` without a
process per rank, so a case costs milliseconds of setup instead of seconds of imports.

What a thread cannot give, and the tests that need it stay on processes (``run_ranks``):
an environment of its own (``os.environ`` is the process's: per-rank ``RANK``,
``GROUP_RANK``, secrets or settings that differ by rank), torch's default random generator
(``torch.manual_seed`` per rank: use a ``torch.Generator`` of the rank's own), module
globals a rank patches for itself (a wrapped function, a lowered constant: they would
outlive the test too), a death of its own (a rank that crashes, is killed or exits), its
own ``/proc``, signals, network namespace, kernel or CUDA context (local-link proofs see
one machine), a launcher (torchrun, ``ccddp launch``). Everything else -- collectives, DDP,
attacks on the wire made by a rank's own code, timeouts -- runs the same on threads.

A failing rank does not end the others: they stop at the group's timeout
(``pg_timeout``), and the failure is raised (typed, with its traceback) once every thread
has ended, or :class:`TimeoutError` names the ranks still running at ``timeout``.

Where this torch has no threaded worlds (a private module, checked once), the call runs
the ranks as processes through ``run_ranks`` instead: same results, slower.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from datetime import timedelta

from dist_util import RankFailure, raise_first_failure, run_ranks

_install_lock = threading.Lock()
_installed: bool | None = None
_runs = itertools.count()


def _threaded_worlds() -> bool:
    """Make c10d's world per-thread, once per process (the main thread keeps a world of its
    own, so tests that use ``torch.distributed`` directly are unaffected)."""
    global _installed
    with _install_lock:
        if _installed is None:
            try:
                from torch.testing._internal.distributed import multi_threaded_pg as threaded

                import torch.distributed as dist

                import torch

                if not hasattr(threaded, "ThreadLocalWorld"):
                    raise ImportError("no ThreadLocalWorld")
                # The C++ registry of group names per thread too, as torch's own threaded
                # test cases set it (every thread's default group is named "0").
                torch._C._distributed_c10d._set_thread_isolation_mode(True)
                dist.distributed_c10d._world = threaded.ThreadLocalWorld()
                _installed = True
            except (ImportError, AttributeError):
                _installed = False
        return _installed


def run_thread_ranks(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 30.0,
                     return_failures: bool = False):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` thread ranks; results by rank."""
    if not _threaded_worlds():
        return run_ranks(fn, world_size, *args, timeout=timeout, pg_timeout=pg_timeout,
                         return_failures=return_failures)
    import torch.distributed as dist

    store = dist.PrefixStore(f"thread-ranks-{next(_runs)}", dist.HashStore())
    results: list[object] = [RankFailure(r, "NotRun", "the rank did not start") for r in range(world_size)]
    finished: list[int] = []   # ranks in the order they ended (list.append: one bytecode, thread-safe)

    def entry(rank: int) -> None:
        try:
            dist.init_process_group("gloo", rank=rank, world_size=world_size, store=store,
                                    timeout=timedelta(seconds=pg_timeout))
            results[rank] = fn(rank, world_size, *args)
        except BaseException as e:  # typed, to the caller
            results[rank] = RankFailure(rank, type(e).__name__, str(e), traceback.format_exc())
        finally:
            finished.append(rank)
            try:
                dist.destroy_process_group()
            except Exception:  # after a failure the group may be half made
                pass

    threads = [threading.Thread(target=entry, args=(r,), name=f"rank{r}", daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"ranks {stuck} did not finish within {timeout}s")
    if not return_failures:
        raise_first_failure([results[r] for r in finished])
    return results
