"""The AES-GCM link channel: framing against NIST vectors, and every way a frame can go wrong."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _gcm_vectors import gcm_vectors
from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase, link_id
from ccddp.crypto.keys import GroupSecret, derive_link_key, ratchet
from ccddp.errors import ConfigError, FrameFormatError, IntegrityError

KEY = bytes(range(32))


def _pair(**kw):
    return LinkChannel(KEY, 7, "0->1", **kw), LinkChannel(KEY, 7, "0->1", **kw)


def _aad(step=0, segment=0, nbytes=64):
    return FrameContext(b"s" * 16, 1, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, step, segment, 0, 1, nbytes,
                        "float32").pack()


NIST = [v for v in gcm_vectors("gcmEncryptExtIV256.rsp") if len(v.tag) == TAG_BYTES]


def test_nist_vectors_loaded():
    assert len(NIST) > 100


@pytest.mark.parametrize("vec", NIST[::7], ids=lambda v: f"count{v.count}")
def test_framing_matches_nist_gcm(vec):
    """The channel's nonce layout (link id || counter) and frame (ct || tag) are plain GCM."""
    lid, counter = struct.unpack(">IQ", vec.iv)
    tx = LinkChannel(vec.key, lid, "nist", start_counter=counter, rotate_after=1 << 64)
    frame = bytearray(len(vec.pt) + TAG_BYTES)
    tx.seal(vec.pt, frame, vec.aad)
    assert bytes(frame) == vec.ct + vec.tag
    rx = LinkChannel(vec.key, lid, "nist", start_counter=counter, rotate_after=1 << 64)
    out = bytearray(len(vec.pt))
    rx.open(bytes(frame), out, vec.aad)
    assert bytes(out) == vec.pt


def test_roundtrip_and_counters():
    tx, rx = _pair()
    data = np.arange(64, dtype=np.uint8)
    for i in range(3):
        frame = bytearray(64 + TAG_BYTES)
        tx.seal(data, frame, _aad(segment=i))
        out = np.zeros(64, np.uint8)
        rx.open(frame, out, _aad(segment=i))
        assert (out == data).all()
    assert tx.counter == rx.counter == 3
    assert tx.counters.segments_sealed == 3 and tx.counters.bytes_sealed == 192


def _sealed(tx, n=64, **aad):
    frame = bytearray(n + TAG_BYTES)
    tx.seal(os.urandom(n), frame, _aad(nbytes=n, **aad))
    return frame


def test_flipped_bit_raises_and_zeroes_output():
    tx, rx = _pair()
    frame = _sealed(tx)
    frame[10] ^= 0x01
    out = np.full(64, 0xAA, np.uint8)
    with pytest.raises(IntegrityError) as e:
        rx.open(frame, out, _aad(), collective="all_reduce#1", step=2)
    assert "0->1" in str(e.value) and "all_reduce#1" in str(e.value) and "step 2" in str(e.value)
    assert e.value.segment is None and "segment" not in str(e.value)
    assert not out.any(), "unverified plaintext must not be left behind"


def test_failed_frame_names_its_segment():
    tx, rx = _pair()
    frames = [_sealed(tx) for _ in range(3)]
    frames[2][5] ^= 0x80
    out = np.zeros(64, np.uint8)
    for j in range(2):
        rx.open(frames[j], out, _aad(), collective="all_reduce#4", step=1, segment=j)
    with pytest.raises(IntegrityError) as e:
        rx.open(frames[2], out, _aad(), collective="all_reduce#4", step=1, segment=2)
    assert (e.value.link, e.value.collective, e.value.step, e.value.segment) == ("0->1", "all_reduce#4", 1, 2)
    assert str(e.value).endswith("(link 0->1, collective all_reduce#4, step 1, segment 2)")


def test_replayed_frame_fails():
    tx, rx = _pair()
    first = _sealed(tx)
    rx.open(first, bytearray(64), _aad())
    with pytest.raises(IntegrityError):
        rx.open(first, bytearray(64), _aad())


def test_reordered_frames_fail():
    tx, rx = _pair()
    a, b = _sealed(tx), _sealed(tx)
    with pytest.raises(IntegrityError):
        rx.open(b, bytearray(64), _aad())


def test_dropped_frame_fails_on_the_next():
    tx, rx = _pair()
    _sealed(tx)  # dropped on the way
    b = _sealed(tx)
    with pytest.raises(IntegrityError):
        rx.open(b, bytearray(64), _aad())


def test_truncated_frame_is_a_format_error():
    tx, rx = _pair()
    frame = _sealed(tx)
    with pytest.raises(FrameFormatError):
        rx.open(frame[:-1], bytearray(64), _aad())


