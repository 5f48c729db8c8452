"""The Triton AES-256-GCM engine: NIST CAVP vectors, byte-identical frames with OpenSSL
(``cryptography``'s AESGCM) for any length, tampering caught with the output zeroed,
batches equal to one-by-one, pads equal to computed keystream.

Every test runs on CPU tensors through Triton's interpreter (each CI run) and on CUDA
tensors where a GPU exists; the interpreter is slow, so sizes are small except where a
path needs more (several GHASH tiles).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _gcm_vectors import gcm_vectors
from ccddp.crypto.device import DeviceAESGCM, Segment, interpreting, pad_bytes
from ccddp.crypto.device.engine import TILE_BLOCKS_INTERPRETED
from dist_util import child_env

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not interpreting(), reason="CPU tensors need Triton's interpreter; this process compiles for the GPU "
                                   "(run with TRITON_INTERPRET=1)")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


def u8(data: bytes, device: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
        torch.empty(0, dtype=torch.uint8, device=device)


def host(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


def seal(aead: DeviceAESGCM, nonce: bytes, data: bytes, aad: bytes, device: str) -> bytes:
    frame = torch.empty(len(data) + 16, dtype=torch.uint8, device=device)
    aead.encrypt_into(nonce, u8(data, device), aad, frame)
    return host(frame)


def open_(aead: DeviceAESGCM, nonce: bytes, frame: bytes, aad: bytes, device: str, fill: int = 0xAA) -> bytes:
    out = torch.full((len(frame) - 16,), fill, dtype=torch.uint8, device=device)
    try:
        aead.decrypt_into(nonce, u8(frame, device), aad, out)
    except InvalidTag:
        assert host(out) == bytes(len(frame) - 16), "unverified or stale bytes left in the output"
        raise
    return host(out)


# -- NIST CAVP ---------------------------------------------------------------------
def _one_per_shape(vectors):
    seen = {}
    for v in vectors:
        seen.setdefault((v.shape, v.pt is None), v)
    return list(seen.values())


ENCRYPT = _one_per_shape(gcm_vectors("gcmEncryptExtIV256.rsp"))
DECRYPT = _one_per_shape(v for v in gcm_vectors("gcmDecrypt256.rsp") if len(v.tag) == 16)


def _shape_id(v) -> str:
    pt, aad, tag = v.shape
    return f"pt{pt}-aad{aad}-tag{tag}" + ("-fail" if v.pt is None else "")


def _fast_tier_split(vectors):
    """One vector per (plaintext, AAD) length -- the kernel's paths: whole and partial
    blocks of each -- runs in the fast tier, the one with the longest tag; the others
    differ only in how much of the tag the file keeps, and run in the whole suite."""
    longest = {}
    for v in vectors:
        key = v.shape[:2]
        if key not in longest or v.shape[2] > longest[key].shape[2]:
            longest[key] = v
    return [pytest.param(v, id=_shape_id(v), marks=() if longest[v.shape[:2]] is v else pytest.mark.exhaustive)
            for v in vectors]


def test_every_vector_shape_is_covered():
    """Every (plaintext, AAD, tag) length present in the files; both outcomes of decryption."""
    assert len(ENCRYPT) == 175 == len({v.shape for v in gcm_vectors("gcmEncryptExtIV256.rsp")})
    assert {v.shape for v in DECRYPT if v.pt is None} == {v.shape for v in DECRYPT if v.pt is not None}
    assert len(DECRYPT) == 50


def test_the_fast_tier_seals_every_plaintext_and_aad_length():
    fast = [p.values[0] for p in _fast_tier_split(ENCRYPT) if not p.marks]
    assert sorted(v.shape[:2] for v in fast) == sorted({v.shape[:2] for v in ENCRYPT}) and len(fast) == 25
    assert {v.shape[2] for v in fast} == {128}, "the full tag, not a file's truncated one"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vec", _fast_tier_split(ENCRYPT))
def test_nist_encrypt(vec, device):
    """Ciphertext and tag of every shape; a truncated-tag vector's tag is a prefix of ours."""
    frame = seal(DeviceAESGCM(vec.key), vec.iv, vec.pt, vec.aad, device)
    assert frame[:-16] == vec.ct
    assert frame[-16:][:len(vec.tag)] == vec.tag


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vec", DECRYPT, ids=_shape_id)
def test_nist_decrypt(vec, device):
    """128-bit tags (the engine, like AESGCM, opens only full tags): the plaintext, or
    InvalidTag with the output zeroed for a vector marked FAIL."""
    aead = DeviceAESGCM(vec.key)
    if vec.pt is None:
        with pytest.raises(InvalidTag):
            open_(aead, vec.iv, vec.ct + vec.tag, vec.aad, device)
    else:
        assert open_(aead, vec.iv, vec.ct + vec.tag, vec.aad, device) == vec.pt


