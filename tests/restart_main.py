"""A job whose rank 1 dies in its first attempt (under ``ccddp launch --max-restarts 1``).

Every attempt writes, per rank, its session id and every (key id, nonce) its channels
took, to ``OUT/attempt{a}-rank{r}.json``; rank 1 of attempt 0 then exits with status 3,
and the next attempt must form new links and a new session and complete.

    ccddp launch --nproc-per-node 2 --max-restarts 1 tests/restart_main.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    out = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")  # served by ccddp under ccddp launch
    rank, n = dist.get_rank(), dist.get_world_size()
    secure = dist.group.WORLD.endpoint
    taken: list[tuple[str, str]] = []
    secure.recorder = lambda key_id, nonce: taken.append((key_id.hex(), nonce.hex()))  # before any channel exists
    for step in range(3):
        t = torch.full((3000,), float(rank + 1 + step))
        dist.all_reduce(t)
        assert bool((t == sum(r + 1 + step for r in range(n))).all()), "wrong all-reduce"
    with open(os.path.join(out, f"attempt{attempt}-rank{rank}.json"), "w") as f:
        json.dump({"session": secure.session_id.hex(), "nonces": taken}, f)
    if attempt == 0 and rank == 1:
        os._exit(3)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
