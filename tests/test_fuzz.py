"""Fuzz ``LinkChannel.open`` with random and mutated frames: whatever arrives, the only
exceptions are the typed ``IntegrityError`` / ``FrameFormatError``, the output buffer
never keeps unverified bytes, and only the untouched frame in its own context opens."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import TAG_BYTES, LinkChannel
from ccddp.errors import FrameFormatError, IntegrityError

KEY = bytes(range(32))
SESSION = b"s" * 16


def aad(n: int, step: int = 0, seq: int = 1, segment: int = 0, dtype: str = "float32") -> bytes:
    return FrameContext(SESSION, seq, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, step, segment, 0, 1, n, dtype).pack()


def pair(rotate_after: int = 1 << 32):
    return (LinkChannel(KEY, 1, "0->1", rotate_after=rotate_after),
            LinkChannel(KEY, 1, "0->1", rotate_after=rotate_after))


def sealed_stream(tx: LinkChannel, sizes: list[int]) -> list[tuple[bytes, bytes, bytes]]:
    """(plaintext, frame, aad) for consecutive messages of ``tx``."""
    out = []
    for i, n in enumerate(sizes):
        data = bytes((i * 31 + j) % 251 for j in range(n))
        frame = bytearray(n + TAG_BYTES)
        a = aad(n, step=i)
        tx.seal(data, frame, a)
        out.append((data, bytes(frame), a))
    return out


def open_checked(rx: LinkChannel, frame, n: int, a: bytes):
    """Open ``frame``; return plaintext or the typed error. Anything else fails the test."""
    out = np.full(n, 0xA5, np.uint8)
    try:
        rx.open(frame, out, a, collective="fuzz#1", step=0)
    except IntegrityError as e:  # FrameFormatError included
        assert "link 0->1" in str(e)
        closed = "closed after an earlier failure" in str(e)
        assert closed or "collective fuzz#1, step 0" in str(e), str(e)
        # Never unverified bytes: zeroed after a failed tag, untouched otherwise.
        assert not out.any() or (out == 0xA5).all(), "a failed open left bytes in the output"
        if not isinstance(e, FrameFormatError) and not closed:
            assert not out.any()
        return e
    return out.tobytes()


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("extend"), st.integers(1, 64), st.integers(0, 255)),
    st.tuples(st.just("zero-tag"), st.just(0), st.just(0)),
    st.tuples(st.just("swap-halves"), st.just(0), st.just(0)),
)


def mutate(frame: bytes, m) -> bytes:
    kind, a, b = m
    f = bytearray(frame)
    if kind == "flip" and f:
        f[a % len(f)] ^= 1 << b
    elif kind == "set" and f:
        f[a % len(f)] = b
    elif kind == "cut":
        f = f[:a % (len(f) + 1)]
    elif kind == "extend":
        f += bytes([b]) * a
    elif kind == "zero-tag":
        f[-TAG_BYTES:] = bytes(TAG_BYTES)
    elif kind == "swap-halves":
        h = len(f) // 2
        f = f[h:] + f[:h]
    return bytes(f)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=st.lists(st.integers(0, 600), min_size=1, max_size=4), target=st.integers(0, 3),
       mutations=st.lists(mutation, min_size=1, max_size=3))
@example(sizes=[16], target=0, mutations=[("cut", 31, 0)])
def test_mutated_frames_raise_only_typed_errors(sizes, target, mutations):
    tx, rx = pair()
    stream = sealed_stream(tx, sizes)
    target %= len(stream)
    for i, (data, frame, a) in enumerate(stream):
        if i < target:
            assert open_checked(rx, frame, len(data), a) == data
            continue
        bad = frame
        for m in mutations:
            bad = mutate(bad, m)
        got = open_checked(rx, bad, len(data), a)
        if bad == frame:
            assert got == data
            continue
        assert isinstance(got, IntegrityError), f"mutated frame opened: {mutations}"
        # The channel is closed after a failure: later frames are refused, typed.
        if i + 1 < len(stream):
            d, f, a2 = stream[i + 1]
            assert isinstance(open_checked(rx, f, len(d), a2), IntegrityError)
        break


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=700), n=st.integers(0, 700), counter=st.integers(0, 5),
       kind=st.sampled_from(["bytes", "bytearray", "numpy", "memoryview"]))
def test_random_frames_raise_only_typed_errors(frame, n, counter, kind):
    _, rx = pair(rotate_after=2)
    for _ in range(counter):   # a receiver some messages into the stream, past a rotation
        rx._take()
    buf = {"bytes": frame, "bytearray": bytearray(frame), "memoryview": memoryview(frame),
           "numpy": np.frombuffer(frame, np.uint8)}[kind]
    got = open_checked(rx, buf, n, aad(n))
    assert isinstance(got, IntegrityError), "a random frame opened"
    if len(frame) != n + TAG_BYTES:
        assert isinstance(got, FrameFormatError)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), field=st.sampled_from(["step", "seq", "segment", "dtype", "nbytes", "session",
                                                       "dst", "op"]))
def test_frame_in_any_other_context_fails(n, field):
    """Splicing: the same authentic frame, expected in a context that differs in one
    field the AAD binds, never opens."""
    tx, rx = pair()
    data = bytes(n)
    frame = bytearray(n + TAG_BYTES)
    ctx = dict(session=SESSION, seq=1, op=Op.ALL_REDUCE, phase=Phase.REDUCE_SCATTER, step=0, segment=0,
               src=0, dst=1, nbytes=n, dtype="float32")
    tx.seal(data, frame, FrameContext(**ctx).pack())
    other = dict(ctx)
    other[field] = {"step": 1, "seq": 2, "segment": 1, "dtype": "bfloat16", "nbytes": n + 1,
                    "session": b"t" * 16, "dst": 2, "op": Op.ALL_GATHER}[field]
    assert isinstance(open_checked(rx, bytes(frame), n, FrameContext(**other).pack()), IntegrityError)


def test_untouched_frames_open():
    """The other side of the fuzz: authentic frames in their own context always open, so
    the assertions above are not passing because nothing ever opens."""
    tx, rx = pair(rotate_after=2)
    for data, frame, a in sealed_stream(tx, [0, 1, 100, 600, 5]):
        assert open_checked(rx, frame, len(data), a) == data
