"""A conservative memory check before launching ranks: a one-line error that says what
to change beats the kernel's OOM killer taking a rank mid-run."""

from __future__ import annotations

from ccddp.comm.pipeline import ROUND_BYTES
from ccddp.errors import ConfigError

# Per rank: parameters, gradients (views of DDP's buckets), and room for activations;
# measured: GPT2-XL bf16 peaks at ~2.5x its parameter bytes per rank.
_COPIES = 2.5
# The naive schedule seals whole ring chunks, and DDP's first iteration all-reduces every
# gradient as one bucket: a receive and a send frame of param_bytes / world_size each.
_NAIVE_CHUNKS = 2
#: Bytes per rank that every workload's ``tiny`` size stays under, frames of any schedule
#: included (``tests/test_cli_train.py`` checks each): less than torch itself takes, so a
#: tiny launch is not checked (the check would load the model's library to count it).
TINY_BYTES_PER_RANK = 64 << 20


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def frame_bytes(workload, world_size: int, schedule: str | None) -> int:
    """Per-rank frame buffers of a CC-on schedule (``None``: CC-off, none)."""
    chunk = workload.param_bytes / max(1, world_size)
    if schedule == "naive":
        return int(_NAIVE_CHUNKS * chunk)
    if schedule == "pipelined":
        # At most a round of receive frames, and a few segment-sized send slots (counted
        # here as much again as the receive frames: conservative).
        return int(min(2 * ROUND_BYTES, 2 * chunk))
    return 0


def estimate_bytes(workload, ranks: int, world_size: int | None = None, schedule: str | None = None) -> int:
    """Bytes ``ranks`` local ranks need, of a job of ``world_size`` ranks (default: ``ranks``)."""
    per_rank = workload.param_bytes * _COPIES + frame_bytes(workload, world_size or ranks, schedule)
    return int(per_rank * ranks)


def check_fits(workload, ranks: int, world_size: int | None = None, schedule: str | None = None) -> None:
    need, have = estimate_bytes(workload, ranks, world_size, schedule), available_bytes()
    if have is not None and need > have:
        frames = frame_bytes(workload, world_size or ranks, schedule)
        hint = "use fewer ranks, --dtype bfloat16, or a smaller workload"
        if schedule == "naive":
            hint = "use --schedule pipelined (bounded frame buffers), fewer ranks, or --dtype bfloat16"
        raise ConfigError(
            f"{workload.name} on {ranks} local ranks needs about {need / 2**30:.1f} GiB "
            f"({workload.num_params / 1e6:.0f}M params x {_COPIES:g} copies per rank"
            + (f" + {frames / 2**30:.1f} GiB of {schedule} frames" if frames else "")
            + f") but {have / 2**30:.1f} GiB is available: {hint}")
