"""Where the group secret could be read from outside a rank (``ccddp launch ...
environ_main.py OUT``).

``/proc/<pid>/environ`` shows the environment block a process started with, whatever it
later deletes from ``os.environ``, and a child inherits its parent's block. Every rank
saves the blocks of the processes that could hold the secret: its own, its torchrun agent
(its parent), a forked child and a subprocess, started after the rank's group exists, as
``OUT/rank{r}-{who}.environ`` (with the agent's command line, to show it is the agent).
A second argument ``ccddp`` asks for the ccddp backend by name (a plain torchrun, as
``ccddp train`` and ``ccddp bench`` start their ranks).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def environ(pid: int) -> bytes:
    """The environment block of live process ``pid``. A subprocess can be read too early:
    ``Popen`` returns once the child is in ``execve`` (vfork), before the kernel has set
    up its new block, and the read is then empty; so read again until it is there (the
    child waits on its stdin, so it lives; bounded)."""
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
        if block or time.monotonic() > deadline:
            return block
        time.sleep(0.01)


def main() -> None:
    out = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"  # gloo: served by ccddp under ccddp launch
    if backend == "ccddp":
        import ccddp.backend  # noqa: F401  (registers the backend)
    dist.init_process_group(backend)  # the secret is in use from here
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [2.0] * 4
    save_blocks(out)
    dist.destroy_process_group()


def save_blocks(out: str) -> None:
    """Save the four blocks and the agent's command line of this rank, whose group is in
    use, and the state of the cycle collector the script runs with (also called by
    secret_main.py, so one launch serves these tests)."""
    rank = dist.get_rank()
    with open(os.path.join(out, f"rank{rank}-collector.json"), "w") as f:
        json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, f)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # a forked child (a data-loader worker is one): waits until read
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    sub = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        blocks = {"self": environ(os.getpid()), "agent": environ(os.getppid()), "fork": environ(child),
                  "subprocess": environ(sub.pid)}
    finally:
        os.write(w, b"x")
        os.waitpid(child, 0)
        sub.communicate(b"")
    for who, block in blocks.items():
        with open(os.path.join(out, f"rank{rank}-{who}.environ"), "wb") as f:
            f.write(block)
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f, open(os.path.join(out, f"rank{rank}-agent.cmdline"),
                                                                "wb") as g:
        g.write(f.read())


if __name__ == "__main__":
    main()
