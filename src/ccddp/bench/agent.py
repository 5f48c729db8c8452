"""torchrun, as ccddp's commands start it: ``python -m ccddp.bench.agent ARGS`` runs
``torch.distributed.run.main`` -- the function the ``torchrun`` executable runs, unchanged,
with the same arguments -- its imports made with the cycle collector paused
(:mod:`ccddp.startup`) -- and, once it has returned (every rank ended with status 0),
leaves without the interpreter's teardown (:func:`ccddp.bench.worker.leave`).

That teardown is the last thing a launch waits for, after the ranks have finished: up to
~1 s of wall and of CPU (BENCHMARKS.md, "Test suite time: ranks and torchrun end without the
interpreter's teardown").
Everything else is torchrun's: its options, its rendezvous, how it starts, watches, stops and
reports the ranks; a failed rank still ends it with torchrun's ``ChildFailedError`` report
(which rank failed first, its exit code or signal) and status 1 -- the report alone, without
the Python stack of torchrun's own frames above it, which says nothing about the failure
(the ranks print their own errors).

Example (what :func:`ccddp.bench.launch.torchrun` runs)::

    python -m ccddp.bench.agent --nproc-per-node=2 --max-restarts=0 -m ccddp.bench.train ...
"""

from __future__ import annotations

import sys

from ccddp.startup import pause_collector, resume_collector

pause_collector(__name__)  # the imports below without the cycle collector (ccddp.startup)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from ccddp.bench.worker import leave


def main() -> None:
    resume_collector()
    try:
        torchrun_main()
    except ChildFailedError as e:
        print(f"{type(e).__module__}.{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    leave()


if __name__ == "__main__":
    main()
