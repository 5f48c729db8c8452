"""The link channel on the Triton engine: the same frames as on OpenSSL (one link, and the
same all-reduce on two ranks, frame by frame on the wire), failures named as before, and
pads made once and used once (recorded, as nonces are).

CPU runs force the Triton engine on host buffers (its interpreter); CUDA runs hand the
channel device tensors, which pick the engine themselves.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
import torch

# Processes: each rank replaces os.urandom (process-wide) to replay its session's randomness.
from dist_util import run_ranks
from ccddp.crypto import TAG_BYTES, LinkChannel
from ccddp.crypto.device import PadEvent, interpreting, pad_bytes
from ccddp.errors import IntegrityError

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not interpreting(), reason="CPU tensors need Triton's interpreter; this process compiles for the GPU "
                                   "(run with TRITON_INTERPRET=1)")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
KEY = bytes(range(32))
SECRET_HEX = "1b381f94e9d1ccb69bd74da853ebc2d62903e75fa09bb19fe2d1450166562521"


def _channel(device: str, **kw) -> LinkChannel:
    """A channel whose frames go through the Triton engine on ``device``."""
    return LinkChannel(KEY, 7, "0->1", aead_engine="triton" if device == "cpu" else "auto", **kw)


def _buf(data: bytes, device: str):
    """Host buffers (numpy, as the collectives pass them) on CPU; tensors on CUDA."""
    arr = np.frombuffer(bytearray(data), dtype=np.uint8)
    return arr if device == "cpu" else torch.from_numpy(arr.copy()).to(device)


def _bytes(buf) -> bytes:
    return buf.tobytes() if isinstance(buf, np.ndarray) else buf.cpu().numpy().tobytes()


def _seal(ch: LinkChannel, data: bytes, aad: bytes, device: str) -> bytes:
    frame = _buf(bytes(len(data) + TAG_BYTES), device)
    ch.seal(_buf(data, device), frame, aad)
    return _bytes(frame)


def _open(ch: LinkChannel, frame: bytes, aad: bytes, device: str) -> bytes:
    out = _buf(b"\xaa" * (len(frame) - TAG_BYTES), device)
    ch.open(_buf(frame, device), out, aad)
    return _bytes(out)


@pytest.mark.parametrize("device", DEVICES)
def test_frames_equal_openssl_across_rotation_and_failures_are_named(device):
    openssl, triton_tx, triton_rx = LinkChannel(KEY, 7, "0->1", rotate_after=2), _channel(device, rotate_after=2), \
        _channel(device, rotate_after=2)
    for i, n in enumerate([0, 33, 1024, 5]):          # counters 0..3: two key epochs
        data, aad = os.urandom(n), b"aad%d" % i
        frame = _seal(triton_tx, data, aad, device)
        assert frame == _seal(openssl, data, aad, device if device == "cpu" else "cpu")
        assert _open(triton_rx, frame, aad, device) == data
    assert triton_tx.epoch == triton_rx.epoch == 1
    frame = bytearray(_seal(openssl, b"x" * 40, b"a", "cpu"))
    frame[3] ^= 1
    out = _buf(b"\xaa" * 40, device)
    with pytest.raises(IntegrityError) as err:
        triton_rx.open(_buf(bytes(frame), device), out, b"a", collective="all_reduce#3", step=2, segment=1)
    assert (err.value.link, err.value.collective, err.value.step, err.value.segment) == ("0->1", "all_reduce#3", 2, 1)
    assert _bytes(out) == bytes(40), "unverified plaintext left behind"
    with pytest.raises(IntegrityError, match="closed after an earlier failure"):
        _open(triton_rx, frame, b"a", device)


class Recorded:
    """A channel with pads of ``budget`` bytes whose nonces and pad events are recorded."""

    def __init__(self, device: str, budget: int, rotate_after: int = 3) -> None:
        self.nonces: list[tuple[bytes, bytes]] = []
        self.events: list[tuple[PadEvent, bytes, bytes]] = []
        self.channel = _channel(device, rotate_after=rotate_after, pad_budget=budget,
                                recorder=lambda k, n: self.nonces.append((k, n)),
                                pad_recorder=lambda e, k, n: self.events.append((e, k, n)))

    def pads(self, event: PadEvent) -> list[tuple[bytes, bytes]]:
        return [(k, n) for e, k, n in self.events if e is event]


def _duplicates(records) -> list:
    return [r for r, c in Counter(records).items() if c > 1]


@pytest.mark.parametrize("device", DEVICES)
def test_pads_are_made_once_and_used_once(device):
    """Seal and open 8 frames over 3 key epochs with pads of 2 frames per link: frames stay
    OpenSSL's, pads are used, a frame longer than its pad goes without one, and on each
    side no (key, nonce) pad is made or used twice, or used for a nonce it was not made for."""
    tx, rx = Recorded(device, 2 * pad_bytes(512)), Recorded(device, 2 * pad_bytes(512))
    openssl = LinkChannel(KEY, 7, "0->1", rotate_after=3)
    dev = torch.device(device)
    assert tx.channel.prepare_pads(512, dev) == rx.channel.prepare_pads(512, dev) == 2
    for i, n in enumerate([512, 500, 512, 900, 512, 512, 17, 512]):
        data, aad = os.urandom(n), b"%d" % i
        frame = _seal(tx.channel, data, aad, device)
        assert frame == _seal(openssl, data, aad, "cpu"), i
        assert _open(rx.channel, frame, aad, device) == data, i
    for side in (tx, rx):
        made, used = side.pads(PadEvent.MADE), side.pads(PadEvent.USED)
        assert _duplicates(made) == [] and _duplicates(used) == []
        assert set(used) <= set(made) and set(used) <= set(side.nonces)
        assert 4 <= len(used) < 8, "pads hardly used, or the 900-byte frame used a 512-byte pad"
    assert tx.nonces == rx.nonces


@pytest.mark.parametrize("device", DEVICES)
def test_a_pad_in_flight_is_not_overwritten(device):
    """A job that took its pad but has not run yet keeps it: refills after later frames
    must not write a new pad over its bytes (with a budget of two pads, the third pad
    would wrap onto the first)."""
    tx = Recorded(device, 2 * pad_bytes(256)).channel
    openssl = LinkChannel(KEY, 7, "0->1", rotate_after=3)
    tx.prepare_pads(256, torch.device(device))
    data = [os.urandom(256) for _ in range(3)]
    held = _buf(bytes(256 + TAG_BYTES), device)
    job = tx.seal_job(_buf(data[0], device), held, b"0")         # counter 0, pad 0, not run yet
    later = [_seal(tx, data[i], b"%d" % i, device) for i in (1, 2)]   # counters 1, 2 (and refills)
    job()
    assert _bytes(held) == _seal(openssl, data[0], b"0", "cpu")
    assert later == [_seal(openssl, data[i], b"%d" % i, "cpu") for i in (1, 2)]


def test_the_pad_check_can_fail():
    """Two channels with one key and link id (a reused session) make the same pads: the
    duplicates the test above looks for."""
    if not interpreting():
        pytest.skip("CPU tensors need Triton's interpreter; this process compiles for the GPU")
    events = []
    for _ in range(2):
        ch = _channel("cpu", pad_budget=2 * pad_bytes(64), pad_recorder=lambda e, k, n: events.append((e, k, n)))
        ch.prepare_pads(64, torch.device("cpu"))
    assert len(_duplicates(events)) == 2


# -- the same all-reduce on two ranks, OpenSSL vs Triton -----------------------------------
def _allreduce_rank(rank, n, engine):
    """One all-reduce; returns every frame this rank put on the wire and the result.

    Both engines must see the same keys, so the group's randomness (its session) is
    replayed from a seed: a test-only reuse of (key, nonce) pairs, which is the point."""
    import random

    import torch.distributed as dist

    from ccddp.bench.reference import all_reduce

    from ccddp.comm import CommSettings, SecureGroup
    from ccddp.comm.transport import Transport
    from ccddp.crypto import GroupSecret

    class Recording(Transport):
        def __init__(self, inner: Transport) -> None:
            super().__init__(inner.pg, inner.timeout.total_seconds(), downward=inner.downward)
            self.sent: list[bytes] = []

        def isend(self, frame, dst, tag=0):
            self.sent.append(frame.numpy().tobytes())
            return super().isend(frame, dst, tag)

    rng = random.Random(rank)
    real_urandom, os.urandom = os.urandom, lambda k: rng.randbytes(k)
    try:
        g = SecureGroup(CommSettings(timeout_s=60, segment_bytes=1024, chains=1, aead_engine=engine),
                        secret=GroupSecret.from_hex(SECRET_HEX), transport=Transport.open(None, 60))
    finally:
        os.urandom = real_urandom
    g.transport = Recording(g.transport)
    x = torch.arange(1001, dtype=torch.float32) * (rank + 1)     # 4004 bytes: 2002-byte chunks
    all_reduce(x, g)
    dist.barrier()
    g.close()
    return {"frames": g.transport.sent, "result": x.numpy().tobytes()}


def test_allreduce_frames_on_the_wire_are_the_same_with_either_engine():
    if not interpreting():
        pytest.skip("CPU tensors need Triton's interpreter; this process compiles for the GPU")
    openssl = run_ranks(_allreduce_rank, 2, "auto", timeout=300)
    triton = run_ranks(_allreduce_rank, 2, "triton", timeout=300)
    expected = (torch.arange(1001, dtype=torch.float32) * 3).numpy().tobytes()
    for rank in range(2):
        assert len(openssl[rank]["frames"]) >= 3                  # descriptor + 2 data segments, at least
        assert triton[rank]["frames"] == openssl[rank]["frames"], rank
        assert triton[rank]["result"] == openssl[rank]["result"] == expected


# -- the benchmark command -------------------------------------------------------------------
def test_bench_channel_on_cuda_measures_or_says_why_not(tmp_path, capsys):
    from ccddp.cli import main as cli_main

    path = tmp_path / "device.json"
    assert cli_main(["bench", "channel", "--device", "cuda", "--size", "1M", "--reps", "2",
                     "--json", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    if not torch.cuda.is_available():
        assert lines == ["ccddp bench channel --device cuda: no CUDA device here; nothing measured"]
        assert not path.exists()
        return
    import json

    rows = json.loads(path.read_text())["rows"]
    assert set(rows) == {"copy", "seal", "open", "seal_pad", "open_pad", "openssl_seal", "openssl_open"}
    assert all(r["gbps"] > 0 for r in rows.values())


def test_bench_channel_triton_on_cpu_is_a_labelled_correctness_check(tmp_path, capsys):
    if not interpreting():
        pytest.skip("CPU tensors need Triton's interpreter; this process compiles for the GPU")
    import json

    from ccddp.cli import main as cli_main

    path = tmp_path / "cpu.json"
    assert cli_main(["bench", "channel", "--device", "cpu", "--engine", "triton", "--size", "3000",
                     "--json", str(path)]) == 0
    assert capsys.readouterr().out.startswith("correctness-only (Triton interpreter on CPU, not a speed)")
    result = json.loads(path.read_text())
    assert result["label"].startswith("correctness-only") and result["checked_frames"] == 2
