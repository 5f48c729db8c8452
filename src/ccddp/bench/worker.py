"""What every worker process launched by torchrun shares: process-group start-up with a
finite timeout, the cycle collector resumed once its module's imports are done
(:mod:`ccddp.startup`), an exit that turns a ccddp error into one line and a non-zero
status (torchrun then stops the other ranks, so nothing hangs), and a successful exit
without the interpreter's teardown (:func:`leave`)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from ccddp.errors import CCDDPError
from ccddp.launched import check_world_size
from ccddp.startup import resume_collector

EXIT_CCDDP_ERROR = 3


def init_from_env(timeout_s: float = 120.0) -> None:
    check_world_size()          # the job's size as the launch says it, not as the host's store does
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def run_worker(main: Callable[[], None]) -> None:
    """Run ``main``; on failure print one line naming the rank and exit non-zero at once."""
    resume_collector()          # the entry module's imports are done (ccddp.startup)
    rank = os.environ.get("RANK", "?")
    try:
        main()
    except CCDDPError as e:
        print(f"ccddp: error: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_CCDDP_ERROR)
    except Exception as e:  # an unexpected failure: keep the traceback, still exit at once
        traceback.print_exc()
        print(f"ccddp: error: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    leave()


def leave() -> None:
    """End this process, its work done, without Python's teardown of the interpreter.

    That teardown collects and clears the million objects torch and dynamo made at import,
    one by one, for memory the kernel takes back at once anyway: ~1 s of CPU per rank, about
    a quarter of a small training rank's (BENCHMARKS.md, "Test suite time: ranks and torchrun
    end without the interpreter's teardown"). What an exit promises is kept: the functions
    registered with ``atexit`` run (logging flushes its handlers, multiprocessing reaps its
    children, temporary directories go), then the standard streams are flushed, then the
    status is 0. Where Python would still wait for a thread that is not a daemon, or has no
    ``atexit._run_exitfuncs`` (another interpreter than CPython), it returns and the process
    exits the ordinary way."""
    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if run_exit_functions is None or others:
        return
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
