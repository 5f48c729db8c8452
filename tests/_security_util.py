"""Helpers of the security tests: spawn N gloo ranks and collect typed outcomes.

Unlike a plain runner, every rank's outcome comes back even when ranks fail (that is
what these tests are about), with how long the rank took, and a rank may be given its
own world size (to test a mismatch). Results are flushed before the process exits:
``os._exit`` right after ``Queue.put`` can drop the item, because ``put`` only hands it
to a feeder thread.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

from dist_util import CallerContext, freeze_preloaded, rank_processes

TESTS = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(TESTS), "src")


@dataclass
class Outcome:
    rank: int
    ok: bool
    value: object = None          # what the rank function returned
    type_name: str = ""           # exception type when not ok
    message: str = ""
    seconds: float = 0.0
    traceback: str = ""

    def __repr__(self) -> str:
        if self.ok:
            return f"<rank {self.rank} ok in {self.seconds:.1f}s>"
        return f"<rank {self.rank} {self.type_name}: {self.message[:200]} ({self.seconds:.1f}s)>"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, pg_timeout, out, args, caller, env):
    freeze_preloaded()
    caller.adopt()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    os.environ.update(env or {})
    t0 = time.monotonic()
    try:
        import torch

        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout))
        value = fn(rank, world_size, *args)
        out.put(Outcome(rank, True, value, seconds=time.monotonic() - t0))
    except BaseException as e:  # every failure goes back typed
        out.put(Outcome(rank, False, None, type(e).__name__, str(e), time.monotonic() - t0,
                        traceback.format_exc()))
    finally:
        out.close()
        out.join_thread()
        # No destroy_process_group: after a failure it may wait on dead peers.
        os._exit(0)


def spawn(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 20.0,
          world_sizes: list[int] | None = None, env: dict | None = None,
          expect_silent: tuple[int, ...] = ()) -> list[Outcome]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return one
    :class:`Outcome` per rank. ``world_sizes`` gives each rank its own idea of the world
    size. A rank that does not report within ``timeout`` fails the test (a hang), unless
    it is listed in ``expect_silent`` (a rank the test kills or freezes on purpose): it
    then comes back as ``Outcome(ok=False, type_name="died" or "silent")`` once the
    others have reported."""
    ctx = rank_processes()
    out = ctx.Queue()
    port = free_port()
    sizes = world_sizes or [world_size] * world_size
    caller = CallerContext()
    procs = [ctx.Process(target=_entry, args=(fn, r, sizes[r], port, pg_timeout, out, args, caller, env),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            if set(range(world_size)) - set(results) <= set(expect_silent):
                for r in expect_silent:
                    if r not in results:
                        results[r] = Outcome(r, False, type_name="died" if procs[r].exitcode is not None
                                             else "silent")
                break
            try:
                o = out.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                missing = sorted(set(range(world_size)) - set(results))
                raise AssertionError(f"ranks {missing} hung: no outcome within {timeout}s "
                                     f"(others: {[results[r] for r in sorted(results)]})") from None
            results[o.rank] = o
    finally:
        for r, p in enumerate(procs):
            if r in expect_silent:
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]


def values(outcomes: list[Outcome]) -> list:
    """The returned values, or an AssertionError showing every failed rank's traceback."""
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise AssertionError("\n".join(f"rank {o.rank}: {o.type_name}: {o.message}\n{o.traceback}" for o in bad))
    return [o.value for o in outcomes]


def worker_env(extra: dict | None = None) -> dict:
    """Environment for torchrun workers: this checkout's src and tests importable."""
    from ccddp.bench.launch import job_env

    env = job_env(extra)
    if not env.get("CCDDP_GROUP_SECRET") and not env.get("CCDDP_GROUP_SECRET_FILE"):
        # These tests start torchrun themselves (not through ccddp.bench.launch.torchrun,
        # which hands a secret over in a memfd): the test's ranks get one in their env.
        env["CCDDP_GROUP_SECRET"] = os.urandom(32).hex()
    env["PYTHONPATH"] = os.pathsep.join([SRC, TESTS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