# -- against OpenSSL -----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32), nonce=st.binary(min_size=12, max_size=12),
       aad=st.binary(max_size=100),
       nbytes=st.one_of(st.integers(0, 64 << 10), st.sampled_from([0, 1, 15, 16, 17, 64 << 10])),
       seed=st.integers(0, 2**32 - 1))
def test_frames_are_byte_identical_to_openssl(device, key, nonce, aad, nbytes, seed):
    data = random.Random(seed).randbytes(nbytes)
    aead, ref = DeviceAESGCM(key), AESGCM(key)
    frame = seal(aead, nonce, data, aad, device)
    assert frame == ref.encrypt(nonce, data, aad)
    # Cross-open: OpenSSL's frame on the device engine, the device frame on OpenSSL.
    assert open_(aead, nonce, ref.encrypt(nonce, data, aad), aad, device) == data
    assert ref.decrypt(nonce, frame, aad) == data


@pytest.mark.parametrize("device", DEVICES)
def test_several_ghash_tiles(device):
    """A frame longer than one tile of the interpreter's GHASH pass (3 tiles), so tile
    sums are combined with H^(qB); the same frame is many tiles on a GPU."""
    key, nonce, aad = os.urandom(32), os.urandom(12), os.urandom(45)
    data = os.urandom(2 * 16 * TILE_BLOCKS_INTERPRETED + 1000)
    aead, ref = DeviceAESGCM(key), AESGCM(key)
    frame = seal(aead, nonce, data, aad, device)
    assert frame == ref.encrypt(nonce, data, aad)
    assert open_(aead, nonce, frame, aad, device) == data


# -- tampering -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["ciphertext-first", "ciphertext-last", "tag-first", "tag-last", "aad", "nonce"])
def test_flipped_bit_fails_with_output_zeroed(device, where):
    key, nonce, aad = os.urandom(32), os.urandom(12), os.urandom(20)
    data = os.urandom(100)
    aead = DeviceAESGCM(key)
    frame = bytearray(seal(aead, nonce, data, aad, device))
    nonce_, aad_ = bytearray(nonce), bytearray(aad)
    target, index = {"ciphertext-first": (frame, 0), "ciphertext-last": (frame, 99), "tag-first": (frame, 100),
                     "tag-last": (frame, 115), "aad": (aad_, 7), "nonce": (nonce_, 11)}[where]
    target[index] ^= 0x10
    with pytest.raises(InvalidTag):
        open_(aead, bytes(nonce_), bytes(frame), bytes(aad_), device)


