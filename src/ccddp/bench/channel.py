"""``ccddp bench channel``: does the secure channel add Python overhead to AES-GCM?

Times ``LinkChannel.seal``/``open`` against raw ``AESGCM.encrypt_into``/``decrypt_into``
on the same buffers, interleaved (raw, channel, raw, channel, ...) so that drift in the
machine's speed hits both alike; reports medians and the ratio.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase


def bench_channel(nbytes: int = 4 << 20, reps: int = 40) -> dict:
    key = os.urandom(32)
    data = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
    frame = np.empty(nbytes + TAG_BYTES, dtype=np.uint8)
    out = np.empty(nbytes, dtype=np.uint8)
    raw = AESGCM(key)
    nonce = os.urandom(12)
    tx = LinkChannel(key, 1, "bench", rotate_after=1 << 62)
    rx = LinkChannel(key, 1, "bench", rotate_after=1 << 62)
    times = {"raw_seal": [], "channel_seal": [], "raw_open": [], "channel_open": []}
    for i in range(reps + 2):
        aad = FrameContext(b"\0" * 16, i, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, nbytes, "float32").pack()
        # Alternate which goes first, so cache and frequency effects fall on both.
        for which in (("raw", "channel") if i % 2 else ("channel", "raw")):
            t0 = time.perf_counter()
            if which == "raw":
                raw.encrypt_into(nonce, data, aad, frame)
            else:
                tx.seal(data, frame, aad)
            t1 = time.perf_counter()
            if which == "raw":
                raw.decrypt_into(nonce, frame, aad, out)
            else:
                rx.open(frame, out, aad)
            t2 = time.perf_counter()
            if i >= 2:
                times[f"{which}_seal"].append(t1 - t0)
                times[f"{which}_open"].append(t2 - t1)
    med = {k: statistics.median(v) for k, v in times.items()}
    gbps = {k: nbytes / v / 1e9 for k, v in med.items()}
    return {"bytes": nbytes, "reps": reps, "median_s": med, "gbps": gbps,
            "seal_ratio": gbps["channel_seal"] / gbps["raw_seal"],
            "open_ratio": gbps["channel_open"] / gbps["raw_open"]}
