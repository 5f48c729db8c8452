"""The bounce path (CPU TEE -> sealed staging buffer -> device): batches round-trip, a
changed frame is refused, and two paths given the same key never seal under the same
(key, nonce) pair."""

from __future__ import annotations

import os

import pytest
import torch

from ccddp.bench.bounce import BouncePath
from ccddp.errors import ConfigError, IntegrityError

KEY = bytes(range(32))
SESSION = b"s" * 16


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(4, 8, generator=g), "y": torch.randint(0, 10, (4,), generator=g),
            "empty": torch.empty(0)}


def _frames(staged) -> dict[str, bytes]:
    return {name: st.frame.numpy().tobytes() for name, st in staged.items()}


def test_batches_round_trip():
    path = BouncePath(KEY, session_id=SESSION)
    for seed in range(3):
        batch = _batch(seed)
        got = path.receive(path.stage(batch))
        assert set(got) == set(batch)
        for name, t in batch.items():
            assert torch.equal(got[name], t) and got[name].dtype == t.dtype


def test_a_changed_frame_is_refused():
    path = BouncePath(KEY, session_id=SESSION)
    staged = path.stage(_batch())
    staged["x"].frame[3] ^= 1
    with pytest.raises(IntegrityError, match="cpu->device"):
        path.receive(staged)


def test_two_paths_with_the_same_key_seal_differently():
    """The same key, session and batch: were the paths to seal under the given key, both
    would take counter 0 and write the same frames -- a repeated (key, nonce) pair. Each
    seals under a key of its own, so the frames differ; each opens its own batch, and
    neither opens the other's."""
    a, b = BouncePath(KEY, session_id=SESSION), BouncePath(KEY, session_id=SESSION)
    batch = _batch()
    sa, sb = a.stage(batch), b.stage(batch)
    fa, fb = _frames(sa), _frames(sb)
    for name in batch:
        assert fa[name] != fb[name], name
    got = a.receive(sa)
    assert all(torch.equal(got[k], v) for k, v in batch.items())
    with pytest.raises(IntegrityError):
        b.receive(sa)         # a frame of path a in path b, at the counter it expects
    c = BouncePath(KEY, session_id=SESSION)
    c.stage(batch)
    with pytest.raises(IntegrityError):
        c.receive(sb)


def test_bad_arguments_are_typed():
    with pytest.raises(ConfigError, match="32-byte key"):
        BouncePath(KEY[:16], session_id=SESSION)
    with pytest.raises(ConfigError, match="session id"):
        BouncePath(KEY, session_id=bytes(16))
    BouncePath(os.urandom(32), session_id=SESSION)


# -- the device opener: OpenSSL seals on the host, the ciphertext is copied, Triton opens ---------
# CPU runs force the device opener on CPU tensors (Triton's interpreter); CUDA runs use the GPU,
# with pinned staging buffers and a copy stream.

import struct  # noqa: E402

from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

import ccddp.bench.bounce as bounce_module  # noqa: E402
from ccddp.bench.bounce import EMULATION_NOTE, INTERPRETER_NOTE, Opener  # noqa: E402
from ccddp.crypto import FrameContext, Op, Phase  # noqa: E402
from ccddp.crypto.device import DeviceAESGCM, interpreting  # noqa: E402
from ccddp.crypto.keys import _hkdf  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not interpreting(), reason="CPU tensors need Triton's interpreter; this process compiles for the GPU "
                                   "(run with TRITON_INTERPRET=1)")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
]


def _device_path(device: str) -> BouncePath:
    return BouncePath(KEY, session_id=SESSION, device=device, opener="device")


def _copied(device: str) -> None:
    """Wait for the copies in flight: the test reads or changes a device frame outside the
    stream order the path itself keeps."""
    if device == "cuda":
        torch.cuda.synchronize()


def _equal_on(device: str, got: dict, batch: dict) -> None:
    assert set(got) == set(batch)
    for name, t in batch.items():
        assert got[name].device.type == device and got[name].dtype == t.dtype, name
        assert torch.equal(got[name].cpu(), t), name


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_opener_returns_the_batch_through_the_triton_engine(device, monkeypatch):
    opened = []
    real = DeviceAESGCM.decrypt_into

    def spy(self, nonce, data, aad, buf):
        opened.append(data.device.type)
        return real(self, nonce, data, aad, buf)

    monkeypatch.setattr(DeviceAESGCM, "decrypt_into", spy)
    path = _device_path(device)
    assert path.opener is Opener.DEVICE
    host = BouncePath(KEY, session_id=SESSION, device=device, opener="host")
    for k in range(2):
        batch = _batch(k)
        _equal_on(device, path.receive(path.stage(batch)), batch)
        _equal_on(device, host.receive(host.stage(batch)), batch)
    assert opened == [device] * 2 * len(_batch()), "every tensor of the device opener's batches, on the device"


