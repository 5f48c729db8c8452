"""What a result was measured on: machine, versions, date. Every result file records it."""

from __future__ import annotations

import datetime
import functools
import os
import platform


# The ISA features OpenSSL's AES-GCM picks its code path by: with VAES and VPCLMULQDQ on
# AVX-512 it runs 3-6x faster per core than with AES-NI alone, which moves every
# crypto-bound result here; "AMD EPYC" alone does not say which one a result ran on.
AES_FLAGS = ("aes", "pclmulqdq", "avx2", "avx512f", "vaes", "vpclmulqdq")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none); read
    once per process, since the model name, family and flags are all taken from it."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or "unknown"


def cpu_details() -> dict:
    """Family/model numbers and the AES-GCM-relevant ISA flags of this CPU, and the
    OpenSSL that ``cryptography`` runs on."""
    from cryptography.hazmat.backends.openssl.backend import backend

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {"cpu_family": info.get("cpu family"), "cpu_model_number": info.get("model"),
            "aes_flags": [f for f in AES_FLAGS if f in flags],
            "openssl": backend.openssl_version_text()}


def process_cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system (gloo's socket threads and
    the kernel's loopback copies included), to the microsecond (``os.times`` counts
    10 ms ticks)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoadMeter:
    """How loaded the machine was while something ran: the 1-, 5- and 15-minute load
    averages before and after, and the CPU seconds that processes other than this one and
    its (waited-for) children took meanwhile, of the ``cores`` x wall seconds there were.

    Example::

        meter = LoadMeter()
        subprocess.run(...)            # the measured launch, a child of this process
        meter.stop()                   # {"load_before": [...], "others_cpu_s": 3.1, ...}
    """

    def __init__(self) -> None:
        self.load_before = _loadavg()
        self.t0 = _monotonic()
        self.busy0 = _busy_cpu_seconds()
        self.own0 = _own_cpu_seconds()

    def stop(self) -> dict:
        wall = _monotonic() - self.t0
        busy, own = _busy_cpu_seconds(), _own_cpu_seconds()
        others = None if busy is None or self.busy0 is None else max(0.0, (busy - self.busy0) - (own - self.own0))
        cores = os.cpu_count() or 1
        return {"load_before": self.load_before, "load_after": _loadavg(), "cores": cores,
                "wall_s": round(wall, 2), "others_cpu_s": None if others is None else round(others, 2),
                "others_share": None if others is None or wall <= 0 else round(others / (wall * cores), 3)}


def _monotonic() -> float:
    import time

    return time.monotonic()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _busy_cpu_seconds() -> float | None:
    """CPU seconds every process on the machine has spent, all cores (not idle, not iowait)."""
    try:
        import psutil

        t = psutil.cpu_times()
    except Exception:  # no psutil or no /proc/stat: load averages alone
        return None
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_cpu_seconds() -> float:
    """This process and its waited-for descendants (torchrun and its ranks), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _gpus_in_use(torch) -> str:
    """The GPUs this process works on, by name, or that it uses none. Asked only where
    CUDA is already initialised here (a rank or a benchmark that ran on the GPU): a
    parent that initialised CUDA could no longer fork ranks that use it."""
    if not torch.cuda.is_initialized():
        return "none (CPU ranks over gloo)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{', '.join(sorted(set(names)))} ({len(names)} visible)"


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
        **cpu_details(),
        "gpu": _gpus_in_use(torch),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def aes_gcm_rate(nbytes: int = 4 << 20, reps: int = 20) -> dict:
    """This machine's AES-GCM rate now, as ``ccddp bench channel`` measures it: one thread,
    the secure channel sealing and opening ``nbytes`` messages; GB/s, with the date. CC-on
    cost on CPU ranks follows this rate, so every measurement states it."""
    from ccddp.bench.channel import bench_channel

    r = bench_channel(nbytes, reps)
    return {"bytes": r["bytes"], "reps": r["reps"], "seal_gbps": r["gbps"]["channel_seal"],
            "open_gbps": r["gbps"]["channel_open"],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def cuda_device_count() -> int:
    """CUDA devices this process may use, asked of the driver (libcuda) through ctypes,
    without importing torch: 0 where there is no driver, no device, or
    ``CUDA_VISIBLE_DEVICES`` hides them all. A command checks this before loading torch
    so a missing GPU is one line, not seconds of imports and a traceback.

    It initialises the driver in this process: call it only in a process that will not
    fork workers which use CUDA (a forked child cannot).

    Example::

        if cuda_device_count() == 0:
            raise ConfigError("--device cuda: no CUDA device here")
    """
    import ctypes

    for lib_name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(lib_name)
            break
        except OSError:
            continue
    else:
        return 0
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
