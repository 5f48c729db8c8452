"""torchrun, as ccddp's commands start it: ``python -m ccddp.bench.agent ARGS`` runs
``torch.distributed.run.main`` -- the function the ``torchrun`` executable runs, unchanged,
with the same arguments -- and, once it has returned (every rank ended with status 0),
leaves without the interpreter's teardown (:func:`ccddp.bench.worker.leave`).

That teardown is the last thing a launch waits for, after the ranks have finished: up to
~1 s of wall and of CPU (BENCHMARKS.md, "Test suite time: ranks and torchrun end without the
interpreter's teardown").
Everything else is torchrun's: its options, its rendezvous, how it starts, watches, stops and
reports the ranks; a failed rank still ends it the way it ends ``torchrun`` (its
``ChildFailedError`` report, status 1).

Example (what :func:`ccddp.bench.launch.torchrun` runs)::

    python -m ccddp.bench.agent --nproc-per-node=2 --max-restarts=0 -m ccddp.bench.train ...
"""

from __future__ import annotations

from torch.distributed.run import main as torchrun_main

from ccddp.bench.worker import leave


def main() -> None:
    torchrun_main()
    leave()


if __name__ == "__main__":
    main()
