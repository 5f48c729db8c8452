"""Run a function on N local ranks (processes, gloo) and collect what each returns.

Rank functions must be importable (module level). An exception in a rank comes back as
``RankFailure`` with its type name and message, so tests can assert on typed errors.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def child_env(extra: dict | None = None, *, first: tuple = ()) -> dict:
    """The environment for a process a test starts (a rank, a launcher, a CLI run): the
    parent's, with ``first`` entries, this checkout's ``src`` and ``tests`` ahead on
    ``PYTHONPATH`` and every entry the parent already had kept after them.

    Kept, not replaced: the GPU check puts the folder of wheels the image lacks
    (cryptography) on ``PYTHONPATH``, and a child that loses it dies on import before
    the code under test runs (issue 38). Every helper that starts processes builds its
    environment here; tests/test_child_env.py makes that a rule."""
    env = dict(os.environ)
    lead = [str(p) for p in first] + [str(SRC), str(HERE)]
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in lead]
    env["PYTHONPATH"] = os.pathsep.join(lead + kept)
    env.update(extra or {})
    return env


#: Imported once, in the fork server, before any rank starts: a rank then starts as a fork
#: of a process that has torch loaded (~0.1 s) instead of importing it afresh (~3 s on two
#: busy cores, per rank, per case). ``torch._dynamo`` too: DDP imports it (~1.3 s a rank;
#: the backend alone does not, :mod:`ccddp.backend.eager`). Third-party modules only:
#: ccddp and the test modules are imported by each rank under the environment its test
#: gives it. A fork server ignores a preload that fails to import:
#: tests/test_rank_helpers.py checks that a rank starts with torch loaded.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "cryptography.hazmat.primitives.ciphers.aead"]


def freeze_preloaded() -> None:
    """First thing in a rank forked from the server: move what :data:`PRELOAD` made (~480,000
    objects, alive as long as the rank) out of the cycle collector's reach, as
    ``ccddp.startup`` does in the processes ccddp starts; else every full pass of the
    collector in every rank walks them all again (BENCHMARKS.md, "Test suite time: the
    cycle collector")."""
    gc.freeze()


def rank_processes():
    """The multiprocessing context every rank helper starts ranks with: "forkserver" with
    torch preloaded. A fork server is a fresh process (no test's threads, locks or
    patched modules are inherited, as with "spawn"); only its environment is the one it
    started with, so each rank takes the caller's environment and standard streams of
    the moment through :class:`CallerContext`."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # once the server runs, later calls change nothing
    return ctx


class CallerContext:
    """What a spawned rank would inherit from its caller and a forked one does not: the
    caller's environment and its standard output and error *of the moment the rank
    starts* (pytest's ``capfd`` points them at files of its own; a fork server kept the
    ones it started with). Made in the caller, pickled into the rank with ``Process``'s
    arguments -- the two descriptors travel as descriptors -- and adopted first thing."""

    def __init__(self, env: dict | None = None, stdio: tuple = ()) -> None:
        self.env = dict(os.environ) if env is None else env
        self.stdio = stdio

    def __reduce__(self):
        from multiprocessing.reduction import DupFd  # only while a Process is being started

        return (CallerContext, (self.env, (DupFd(1), DupFd(2))))

    def adopt(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        for target, fd in zip((1, 2), self.stdio):
            received = fd.detach()
            os.dup2(received, target)
            os.close(received)


class RankFailure(Exception):
    def __init__(self, rank: int, type_name: str, message: str, tb: str = "") -> None:
        super().__init__(f"rank {rank}: {type_name}: {message}\n{tb}")
        self.rank, self.type_name, self.message = rank, type_name, message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, pg_timeout, out, args, caller):
    freeze_preloaded()
    caller.adopt()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout))
        result = fn(rank, world_size, *args)
        # Plain pickle: multiprocessing would share tensors through file descriptors of
        # a process that is about to exit.
        out.put((rank, "ok", pickle.dumps(result)))
    except BaseException as e:  # report every failure to the parent, typed
        out.put((rank, "error", (type(e).__name__, str(e), traceback.format_exc())))
    finally:
        # Flush the queue's feeder thread, then skip destroy_process_group: after a
        # failure it may wait on dead peers.
        out.close()
        out.join_thread()
        os._exit(0)


def run_ranks(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 30.0,
              return_failures: bool = False):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return results by rank.

    With ``return_failures``, failures are returned as :class:`RankFailure` values instead
    of raised (for tests where some ranks are expected to fail).
    """
    ctx = rank_processes()
    out = ctx.Queue()
    port = _free_port()
    caller = CallerContext()
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, pg_timeout, out, args, caller), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}   # in the order the ranks reported
    try:
        while len(results) < world_size:
            try:
                rank, status, value = out.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(results))} did not finish "
                                   f"within {timeout}s") from None
            results[rank] = pickle.loads(value) if status == "ok" else RankFailure(rank, *value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if not return_failures:
        raise_first_failure(list(results.values()))
    return [results[r] for r in range(world_size)]


def raise_first_failure(reports: list) -> None:
    """Raise the first :class:`RankFailure` among ``reports`` (in the order the ranks
    reported), noting the others: the first rank to fail is the likely cause, its peers'
    failures ("connection closed by peer") its echoes, whatever their rank numbers."""
    failed = [r for r in reports if isinstance(r, RankFailure)]
    if failed:
        for echo in failed[1:]:
            failed[0].add_note(f"then rank {echo.rank}: {echo.type_name}: {echo.message.splitlines()[0][:300]}")
        raise failed[0]
