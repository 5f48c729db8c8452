"""What every worker process launched by torchrun shares: process-group start-up with a
finite timeout, and an exit that turns a ccddp error into one line and a non-zero status
(torchrun then stops the other ranks, so nothing hangs)."""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from ccddp.errors import CCDDPError

EXIT_CCDDP_ERROR = 3


def init_from_env(timeout_s: float = 120.0) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def run_worker(main: Callable[[], None]) -> None:
    """Run ``main``; on failure print one line naming the rank and exit non-zero at once."""
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
