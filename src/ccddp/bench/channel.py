"""``ccddp bench channel``: what AES-GCM costs at the channel.

On the host (:func:`bench_channel`): does the secure channel add Python overhead? Times
``LinkChannel.seal``/``open`` against raw ``AESGCM.encrypt_into``/``decrypt_into`` on the
same buffers, interleaved (raw, channel, raw, channel, ...) so that drift in the
machine's speed hits both alike; reports medians and the ratio.

On a device (:func:`bench_device`): GB/s of the Triton engine, with and without pads,
against a device-to-device copy and OpenSSL on the host.
"""

from __future__ import annotations

import os
import statistics
import struct
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
            "open_ratio": gbps["channel_open"] / gbps["raw_open"],
            # The channel's rate over raw's, repetition by repetition (they ran back to back
            # in each): Hodges-Lehmann estimate and 95 % interval, [estimate, low, high, n].
            "seal_ratio_interval": _paired(times["raw_seal"], times["channel_seal"]),
            "open_ratio_interval": _paired(times["raw_open"], times["channel_open"])}


def _paired(raw: list[float], channel: list[float]) -> list:
    """Rate of the channel over raw AES-GCM (raw's time / the channel's) per repetition, as
    ``[estimate, low, high, n]`` (low and high None with too few repetitions)."""
    from ccddp.stats import paired_ratio

    iv = paired_ratio(dict(enumerate(raw)), dict(enumerate(channel)))
    return [iv.estimate, iv.low, iv.high, iv.n] if iv else [None, None, None, 0]


def _stats(seconds: list[float], nbytes: int) -> dict:
    rates = sorted(nbytes / s / 1e9 for s in seconds)
    return {"median_s": statistics.median(seconds), "gbps": statistics.median(rates),
            "gbps_min": rates[0], "gbps_max": rates[-1]}


def bench_device(nbytes: int = 64 << 20, reps: int = 20, device: str = "cuda") -> dict:
    """GB/s of the Triton AES-GCM engine on ``device`` tensors: seal and open, without and
    with pads (keystream generated before the timed call), against a device-to-device copy
    of the same bytes and against OpenSSL (one thread) on host memory. The variants take
    turns every repetition, in rotating order; each timed call is fenced by a device
    synchronize. Every repetition's frames are checked: the device frame must equal
    OpenSSL's and open back to the data.

    Example::

        r = bench_device(64 << 20, reps=20)
        r["rows"]["seal"]["gbps"], r["rows"]["copy"]["gbps"]
    """
    import torch

    from ccddp.crypto.device import DeviceAESGCM, Segment, pad_bytes

    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    key = os.urandom(32)
    aead, openssl = DeviceAESGCM(key), AESGCM(key)
    host_data = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
    host_frame = np.empty(nbytes + TAG_BYTES, dtype=np.uint8)
    host_out = np.empty(nbytes, dtype=np.uint8)
    data = torch.from_numpy(host_data.copy()).to(dev)
    copy = torch.empty_like(data)
    frame = torch.empty(nbytes + TAG_BYTES, dtype=torch.uint8, device=dev)
    out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    pad_tx = torch.empty(max(16, pad_bytes(nbytes)), dtype=torch.uint8, device=dev)
    pad_rx = torch.empty_like(pad_tx)
    aad = FrameContext(b"\0" * 16, 0, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, nbytes, "float32").pack()

    def seg(nonce: bytes) -> list[Segment]:
        return [Segment(nonce, aad, 0, nbytes, 0, pad_offset=0)]

    def nonce(i: int, variant: int) -> bytes:
        return struct.pack(">IQ", variant, i)           # never twice under this key

    times: dict[str, list[float]] = {k: [] for k in ("copy", "seal", "open", "seal_pad", "open_pad",
                                                        "openssl_seal", "openssl_open")}
    checked = 0

    def timed(name: str, fn, keep: bool) -> None:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if keep:
            times[name].append(time.perf_counter() - t0)

    def plain_pair(i: int, keep: bool) -> None:
        nonlocal checked
        n = nonce(i, 1)
        timed("seal", lambda: aead.encrypt_into(n, data, aad, frame), keep)
        timed("open", lambda: aead.decrypt_into(n, frame, aad, out), keep)
        openssl.encrypt_into(n, host_data, aad, host_frame)
        if frame.cpu().numpy().tobytes() != host_frame.tobytes() or not torch.equal(out, data):
            raise AssertionError("the device frame differs from OpenSSL's or does not open to the data")
        checked += 1

    def pad_pair(i: int, keep: bool) -> None:
        n = nonce(i, 2)
        aead.keystream_segments(seg(n), pad_tx)      # untimed: made while idle
        aead.keystream_segments(seg(n), pad_rx)
        timed("seal_pad", lambda: aead.encrypt_segments(seg(n), data, frame, pad=pad_tx), keep)
        timed("open_pad", lambda: aead.decrypt_segments(seg(n), frame, out, pad=pad_rx), keep)
        if not torch.equal(out, data):
            raise AssertionError("a frame sealed with a pad does not open to the data")

    def openssl_pair(i: int, keep: bool) -> None:
        n = nonce(i, 3)
        timed("openssl_seal", lambda: openssl.encrypt_into(n, host_data, aad, host_frame), keep)
        timed("openssl_open", lambda: openssl.decrypt_into(n, host_frame, aad, host_out), keep)

    groups = [lambda i, keep: timed("copy", lambda: copy.copy_(data), keep), plain_pair, pad_pair, openssl_pair]
    for i in range(reps + 1):                 # the first round compiles and warms up, untimed
        for g in range(len(groups)):
            groups[(g + i) % len(groups)](i, i > 0)
    rows = {name: _stats(ts, nbytes) for name, ts in times.items()}
    for row in rows.values():
        row["vs_copy"] = row["gbps"] / rows["copy"]["gbps"]
    return {"bytes": nbytes, "reps": reps, "device": str(dev), "checked_frames": checked, "rows": rows}
