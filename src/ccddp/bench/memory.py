"""A conservative memory check before launching ranks: a one-line error that says what
to change beats the kernel's OOM killer taking a rank mid-run."""

from __future__ import annotations

from ccddp.errors import ConfigError

# Per rank: parameters, gradients (views of DDP's buckets), and room for activations;
# measured: GPT2-XL bf16 peaks at ~2.5x its parameter bytes per rank.
_COPIES = 2.5


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def estimate_bytes(workload, ranks: int) -> int:
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(workload.param_dtype).removeprefix("torch."), 4)
    return int(workload.num_params * itemsize * _COPIES * ranks)


def check_fits(workload, ranks: int) -> None:
    need, have = estimate_bytes(workload, ranks), available_bytes()
    if have is not None and need > have:
        raise ConfigError(
            f"{workload.name} on {ranks} local ranks needs about {need / 2**30:.1f} GiB "
            f"({workload.num_params / 1e6:.0f}M params x {_COPIES:g} copies per rank) but "
            f"{have / 2**30:.1f} GiB is available: use fewer ranks, --dtype bfloat16, or a smaller workload")