@pytest.mark.parametrize("device", DEVICES)
def test_wrong_sizes_are_refused(device):
    aead = DeviceAESGCM(bytes(32))
    data = torch.zeros(10, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError):
        aead.encrypt_into(bytes(12), data, b"", torch.empty(25, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError):
        aead.encrypt_into(bytes(11), data, b"", torch.empty(26, dtype=torch.uint8, device=device))
    with pytest.raises(TypeError):
        aead.encrypt_into(bytes(12), data.float(), b"", torch.empty(26, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError):
        DeviceAESGCM(bytes(16))


# -- batches and pads ----------------------------------------------------------------------
LENGTHS = [0, 1, 15, 16, 17, 1000, 4099]


def _batch(lengths, frames: bool):
    """Segments laid end to end: inputs (plaintexts, or frames) and outputs."""
    segs, off, out = [], 0, 0
    for i, n in enumerate(lengths):
        segs.append(Segment(os.urandom(12), os.urandom(i * 7), off, n, out))
        off += n + (16 if frames else 0)
        out += n + (0 if frames else 16)
    return segs, off, out


@pytest.mark.parametrize("device", DEVICES)
def test_batch_equals_one_by_one_and_fails_per_segment(device):
    key = os.urandom(32)
    aead, ref = DeviceAESGCM(key), AESGCM(key)
    segs, total_in, total_out = _batch(LENGTHS, frames=False)
    data = os.urandom(total_in)
    out = torch.empty(total_out, dtype=torch.uint8, device=device)
    aead.encrypt_segments(segs, u8(data, device), out)
    frames = host(out)
    for s in segs:
        one = seal(aead, s.nonce, data[s.offset:s.offset + s.length], s.aad, device)
        assert frames[s.out_offset:s.out_offset + s.length + 16] == one
        assert one == ref.encrypt(s.nonce, data[s.offset:s.offset + s.length], s.aad)
    # Open them as one batch, with segment 4's tag altered: only it fails and is zeroed.
    opened = [Segment(s.nonce, s.aad, s.out_offset, s.length, s.offset) for s in segs]
    tampered = bytearray(frames)
    tampered[segs[4].out_offset + segs[4].length] ^= 1
    plain = torch.full((total_in,), 0xAA, dtype=torch.uint8, device=device)
    assert aead.decrypt_segments(opened, u8(frames, device), plain) == [True] * len(segs)
    assert host(plain) == data
    plain.fill_(0xAA)
    with pytest.raises(InvalidTag) as err:
        aead.decrypt_segments(opened, u8(bytes(tampered), device), plain)
    assert err.value.failed == [4]
    got, s4 = host(plain), segs[4]
    assert got[s4.offset:s4.offset + s4.length] == bytes(s4.length)
    assert got[:s4.offset] + got[s4.offset + s4.length:] == data[:s4.offset] + data[s4.offset + s4.length:]


@pytest.mark.parametrize("device", DEVICES)
def test_pads_give_the_same_frames(device):
    """Keystream generated ahead (pads) seals and opens exactly like computed keystream;
    a pad made for a longer message serves a shorter one."""
    key = os.urandom(32)
    aead, ref = DeviceAESGCM(key), AESGCM(key)
    lengths = [0, 17, 1000]
    segs, total_in, total_out = _batch(lengths, frames=False)
    offsets = [0]
    for s in segs:
        offsets.append(offsets[-1] + pad_bytes(s.length + 40))
    segs = [Segment(s.nonce, s.aad, s.offset, s.length, s.out_offset, offsets[i]) for i, s in enumerate(segs)]
    pad = torch.empty(offsets[-1], dtype=torch.uint8, device=device)
    aead.keystream_segments([Segment(s.nonce, b"", 0, s.length + 40, 0, s.pad_offset) for s in segs], pad)
    data = os.urandom(total_in)
    out = torch.empty(total_out, dtype=torch.uint8, device=device)
    aead.encrypt_segments(segs, u8(data, device), out, pad=pad)
    frames = host(out)
    for s in segs:
        assert frames[s.out_offset:s.out_offset + s.length + 16] == ref.encrypt(
            s.nonce, data[s.offset:s.offset + s.length], s.aad)
    opened = [Segment(s.nonce, s.aad, s.out_offset, s.length, s.offset, s.pad_offset) for s in segs]
    plain = torch.empty(total_in, dtype=torch.uint8, device=device)
    aead.decrypt_segments(opened, out, plain, pad=pad)
    assert host(plain) == data


# -- without Triton, and CPU tensors in a compiled process ------------------------------------
def _run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=child_env(env), timeout=120)


def test_without_triton_host_channels_work_and_the_engine_says_what_to_install():
    r = _run_python("""
        import sys
        sys.modules["triton"] = None          # as if it were not installed
        from ccddp.crypto import LinkChannel
        from ccddp.errors import ConfigError
        tx, rx = LinkChannel(bytes(32), 1, "a"), LinkChannel(bytes(32), 1, "a")
        frame, out = bytearray(21), bytearray(5)
        tx.seal(b"hello", frame, b"")
        rx.open(bytes(frame), out, b"")
        assert bytes(out) == b"hello"
        try:
            LinkChannel(bytes(32), 1, "a", aead_engine="triton").seal(b"hello", bytearray(21), b"")
        except ConfigError as e:
            print("ERROR:", e)
    """, {})
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("ERROR:") and "pip install 'ccddp[gpu]'" in line and "\n" not in line


def test_cpu_tensors_in_a_compiled_process_get_a_one_line_error():
    r = _run_python("""
        import torch
        from ccddp.crypto.device import DeviceAESGCM
        from ccddp.errors import ConfigError
        try:
            DeviceAESGCM(bytes(32)).encrypt_into(bytes(12), torch.zeros(4, dtype=torch.uint8), b"",
                                                 torch.empty(20, dtype=torch.uint8))
        except ConfigError as e:
            print("ERROR:", e)
    """, {"TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("ERROR:") and "TRITON_INTERPRET=1" in line and "\n" not in line


# -- what the kernels can index ---------------------------------------------------------------
def test_a_segment_the_kernels_cannot_index_is_refused_before_any_launch():
    """ctr_open and keystream index a segment's bytes in int32: a longer segment is a
    ConfigError naming the limit; one of exactly the limit passes that check (and then
    meets the tensors' bounds, so nothing of 2 GiB is allocated here)."""
    from ccddp.crypto.device.engine import MAX_SEGMENT_BYTES
    from ccddp.errors import ConfigError

    assert MAX_SEGMENT_BYTES + 16 * TILE_BLOCKS_INTERPRETED - 1 <= 2**31 - 1   # last byte of a last tile
    aead = DeviceAESGCM(bytes(32))
    small = torch.zeros(64, dtype=torch.uint8)
    too_long = Segment(bytes(12), b"", 0, MAX_SEGMENT_BYTES + 1, 0, 0)
    for call in (lambda s: aead.encrypt_segments([s], small, small.clone()),
                 lambda s: aead.decrypt_segments([s], small, small.clone()),
                 lambda s: aead.keystream_segments([s], small.clone())):
        with pytest.raises(ConfigError, match=f"at most {MAX_SEGMENT_BYTES} bytes"):
            call(too_long)
        with pytest.raises(ValueError, match="outside") as e:
            call(Segment(bytes(12), b"", 0, MAX_SEGMENT_BYTES, 0, 0))
        assert not isinstance(e.value, ConfigError)


def test_a_launch_with_more_segments_than_a_grid_axis_is_refused():
    """A launch's segments are the second grid axis (CUDA: at most 65,535)."""
    from ccddp.crypto.device.engine import MAX_SEGMENTS_PER_LAUNCH
    from ccddp.errors import ConfigError

    aead = DeviceAESGCM(bytes(32))
    buf = torch.zeros(16, dtype=torch.uint8)
    ok = Segment(bytes(12), b"", 0, 0, 0, 0)
    with pytest.raises(ConfigError, match="at most 65535 segments"):
        aead.encrypt_segments([ok] * (MAX_SEGMENTS_PER_LAUNCH + 1), buf, buf.clone())
    with pytest.raises(ConfigError, match="at most 65535 segments"):
        aead.keystream_segments([ok] * (MAX_SEGMENTS_PER_LAUNCH + 1), buf.clone())
    # As many as the axis holds pass that check: the last one's bad nonce is what stops them.
    with pytest.raises(ValueError, match="nonce"):
        aead.encrypt_segments([ok] * (MAX_SEGMENTS_PER_LAUNCH - 1) + [Segment(b"short", b"", 0, 0, 0, 0)],
                              buf, buf.clone())
