"""Where a measuring run's tensors live: ``--device cpu`` (host memory, every collective
over gloo) or ``--device cuda`` (each rank on ``cuda:LOCAL_RANK % device_count``).

Invariants:

- A command asked for ``--device cuda`` on a machine without a visible GPU stops with one
  line before it launches a rank (:func:`require_cuda`).
- Several ranks may share one GPU. ccddp's own transport carries device frames as
  ciphertext through host memory (gloo), so sharing is allowed CC-on; CC-off uses NCCL only
  when every rank of every node has a GPU of its own (NCCL refuses two ranks on one GPU,
  "Duplicate GPU"), and otherwise gloo, which takes CUDA tensors for all-reduce, broadcast
  and all-gather (through pinned host copies; reduce-scatter as an all-reduce).
- The plaintext backend a CC-off run used is recorded with its reason.

Example::

    require_cuda("ccddp train")               # ConfigError in one line without a GPU
    device = rank_device("cuda")              # in a rank: cuda:LOCAL_RANK % count, made current
    plaintext_backend(device, own_gpu_everywhere=True)     # ("nccl", "each rank has a GPU of its own")
"""

from __future__ import annotations

import os

import torch

from ccddp.errors import ConfigError


def require_cuda(command: str) -> None:
    """Refuse ``--device cuda`` where torch sees no GPU (one line: what to do instead)."""
    if torch.cuda.is_available():
        return
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    why = "torch.cuda.is_available() is False" + (f"; CUDA_VISIBLE_DEVICES={hidden!r}" if hidden is not None else "")
    built = "" if torch.version.cuda else f"; this torch ({torch.__version__}) is built without CUDA"
    raise ConfigError(f"{command}: --device cuda needs a CUDA GPU; none is visible ({why}{built}): "
                      "use --device cpu, or run it on a machine with a GPU")


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def rank_device(kind: str) -> torch.device:
    """This rank's device for ``--device kind``; a GPU is made the current one, so NCCL
    and the caching allocator use it without being told."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ConfigError(f"--device must be cpu or cuda, got {kind!r}")
    require_cuda(f"rank {os.environ.get('RANK', '?')}")
    device = torch.device("cuda", local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def has_own_gpu() -> bool:
    """Whether every local rank of this node gets a GPU no other local rank uses."""
    return local_world_size() <= torch.cuda.device_count()


def plaintext_backend(device: torch.device, own_gpu_everywhere: bool) -> tuple[str, str]:
    """The CC-off backend on ``device`` and why: ``own_gpu_everywhere`` must be agreed by
    every rank (a group's backend is the same on all of its ranks)."""
    if device.type != "cuda":
        return "gloo", "host tensors"
    if own_gpu_everywhere:
        return "nccl", "each rank has a GPU of its own"
    return "gloo", "ranks share a GPU (NCCL refuses two ranks on one GPU): gloo with CUDA tensors"


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CPU has none): a phase's end on a GPU is
    when its kernels are done, not when the host queued them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(device: torch.device) -> dict:
    """What a result file records about the device its rank ran on."""
    if device.type != "cuda":
        return {"device": "cpu", "gpu": None, "ranks_per_gpu": None}
    count = torch.cuda.device_count()
    return {"device": str(device), "gpu": torch.cuda.get_device_name(device),
            "ranks_per_gpu": -(-local_world_size() // count)}


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` (a GPU); None for the host (see ``bench.memory``)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])