@pytest.mark.parametrize("device", DEVICES)
def test_device_frames_are_openssl_frames_byte_for_byte(device, monkeypatch):
    """The loader's frames, the copies the device opens and the Triton engine's own seal of
    the same tensor are all the bytes OpenSSL writes under the path's key, nonce and AAD."""
    salt = bytes(range(100, 132))
    monkeypatch.setattr(bounce_module, "_fresh_salt", lambda: salt)
    own = _hkdf(KEY, salt, bounce_module._LABEL)
    path = _device_path(device)
    openssl, engine = AESGCM(own), DeviceAESGCM(own)
    counter = 0
    for b in range(2):
        batch = _batch(b)
        staged = path.send(path.stage(batch))
        _copied(device)
        for i, (name, t) in enumerate(sorted(batch.items())):
            plain = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            nonce = struct.pack(">IQ", bounce_module._BOUNCE_LINK, counter)
            aad = FrameContext(SESSION, b, Op.BOUNCE, Phase.NONE, 0, i, 0, 0, len(plain),
                               str(t.dtype).removeprefix("torch.")).pack()
            expected = openssl.encrypt(nonce, plain, aad)
            st = staged[name]
            assert st.frame.numpy().tobytes() == expected, name
            assert st.device_frame.device.type == device and st.device_frame.cpu().numpy().tobytes() == expected
            mine = torch.empty(len(expected), dtype=torch.uint8, device=device)
            engine.encrypt_into(nonce, torch.frombuffer(bytearray(plain) + b"\0", dtype=torch.uint8)[:len(plain)]
                                .to(device), aad, mine)
            assert mine.cpu().numpy().tobytes() == expected, name
            counter += 1
        _equal_on(device, path.receive(staged), batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["host staging buffer", "device copy"])
def test_a_tampered_frame_is_refused_on_the_device(device, where):
    path = _device_path(device)
    staged = path.stage(_batch())
    if where == "host staging buffer":
        staged["x"].frame[5] ^= 1           # the host controls the bounce buffer
        path.send(staged)
    else:
        path.send(staged)
        _copied(device)
        staged["x"].device_frame[5] ^= 1    # ... and the bytes on their way
    with pytest.raises(IntegrityError, match="cpu->device") as err:
        path.receive(staged)
    assert err.value.collective == "bounce" and err.value.step == 0
    assert path.batches_opened == 0 and path.phases.batches == 0
    with pytest.raises(IntegrityError, match="closed after an earlier failure"):
        path.receive(path.stage(_batch(1)))


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_sends_the_next_batch_before_this_one_is_used(device):
    path = _device_path(device)
    batches = [_batch(k) for k in range(4)]
    seen = 0
    for i, got in enumerate(path.prefetch(batches)):
        # Batch i is in the consumer's hands: batch i+1 is sealed and on its way.
        assert path.batches_opened == i + 1
        assert path.batches_staged == path.batches_sent == min(i + 2, len(batches))
        _equal_on(device, got, batches[i])
        seen += 1
    assert seen == len(batches)
    # A consumer that stops early: the batch sealed ahead is opened and dropped, so the
    # path stays in step for what comes next.
    it = path.prefetch(batches)
    next(it)
    it.close()
    assert path.batches_opened == path.batches_staged == 6
    _equal_on(device, path.receive(path.stage(batches[3])), batches[3])


@pytest.mark.parametrize("device", DEVICES)
def test_each_stage_is_its_own_recorded_phase(device):
    path = _device_path(device)
    before = path.phases.snapshot()
    for _ in path.prefetch([_batch(k) for k in range(3)]):
        pass
    got = path.phases.diff(path.phases.snapshot(), before)
    assert got["batches"] == 3
    assert got["seal_s"] > 0 and got["copy_s"] > 0 and got["open_s"] > 0, got
    assert path.counters.seals == path.counters.opens == 3 * len(_batch())
    d = path.describe()
    assert (d["opener"], d["seal_engine"], d["open_engine"]) == ("device", "openssl", "triton")
    assert d["note"] == (EMULATION_NOTE if device == "cuda" else INTERPRETER_NOTE)
    assert "emulation" in EMULATION_NOTE and "without confidential computing" in EMULATION_NOTE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_on_cuda_the_staging_is_pinned_and_the_copy_has_its_own_stream():
    path = _device_path("cuda")
    staged = path.send(path.stage(_batch()))
    assert all(st.frame.is_pinned() and st.device_frame.is_cuda for st in staged.values())
    assert path.describe()["copy_stream"] and path.describe()["pinned_staging"]
    _equal_on("cuda", path.receive(staged), _batch())
    assert BouncePath(KEY, session_id=SESSION, device="cuda").opener is Opener.DEVICE


def test_the_cpu_default_is_unchanged_and_opener_choices_are_checked():
    path = BouncePath(KEY, session_id=SESSION)
    assert path.opener is Opener.HOST and "note" not in path.describe()
    staged = path.stage(_batch())
    assert all(st.device_frame is None for st in staged.values())
    path.receive(staged)
    assert path.phases.batches == 1 and path.phases.copy_s == pytest.approx(0.0, abs=1e-3)
    with pytest.raises(ConfigError, match="opener must be one of"):
        BouncePath(KEY, session_id=SESSION, opener="gpu")
    with pytest.raises(ConfigError, match="only the device opener"):
        path.send(path.stage(_batch()))
    with pytest.raises(ConfigError, match="host tensors"):
        path.stage({"x": torch.zeros(2, device="meta")})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device exists")
def test_a_gpu_path_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        BouncePath(KEY, session_id=SESSION, device="cuda")