def test_refused_frame_buffer_takes_no_nonce():
    """A seal into a frame buffer of the wrong size fails before the channel takes a
    nonce: the counter does not move, no nonce is recorded, and the next seal writes the
    frame a twin channel that never saw the refusal writes for its first message."""
    recorded = []
    tx = LinkChannel(KEY, 7, "0->1", rotate_after=2, recorder=lambda k, nonce: recorded.append(nonce))
    twin, rx = _pair(rotate_after=2)
    data = os.urandom(64)
    for wrong in (0, 64, 64 + TAG_BYTES - 1, 64 + TAG_BYTES + 1):
        with pytest.raises(FrameFormatError, match="frame buffer"):
            tx.seal(data, bytearray(wrong), _aad())
    assert tx.counter == 0 and recorded == []
    for i in range(3):   # past a key rotation: the two stay in step
        a, b = bytearray(64 + TAG_BYTES), bytearray(64 + TAG_BYTES)
        tx.seal(data, a, _aad(segment=i))
        twin.seal(data, b, _aad(segment=i))
        assert a == b
        out = bytearray(64)
        rx.open(a, out, _aad(segment=i))
        assert bytes(out) == data
    assert tx.counter == 3 and len(recorded) == 3


def test_spliced_context_fails():
    tx, rx = _pair()
    frame = _sealed(tx, step=1)
    with pytest.raises(IntegrityError):
        rx.open(frame, bytearray(64), _aad(step=2))


def test_wrong_key_fails():
    tx = LinkChannel(KEY, 7, "0->1")
    rx = LinkChannel(bytes(32), 7, "0->1")
    with pytest.raises(IntegrityError):
        rx.open(_sealed(tx), bytearray(64), _aad())


def test_channel_refuses_use_after_failure():
    tx, rx = _pair()
    frame = _sealed(tx)
    frame[0] ^= 1
    with pytest.raises(IntegrityError):
        rx.open(frame, bytearray(64), _aad())
    with pytest.raises(IntegrityError, match="closed"):
        rx.open(_sealed(tx), bytearray(64), _aad())


def test_rotation_keeps_ends_in_step_and_nonces_unique():
    seen = []
    tx = LinkChannel(KEY, 7, "0->1", rotate_after=3, recorder=lambda k, n: seen.append((k, n)))
    rx = LinkChannel(KEY, 7, "0->1", rotate_after=3)
    for i in range(10):
        frame = _sealed(tx)
        rx.open(frame, bytearray(64), _aad())
    assert tx.epoch == rx.epoch == 3
    assert len(set(seen)) == len(seen) == 10
    assert len({k for k, _ in seen}) == 4, "a new key every 3 messages"


def test_link_keys_differ_per_direction_session_and_epoch():
    s = GroupSecret(KEY)
    k = derive_link_key(s, b"a" * 16, 0, 1)
    assert k != derive_link_key(s, b"a" * 16, 1, 0)
    assert k != derive_link_key(s, b"b" * 16, 0, 1)
    assert derive_link_key(s, b"a" * 16, 0, 1, epoch=1) == ratchet(k, 1)


def test_bad_configuration_is_typed():
    with pytest.raises(ConfigError):
        LinkChannel(b"short", 1, "x")
    with pytest.raises(ConfigError):
        GroupSecret(b"x" * 8)
    with pytest.raises(ConfigError):
        link_id(1 << 16, 0)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=3000), flip=st.integers(min_value=0))
