"""Checks a command runs before torch or torchrun starts: what can be answered without
them (is there a GPU device at all, would every rank refuse the group secret, how many
cores the ranks will share) is answered in one line, in well under a second, instead of
after torch has loaded.

Nothing here imports torch.

Example::

    require_gpu_device("ccddp train")        # ConfigError at once on a machine with no GPU device
    check_group_secret()                     # ConfigError at once for a secret every rank would refuse
    warn_oversubscribed(64, "ccddp train")   # one warning line when 64 ranks share fewer cores
"""

from __future__ import annotations

import glob
import os
import sys

from ccddp.errors import ConfigError

#: Device files a GPU that torch's "cuda" can use leaves on Linux: NVIDIA's driver
#: (/dev/nvidia0, ...), AMD's ROCm (/dev/kfd, which torch also calls "cuda"), WSL's (/dev/dxg).
GPU_DEVICE_PATTERNS = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def gpu_device_files() -> list[str]:
    """The GPU device files present on this machine (empty: torch cannot see a GPU either)."""
    return sorted(p for pattern in GPU_DEVICE_PATTERNS for p in glob.glob(pattern))


def require_gpu_device(command: str) -> None:
    """Refuse ``--device cuda`` before torch loads where the machine has no GPU device at
    all, or CUDA_VISIBLE_DEVICES hides every one; where one is present, torch's own check
    (:func:`ccddp.bench.devices.require_cuda`) has the last word."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        raise ConfigError(f"{command}: --device cuda needs a CUDA GPU; none is visible (CUDA_VISIBLE_DEVICES="
                          f"{hidden!r} hides every one): unset it, or use --device cpu")
    if not gpu_device_files():
        raise ConfigError(f"{command}: --device cuda needs a CUDA GPU; none is visible (this machine has no GPU "
                          "device: no /dev/nvidia0, /dev/kfd or /dev/dxg): use --device cpu, or run it on a "
                          "machine with a GPU")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscribed(ranks: int, cores: int | None = None, flag: str = "--world-size") -> str | None:
    """The warning for ``ranks`` local ranks on fewer cores, or None when each has a core
    (``flag``: the option that sets the ranks, named in the advice)."""
    cores = usable_cores() if cores is None else cores
    if ranks <= cores:
        return None
    fewer = f"{flag} {cores} or fewer" if flag == "--world-size" else f"{flag} up to {cores}"
    return (f"{ranks} local ranks on {cores} CPU core{'' if cores == 1 else 's'}: the ranks will take turns on "
            f"the cores, so the times measure that contention too ({fewer} gives each rank a core)")


def warn_oversubscribed(ranks: int, command: str, stream=None, cores: int | None = None,
                        flag: str = "--world-size") -> str | None:
    """Print :func:`oversubscribed`'s warning in one line on stderr (not a refusal);
    returns it."""
    text = oversubscribed(ranks, cores, flag)
    if text:
        print(f"{command}: warning: {text}", file=stream or sys.stderr, flush=True)
    return text


def check_group_secret() -> None:
    """A group secret the user set (``CCDDP_GROUP_SECRET``, or the file
    ``CCDDP_GROUP_SECRET_FILE`` names) that every rank would refuse -- malformed, short,
    guessable, a missing file -- is refused here in one line, before any rank starts. It
    is only read: the environment the ranks get is left as it is."""
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret

    if os.environ.get(ENV_SECRET):
        try:
            GroupSecret.from_hex(os.environ[ENV_SECRET])
        except ConfigError as e:
            raise ConfigError(f"{ENV_SECRET}: {e}") from None
    elif os.environ.get(ENV_SECRET_FILE):
        try:
            GroupSecret.from_file(os.environ[ENV_SECRET_FILE])
        except ConfigError as e:
            raise ConfigError(f"{ENV_SECRET_FILE}: {e}") from None
