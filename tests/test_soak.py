"""Soak: 2,000 consecutive secure all-reduces of mixed sizes on 2 ranks. Every result is
exact, and after warm-up the process does not grow: no new threads, no new open file
descriptors, and resident memory within RSS_BOUND_MB of where it stood."""

from __future__ import annotations

import pytest

from _security_util import spawn, values

ITERATIONS = 2000
WARMUP = 200
RSS_BOUND_MB = 16     # stated bound: buffers are reused, so growth is allocator noise
SIZES = [1, 3, 255, 1024, 4097, 16384, 40001, 7, 100]


def _resources() -> dict:
    import os

    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")),
            "rss_mb": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20}


SECRET = bytes.fromhex("6c500176bc685ebc511853fb1ef0672399cf38e0db29c951970ba467e8140e96")


def _soak_rank(rank, n, iterations, warmup):
    import gc
    import time

    import torch

    from ccddp.bench.reference import all_reduce

    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.keys import GroupSecret

    g = SecureGroup(CommSettings(segment_bytes=16384, chains=2, timeout_s=30), GroupSecret(SECRET),
                    transport=Transport.open(None, 30))
    expect = {m: ((torch.arange(m) % 5) * n + n * (n + 1) / 2).float() for m in SIZES}
    wrong, samples, t0 = 0, [], time.monotonic()
    for i in range(iterations):
        m = SIZES[(i * 7 + i // len(SIZES)) % len(SIZES)]
        x = ((torch.arange(m) % 5) + rank + 1).float()
        all_reduce(x, g)
        wrong += int(not torch.equal(x, expect[m]))
        if i + 1 == warmup or (i + 1 > warmup and (i + 1) % 200 == 0):
            gc.collect()
            samples.append({"iteration": i + 1, **_resources()})
    seconds = time.monotonic() - t0
    counters = g.counters.snapshot()
    g.close()
    return {"wrong": wrong, "samples": samples, "seconds": seconds, "seals": counters["seals"],
            "exchanges": counters["exchanges"]}


@pytest.mark.timeout(300)
def test_two_thousand_all_reduces_do_not_leak():
    res = values(spawn(_soak_rank, 2, ITERATIONS, WARMUP, timeout=280, pg_timeout=60))
    for rank, r in enumerate(res):
        assert r["wrong"] == 0, f"rank {rank}: {r['wrong']} wrong results"
        # 2(n-1) per ring all-reduce, n-1 per two-rank exchange (issue 42): every call really ran.
        assert r["seals"] == 2 * ITERATIONS - r["exchanges"]
        base, last = r["samples"][0], r["samples"][-1]
        assert last["iteration"] == ITERATIONS
        trail = [(s["threads"], s["fds"], round(s["rss_mb"], 1)) for s in r["samples"]]
        assert max(s["threads"] for s in r["samples"]) == base["threads"], f"rank {rank} threads grew: {trail}"
        assert max(s["fds"] for s in r["samples"]) == base["fds"], f"rank {rank} descriptors grew: {trail}"
        assert last["rss_mb"] - base["rss_mb"] < RSS_BOUND_MB, f"rank {rank} memory grew: {trail}"
