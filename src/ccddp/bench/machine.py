"""What a result was measured on: machine, versions, date. Every result file records it."""

from __future__ import annotations

import datetime
import os
import platform


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def process_cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system (gloo's socket threads and
    the kernel's loopback copies included), to the microsecond (``os.times`` counts
    10 ms ticks)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine_info() -> dict:
    import cryptography
    import torch

    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "hostname": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cryptography": cryptography.__version__,
        "gpu": "none (CPU ranks over gloo)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