def test_any_single_bit_flip_is_caught(data, flip):
    tx, rx = _pair()
    frame = bytearray(len(data) + TAG_BYTES)
    tx.seal(data, frame, _aad(nbytes=len(data)))
    bit = flip % (len(frame) * 8)
    frame[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(IntegrityError):
        rx.open(frame, bytearray(len(data)), _aad(nbytes=len(data)))


def test_link_channels_pair_up_across_ranks_and_are_kept():
    from ccddp.comm.channels import LinkChannels

    session = b"c" * 16
    r0, r1 = (LinkChannels(r, GroupSecret(KEY), session) for r in (0, 1))
    assert r0.tx(1) is r0.tx(1), "a link's channel is made once: its counter is half of every nonce"
    data = os.urandom(100)
    for _ in range(2):  # counters advance in step on both ends
        frame = bytearray(len(data) + TAG_BYTES)
        r0.tx(1).seal(data, frame, _aad(nbytes=len(data)))
        out = bytearray(len(data))
        r1.rx(0).open(frame, out, _aad(nbytes=len(data)))
        assert bytes(out) == data
    frame = bytearray(len(data) + TAG_BYTES)
    r1.tx(0).seal(data, frame, _aad(nbytes=len(data)))
    out = bytearray(len(data))
    r0.rx(1).open(frame, out, _aad(nbytes=len(data)))
    assert bytes(out) == data
    # A frame reflected back to its sender: the other direction is another key.
    a, b = (LinkChannels(0, GroupSecret(KEY), session) for _ in range(2))
    frame = bytearray(len(data) + TAG_BYTES)
    a.tx(1).seal(data, frame, _aad(nbytes=len(data)))
    with pytest.raises(IntegrityError):
        b.rx(1).open(frame, bytearray(len(data)), _aad(nbytes=len(data)))
    frame = bytearray(len(data) + TAG_BYTES)
    r0.group_channel(0).seal(data, frame, _aad(nbytes=len(data)))
    out = bytearray(len(data))
    r1.group_channel(0).open(frame, out, _aad(nbytes=len(data)))
    assert bytes(out) == data
    assert r0.counters.snapshot()["segments_sealed"] == 3


def test_a_plaintext_groups_channels_are_refused():
    from ccddp.comm.channels import LinkChannels

    plain = LinkChannels(0, None, b"p" * 16)
    for ask in (lambda: plain.tx(1), lambda: plain.rx(1), lambda: plain.group_channel(0)):
        with pytest.raises(ConfigError, match="plaintext"):
            ask()


def test_host_seal_and_open_are_seal_and_open():
    """The prepared ops' ``seal_host``/``open_host`` (issue 42): the same frames and nonces
    as ``seal``/``open``, interleaved with them across a key rotation, the same counters and
    recorded nonces; a refused frame buffer takes no nonce; a tampered frame raises, leaves
    zeros and closes the channel; a truncated one is a format error."""
    recorded = {"fast": [], "job": []}
    tx = LinkChannel(KEY, 7, "0->1", rotate_after=2, recorder=lambda k, n: recorded["fast"].append((k, n)))
    twin = LinkChannel(KEY, 7, "0->1", rotate_after=2, recorder=lambda k, n: recorded["job"].append((k, n)))
    rx, rx_twin = _pair(rotate_after=2)
    data = np.frombuffer(os.urandom(64), np.uint8)
    with pytest.raises(FrameFormatError, match="frame buffer"):
        tx.seal_host(data, np.zeros(64, np.uint8), _aad())
    assert tx.counter == 0 and recorded["fast"] == []
    for i in range(5):
        a, b = np.zeros(64 + TAG_BYTES, np.uint8), np.zeros(64 + TAG_BYTES, np.uint8)
        (tx.seal_host if i % 2 == 0 else tx.seal)(data, a, _aad(segment=i))
        twin.seal(data, b, _aad(segment=i))
        assert (a == b).all()
        out, out_twin = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
        (rx.open_host if i % 2 else rx.open)(a, out, _aad(segment=i), collective="x#1", step=0, segment=i)
        rx_twin.open(b, out_twin, _aad(segment=i))
        assert (out == data).all() and (out_twin == data).all()
    assert recorded["fast"] == recorded["job"] and tx.counter == rx.counter == 5
    assert tx.counters.snapshot() == twin.counters.snapshot() | {"busy_seconds": tx.counters.busy_seconds}
    assert rx.counters.bytes_opened == 5 * 64 and rx.counters.segments_opened == 5

    frame = np.zeros(64 + TAG_BYTES, np.uint8)
    tx.seal_host(data, frame, _aad())
    frame[3] ^= 1
    out = np.full(64, 0xAA, np.uint8)
    with pytest.raises(IntegrityError) as e:
        rx.open_host(frame, out, _aad(), collective="all_gather#9", step=0, segment=0)
    assert (e.value.link, e.value.collective, e.value.step, e.value.segment) == ("0->1", "all_gather#9", 0, 0)
    assert not out.any(), "unverified plaintext must not be left behind"
    with pytest.raises(IntegrityError, match="closed after an earlier failure"):
        rx.open_host(frame, out, _aad())
    _, rx2 = _pair()
    tx2 = LinkChannel(KEY, 7, "0->1")
    frame = np.zeros(64 + TAG_BYTES, np.uint8)
    tx2.seal_host(data, frame, _aad())
    with pytest.raises(FrameFormatError):
        rx2.open_host(frame[:-1], np.zeros(64, np.uint8), _aad())


def test_a_message_of_a_length_known_on_arrival_opens_into_the_first_bytes():
    """``open_prefix_job`` takes its nonce when posted (in program order, before its message
    arrives) and opens a message of at most the receive's length into its first bytes; a
    length beyond the receive is refused typed, and the channel closes."""
    tx, rx = _pair()
    room = np.full(64 + TAG_BYTES, 0xAA, np.uint8)
    out = np.full(64, 7, np.uint8)
    first = rx.open_prefix_job(room, out)
    assert rx.counter == 1
    data = os.urandom(10)
    tx.seal(data, room[:10 + TAG_BYTES], _aad(nbytes=10))
    first(10, _aad(nbytes=10))
    assert bytes(out[:10]) == data and (out[10:] == 7).all()
    second = rx.open_prefix_job(np.zeros(64 + TAG_BYTES, np.uint8), np.zeros(64, np.uint8))
    with pytest.raises(FrameFormatError, match="expected 80"):
        second(65, _aad(nbytes=65))
    with pytest.raises(IntegrityError, match="closed"):
        rx.open_prefix_job(np.zeros(16 + TAG_BYTES, np.uint8), np.zeros(16, np.uint8))
    with pytest.raises(FrameFormatError, match="frame buffer"):
        tx.open_prefix_job(np.zeros(10, np.uint8), np.zeros(64, np.uint8))
