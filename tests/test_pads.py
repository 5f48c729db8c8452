"""Pads are released in stream order: a pad's arena bytes are written again only after the
kernels that used them are done, whatever streams the frames and the refills run on.

On CPU the fences are fakes that report "done" only when a test says so (standing for a
GPU stream still busy with a frame's kernels); the buffer logic is checked against a fake
engine (placements only) and, through a real Triton channel, frame by frame against
OpenSSL. On a GPU a seal stream and a refill stream race for real.
"""

from __future__ import annotations

import os
from collections import Counter
from unittest import mock

import pytest
import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccddp.crypto import TAG_BYTES, LinkChannel
from ccddp.crypto.device import PadBuffer, PadEvent, interpreting, pad_bytes
from ccddp.crypto.device import pads as device_pads

KEY = bytes(range(32))
LINK = 7
NEEDS_INTERPRETER = pytest.mark.skipif(
    not interpreting(), reason="CPU tensors need Triton's interpreter; this process compiles for the GPU "
                               "(run with TRITON_INTERPRET=1)")


class FakeFence:
    """A fence whose kernels are done only once :meth:`finish` is called."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def wait(self) -> None:
        pass

    def finish(self) -> None:
        self.done = True


class Fences:
    """Stands in for ``stream_fence``: every fence it records is a :class:`FakeFence`."""

    def __init__(self) -> None:
        self.recorded: list[FakeFence] = []

    def __call__(self, device) -> FakeFence:
        self.recorded.append(FakeFence())
        return self.recorded[-1]

    def finish_all(self) -> None:
        for f in self.recorded:
            f.finish()


class PlacementsOnly:
    """An engine that writes no keystream: the buffer tests look at where pads go."""

    def keystream_segments(self, segments, pad) -> None:
        pass


def _nonce(counter: int) -> bytes:
    return LINK.to_bytes(4, "big") + counter.to_bytes(8, "big")


def _refill(pads: PadBuffer, next_counter: int, nbytes: int, epoch: int = 0, epoch_end: int = 1 << 32):
    return pads.refill(PlacementsOnly(), _nonce, next_counter=next_counter, epoch=epoch, epoch_end=epoch_end,
                       nbytes=nbytes)


def _overlapping(pad, others) -> list:
    return [p for p in others if p.overlaps(pad.offset, pad.end - pad.offset)]


# -- the buffer, with fake fences ------------------------------------------------------------
def test_a_used_pad_keeps_its_bytes_until_its_frame_is_done():
    """Two pads fit. Counter 0's frame launched but its kernels are not done: the refill
    that would wrap onto its bytes makes no pad; once its fence is done, counter 2's pad
    goes there."""
    pads = PadBuffer(2 * pad_bytes(64), "cpu")
    first, second = _refill(pads, 0, 64)
    used = pads.take(0, 0, 64)
    assert used == first
    frame_done = FakeFence()
    pads.release(used, frame_done)
    assert _refill(pads, 1, 64) == [], "a pad was placed over bytes a frame still reads"
    assert used in pads.occupied()
    frame_done.finish()
    (third,) = _refill(pads, 1, 64)
    assert (third.counter, third.offset) == (2, used.offset)
    assert pads.take(1, 0, 64) == second and pads.take(2, 0, 64) == third


def test_a_pad_dropped_unused_keeps_its_bytes_until_its_keystream_is_written():
    """A pad whose counter went by without it was never read, but the kernel writing it
    may still run (on the refill's stream): a new pad over it would get its keystream."""
    fences = Fences()
    with mock.patch.object(device_pads, "stream_fence", fences):
        pads = PadBuffer(2 * pad_bytes(64), "cpu")
        _refill(pads, 0, 64)
        (written,) = fences.recorded
        second = pads.take(1, 0, 64)                   # counter 0 went without its pad
        done = FakeFence()
        done.finish()
        pads.release(second, done)
        assert _refill(pads, 2, 64) == []
        written.finish()
        assert [(p.counter, p.offset) for p in _refill(pads, 2, 64)] == [(2, 0), (3, pad_bytes(64))]


def test_a_refill_with_no_free_bytes_makes_no_pad_and_returns():
    pads = PadBuffer(pad_bytes(64), "cpu")
    (only,) = _refill(pads, 0, 64)
    assert _refill(pads, 0, 64) == []                  # ready, not taken
    pads.take(0, 0, 64)
    assert _refill(pads, 1, 64) == []                  # taken, not launched
    pads.release(only, FakeFence())
    assert _refill(pads, 1, 64) == []                  # launched, not done


# A step of a random schedule: (what, argument).
STEPS = st.lists(st.one_of(
    st.tuples(st.just("refill"), st.sampled_from([1, 16, 40, 64, 100])),
    st.tuples(st.just("take"), st.sampled_from([1, 16, 40, 64, 100])),
    st.tuples(st.just("skip"), st.integers(1, 3)),
    st.tuples(st.just("launch"), st.integers(0, 7)),
    st.tuples(st.just("finish"), st.integers(0, 15)),
), max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, budget_pads=st.integers(1, 5), rotate_after=st.integers(2, 9))
def test_no_two_live_pads_overlap_and_no_counter_gets_two_pads(steps, budget_pads, rotate_after):
    """Random takes, launches, fence completions and refills. Live pads -- ready, taken
    and not launched, launched and not done, or dropped with their keystream kernel not
    done -- never overlap, stay in the arena, and each counter gets one pad at most."""
    fences = Fences()
    budget = budget_pads * pad_bytes(64)
    with mock.patch.object(device_pads, "stream_fence", fences):
        pads = PadBuffer(budget, "cpu")
        next_counter = 0
        made_for: dict[int, object] = {}                 # counter -> its pad
        launched: list[tuple[object, FakeFence]] = []    # used pads and their frames' fences
        taken: list[object] = []                         # used pads not launched yet

        def live() -> list:
            in_flight = {p for p, f in launched if not f.done}
            return [p for c, p in made_for.items()
                    if (c >= next_counter and p not in taken)                     # ready
                    or p in taken or p in in_flight                               # used
                    or (c < next_counter and p not in {q for q, _ in launched}    # dropped
                        and not p.written.done)]

        for what, arg in steps:
            epoch = next_counter // rotate_after
            if what == "refill":
                before = live()
                made = _refill(pads, next_counter, arg, epoch, (epoch + 1) * rotate_after)
                for i, p in enumerate(made):
                    assert p.counter not in made_for, f"counter {p.counter} got a second pad"
                    assert 0 <= p.offset and p.end <= budget
                    assert p.counter >= next_counter and p.epoch == p.counter // rotate_after == epoch
                    assert _overlapping(p, before + made[:i]) == [], "a pad placed over live bytes"
                    made_for[p.counter] = p
            elif what == "take":
                pad = pads.take(next_counter, epoch, arg)
                if pad is not None:
                    assert made_for.get(next_counter) == pad and pad.nbytes >= arg
                    taken.append(pad)
                next_counter += 1
            elif what == "skip":
                next_counter += arg
            elif what == "launch" and taken:
                pad = taken.pop(arg % len(taken))
                frame = FakeFence()
                launched.append((pad, frame))
                pads.release(pad, frame)
            elif what == "finish" and fences.recorded + [f for _, f in launched]:
                pending = fences.recorded + [f for _, f in launched]
                pending[arg % len(pending)].finish()


# -- through a real channel on the Triton engine (CPU tensors, the interpreter) ----------------
def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _openssl_frame(counter: int, data: bytes, aad: bytes) -> bytes:
    return AESGCM(KEY).encrypt(_nonce(counter), data, aad)


@NEEDS_INTERPRETER
def test_a_channel_refills_a_pad_only_after_the_frame_that_used_it_is_done(monkeypatch):
    """Pads for two frames. Frame 0 is sealed with counter 0's pad and its (fake) kernels
    are not done: the refill after it must not wrap onto that pad, so only counter 1's pad
    waits. Once frame 0 is done a pad for counter 2 is made in its place, and frames 1
    and 2 use their pads; every frame is OpenSSL's."""
    fences = Fences()
    monkeypatch.setattr(device_pads, "stream_fence", fences, raising=False)
    used = []
    ch = LinkChannel(KEY, LINK, "0->1", aead_engine="triton", pad_budget=2 * pad_bytes(64),
                     pad_recorder=lambda e, k, n: used.append(n) if e is PadEvent.USED else None)
    cpu = torch.device("cpu")
    assert ch.prepare_pads(64, cpu) == 2
    data = [os.urandom(64) for _ in range(3)]
    frames = []

    def seal(i: int) -> None:
        frame = torch.zeros(64 + TAG_BYTES, dtype=torch.uint8)
        ch.seal(_tensor(data[i]), frame, b"%d" % i)
        frames.append(bytes(frame.numpy()))

    seal(0)
    assert ch.prepare_pads(64, cpu) == 1, "a pad was made over the bytes frame 0 still reads"
    fences.finish_all()
    assert ch.prepare_pads(64, cpu) == 2
    seal(1)
    seal(2)
    assert used == [_nonce(0), _nonce(1), _nonce(2)]
    assert frames == [_openssl_frame(i, data[i], b"%d" % i) for i in range(3)]


@NEEDS_INTERPRETER
def test_frames_with_pads_and_lagging_fences_equal_openssl(monkeypatch):
    """Seal and open frames of mixed sizes while each frame's kernels finish one frame
    later (a queue one deep): pads are used, fewer are made, and frames are OpenSSL's."""
    fences = Fences()
    monkeypatch.setattr(device_pads, "stream_fence", fences, raising=False)
    events = {side: {PadEvent.USED: Counter(), PadEvent.MADE: Counter()} for side in ("tx", "rx")}

    def channel(side: str) -> LinkChannel:
        return LinkChannel(KEY, LINK, "0->1", aead_engine="triton", rotate_after=4, pad_budget=3 * pad_bytes(48),
                           pad_recorder=lambda e, k, nonce: events[side][e].update([(k, nonce)]))

    tx, rx = channel("tx"), channel("rx")
    cpu = torch.device("cpu")
    tx.prepare_pads(48, cpu)
    rx.prepare_pads(48, cpu)
    openssl = LinkChannel(KEY, LINK, "0->1", rotate_after=4)
    for i, n in enumerate([48, 48, 17, 48, 60, 48, 48, 0, 48]):
        finishing = list(fences.recorded)
        data, aad = os.urandom(n), b"%d" % i
        frame = torch.zeros(n + TAG_BYTES, dtype=torch.uint8)
        tx.seal(_tensor(data), frame, aad)
        expected = bytearray(n + TAG_BYTES)
        openssl.seal(data, expected, aad)
        assert bytes(frame.numpy()) == bytes(expected), i
        out = torch.full((n,), 0xAA, dtype=torch.uint8)
        rx.open(frame, out, aad)
        assert bytes(out.numpy()) == data, i
        for f in finishing:                          # the previous frame's kernels are done now
            f.finish()
    for side in events.values():
        used, made = side[PadEvent.USED], side[PadEvent.MADE]
        assert set(used.values()) == set(made.values()) == {1}, "a pad made or used twice"
        assert set(used) <= set(made) and len(used) >= 3


# -- a GPU: seal on one stream, refill on another --------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: seal and refill race on two streams")
def test_seal_and_refill_on_two_streams_give_openssl_frames():
    """Refills run on one stream after a delay (their keystream lands late), seals on
    another after a delay (they read their pads late). Frames equal OpenSSL's only if each
    seal waits for its pad's keystream and no refill writes a pad a pending seal reads."""
    device = torch.device("cuda")
    n = 1 << 20
    used = []
    ch = LinkChannel(KEY, LINK, "0->1", pad_budget=2 * pad_bytes(n),
                     pad_recorder=lambda e, k, nonce: used.append(nonce) if e is PadEvent.USED else None)
    seal_stream, refill_stream = torch.cuda.Stream(device), torch.cuda.Stream(device)
    data = [os.urandom(n) for _ in range(8)]
    plain = [torch.frombuffer(bytearray(d), dtype=torch.uint8).to(device) for d in data]
    frames = [torch.zeros(n + TAG_BYTES, dtype=torch.uint8, device=device) for _ in data]
    torch.cuda.synchronize(device)
    delay = 20_000_000                               # GPU cycles: milliseconds of work ahead on a stream
    for i in range(len(data)):
        with torch.cuda.stream(refill_stream):
            torch.cuda._sleep(delay)
            ch.prepare_pads(n, device)
        with torch.cuda.stream(seal_stream):
            torch.cuda._sleep(delay)
            ch.seal(plain[i], frames[i], b"%d" % i)
        if i % 2:
            seal_stream.synchronize()                # the frames so far are done: their pads' bytes are free
    torch.cuda.synchronize(device)
    assert [bytes(f.cpu().numpy()) for f in frames] == [_openssl_frame(i, d, b"%d" % i) for i, d in enumerate(data)]
    assert len(used) >= 4, "the pads were hardly used: the race was not exercised"
