"""Groups a library makes under a ``ccddp`` default group (``torchrun ... subgroup_main.py OUT``).

The script asks for ``gloo`` subgroups the way libraries do (``new_group``, ``new_subgroups``,
a CPU device mesh), all-reduces rank 0's marker values on each, saves and loads a
distributed checkpoint, and checks that a backend ccddp cannot seal is refused. Each rank
writes what it saw to ``OUT/rank{r}.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def marker_values(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234 + step)
    return torch.rand(4096, generator=g)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("ccddp")
    rank, n = dist.get_rank(), dist.get_world_size()
    seen: dict[str, object] = {}
    groups = {"new_group gloo": dist.new_group(backend="gloo"),
              "new_group cpu:gloo": dist.new_group(list(range(n)), backend="cpu:gloo"),
              "new_subgroups": dist.new_subgroups(group_size=n, backend="gloo")[0],
              "device mesh": dist.init_device_mesh("cpu", (n,)).get_group()}
    for i, (name, pg) in enumerate(groups.items()):
        t = marker_values(i) if rank == 0 else torch.zeros(4096)
        dist.all_reduce(t, group=pg)
        seen[name] = {"backend": str(dist.get_backend(pg)), "correct": bool(torch.equal(t, marker_values(i)))}
    state = {"w": marker_values(10)}  # replicated: the same on every rank
    dcp.save(state, checkpoint_id=os.path.join(out, "ckpt"))
    back = {"w": torch.zeros(4096)}
    dcp.load(back, checkpoint_id=os.path.join(out, "ckpt"))
    seen["checkpoint"] = bool(torch.equal(back["w"], state["w"]))
    try:
        dist.new_group(backend="mpi")
        seen["mpi"] = "created"
    except Exception as e:  # the refusal is typed and names the backend
        seen["mpi"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
