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
        "gpu": "none (CPU ranks over gloo)",
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
