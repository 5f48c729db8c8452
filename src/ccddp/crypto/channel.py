"""One direction of one secure link: the nonce authority and the seal/open contract of
AES-256-GCM frames with counter nonces.

Invariants:

- the nonce is ``link id (32 bits) || message counter (64 bits)``. Both ends keep the
  counter; it is never read from the wire, so a replayed, reordered or dropped frame is
  opened with the wrong nonce and fails its tag;
- counters are taken in program order by the thread that schedules the work
  (``seal_job``/``open_job``), each exactly once, and the returned jobs can then run on
  any thread: that is how segments of one message are sealed in parallel (multi-chain)
  while both ends still agree on every nonce. A frame buffer of the wrong size is refused
  before a counter is taken, so a refused seal leaves both ends in step;
- the key is ratcheted (HKDF) every ``rotate_after`` messages; the counter keeps counting,
  so no (key, nonce) pair can repeat. Every nonce taken is reported to ``recorder`` with
  its key's id, before its frame is sealed or opened;
- an open that fails raises a typed error (:class:`~ccddp.errors.IntegrityError`;
  :class:`~ccddp.errors.FrameFormatError` for a frame of the wrong length) and releases no
  unverified plaintext: ``out`` is zeros after a tag that failed, untouched after a length
  refused before decryption. The channel is closed after it: ``failure``
  says why, and every later take raises;
- the channel does not choose an AES-GCM implementation, and keeps no keystream: which
  engine runs a buffer (OpenSSL for host memory, Triton for device tensors or for every
  buffer under ``aead_engine="triton"``) is :mod:`ccddp.crypto.aead_engines`'s, and the
  device pads (keystream made ahead for the next counters, within ``pad_budget`` bytes,
  refilled after each device frame or ahead of the first with :meth:`prepare_pads`) are
  :mod:`ccddp.crypto.channel_pads`'s. The channel hands them its counter, epoch and key,
  and takes a frame's pad with its nonce. Both engines write the same frames.

Example::

    tx = LinkChannel(key, link_id=1, name="0->1")
    rx = LinkChannel(key, link_id=1, name="0->1")
    frame = bytearray(len(data) + TAG_BYTES)
    tx.seal(data, frame, aad)
    out = bytearray(len(data))
    rx.open(frame, out, aad)      # raises IntegrityError on any change
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

from cryptography.exceptions import InvalidTag

from ccddp.crypto import aead_engines
from ccddp.crypto.aead_engines import AeadEngine, AeadKey, engine_named
from ccddp.crypto.channel_pads import ChannelPads, PadLease, PadRecorder
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import ratchet
from ccddp.errors import ConfigError, FrameFormatError, IntegrityError

__all__ = ["TAG_BYTES", "NONCE_BYTES", "DEFAULT_ROTATE_AFTER", "MAX_FRAME_BYTES", "AeadEngine", "Job",
           "NonceRecorder", "PadRecorder", "LinkChannel", "link_id"]

TAG_BYTES = 16
NONCE_BYTES = 12
DEFAULT_ROTATE_AFTER = 1 << 32
# One AES-GCM call takes at most 2**31-1 bytes (OpenSSL's int lengths); larger messages
# ("one tag per message", the naive schedule) are cut into frames of at most this size.
MAX_FRAME_BYTES = 1 << 30

Job = Callable[[], None]
NonceRecorder = Callable[[bytes, bytes], None]


@dataclass(frozen=True)
class _EpochKey:
    """The key of one epoch, its engines and its id (what recorders see)."""

    epoch: int
    key: bytes
    aead: AeadKey
    key_id: bytes


@dataclass(frozen=True)
class _Ticket:
    """What one frame's job needs: its epoch's key, its nonce, and its pad if it has one."""

    key: _EpochKey
    nonce: bytes
    pad: PadLease | None = None


def link_id(src: int, dst: int) -> int:
    """32-bit link id of ``src -> dst`` (ranks below 65536)."""
    if not (0 <= src < 1 << 16 and 0 <= dst < 1 << 16):
        raise ConfigError(f"rank out of range for a link id: {src}->{dst}")
    return (src << 16) | dst


class LinkChannel:
    """Seals (sender side) or opens (receiver side) the frames of one directed link."""

    def __init__(self, key: bytes, link_id: int, name: str, *, rotate_after: int = DEFAULT_ROTATE_AFTER,
                 counters: CryptoCounters | None = None, recorder: NonceRecorder | None = None,
                 start_counter: int = 0, aead_engine: AeadEngine | str = AeadEngine.AUTO, pad_budget: int = 0,
                 pad_recorder: PadRecorder | None = None) -> None:
        if len(key) != 32:
            raise ConfigError("AES-256-GCM needs a 32-byte key")
        if rotate_after < 1:
            raise ConfigError("rotate_after must be >= 1")
        if pad_budget < 0:
            raise ConfigError("pad_budget must be >= 0")
        self.aead_engine = engine_named(aead_engine)
        self.name = name
        self.link_id = link_id
        self.rotate_after = rotate_after
        self.counters = counters if counters is not None else CryptoCounters()
        self.recorder = recorder
        self._pads = ChannelPads(pad_budget, pad_recorder)
        epoch = start_counter // rotate_after
        for e in range(1, epoch + 1):
            key = ratchet(key, e)
        self._key = self._epoch_key(epoch, key)
        # Both ends must start from the same counter; only a resumed link starts above 0.
        self._counter = start_counter
        self._lock = threading.Lock()
        self.failure: str | None = None

    @staticmethod
    def _epoch_key(epoch: int, key: bytes) -> _EpochKey:
        return _EpochKey(epoch, key, AeadKey(key), hashlib.sha256(key).digest()[:8])

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def epoch(self) -> int:
        return self._key.epoch

    @property
    def pad_budget(self) -> int:
        return self._pads.budget

    @property
    def pad_recorder(self) -> PadRecorder | None:
        return self._pads.recorder

    def _nonce(self, counter: int) -> bytes:
        return struct.pack(">IQ", self.link_id, counter)

    def _next(self) -> tuple[_EpochKey, int, bytes]:
        """The next counter, its epoch's key and its nonce, reported to the recorder (the
        caller holds the lock)."""
        if self.failure is not None:
            raise IntegrityError(f"link {self.name} is closed after an earlier failure: {self.failure}",
                                 link=self.name)
        counter = self._counter
        self._counter += 1
        epoch = counter // self.rotate_after
        while self._key.epoch < epoch:
            self._key = self._epoch_key(self._key.epoch + 1, ratchet(self._key.key, self._key.epoch + 1))
        nonce = self._nonce(counter)
        if self.recorder is not None:
            self.recorder(self._key.key_id, nonce)
        return self._key, counter, nonce

    def _take(self, device=None, nbytes: int = 0) -> _Ticket:
        """The next counter's nonce (and its pad for a device frame of ``nbytes``)."""
        with self._lock:
            key, counter, nonce = self._next()
            pad = None
            if device is not None:
                pad = self._pads.take(counter, key.epoch, nbytes, device, key_id=key.key_id, nonce=nonce)
            return _Ticket(key, nonce, pad)

    # -- pads ----------------------------------------------------------------------
    def prepare_pads(self, nbytes: int, device) -> int:
        """Generate keystream for this link's next frames of up to ``nbytes`` bytes on
        ``device``, within the pad budget (none if it is 0); return how many pads wait."""
        import torch

        device = torch.device(device)
        with self._lock:
            self._refill(nbytes, device)
            return self._pads.ready()

    def _refill(self, nbytes: int, device) -> None:
        """Top up the pads (caller holds the lock) from the next counter, this epoch only."""
        if self.failure is not None:
            return
        key = self._key
        self._pads.top_up(key.aead.device, self._nonce, next_counter=self._counter, epoch=key.epoch,
                          epoch_end=(key.epoch + 1) * self.rotate_after, nbytes=nbytes, device=device,
                          key_id=key.key_id)

    def _top_up(self, nbytes: int, device) -> None:
        """After a device frame: pads for the next frames, assumed of the same size."""
        if self._pads.budget:
            with self._lock:
                self._refill(nbytes, device)

    def _run(self, ticket: _Ticket, device, engine_call: Callable, src, aad: bytes, dst) -> None:
        """One frame's ``seal_into``/``open_into`` with its nonce, and its pad if it took one
        (waited for before, released after, whatever happens)."""
        lease = ticket.pad
        if lease is None:
            engine_call(ticket.key.aead, device, ticket.nonce, src, aad, dst)
            return
        try:
            lease.wait_written()
            engine_call(ticket.key.aead, device, ticket.nonce, src, aad, dst, pad=lease.arena, pad_offset=lease.offset)
        finally:
            self._pads.release(lease, device)

    # -- frames --------------------------------------------------------------------
    def seal_job(self, plaintext, frame, aad: bytes) -> Job:
        """Take the next nonce now; return a job that writes ``ciphertext || tag`` into ``frame``.

        A frame buffer of the wrong size is refused before a nonce is taken: the refusal
        leaves the channel as it was (same next counter, same pads), so the peer, which
        never sees the refused frame, stays in step.
        """
        device = aead_engines.device_of(self.aead_engine, plaintext, frame, link=self.name)
        n = len(plaintext)
        if len(frame) != n + TAG_BYTES:
            raise FrameFormatError(f"frame buffer is {len(frame)} bytes, expected {n + TAG_BYTES}", link=self.name)
        ticket = self._take(device, n)
        counters = self.counters

        def job() -> None:
            t0 = time.perf_counter()
            self._run(ticket, device, aead_engines.seal_into, plaintext, aad, frame)
            counters.add_frame(True, n, time.perf_counter() - t0)
            if device is not None:
                self._top_up(n, device)

        return job

    def open_prefix_job(self, frame, out, *, collective: str = "?", step: int | None = None
                        ) -> Callable[[int, bytes], None]:
        """As :meth:`open_job`, for a message of at most ``len(out)`` bytes whose length is
        known only once it has arrived (a point-to-point message: gloo takes a shorter
        message into a longer receive). Take the next expected nonce now; return a job
        ``(n, aad)`` that verifies ``frame[:n + TAG_BYTES]`` and writes ``out[:n]``, or
        zeroes that and raises :class:`IntegrityError` (:class:`FrameFormatError` if ``n``
        exceeds ``len(out)``). A channel with device pads refuses it: a pad is made for one
        frame length."""
        if self._pads.budget:
            raise FrameFormatError("a frame of a length known on arrival needs a channel without device pads",
                                   link=self.name)
        device = aead_engines.device_of(self.aead_engine, frame, out, link=self.name)
        room = len(out)
        if len(frame) != room + TAG_BYTES:
            raise FrameFormatError(f"frame buffer is {len(frame)} bytes, expected {room + TAG_BYTES}", link=self.name)
        ticket = self._take(device, room)

        def job(n: int, aad: bytes) -> None:
            if not 0 <= n <= room:
                raise self._refuse_size(n + TAG_BYTES, room, collective, step, None)
            self._open_with(ticket, device, frame[:n + TAG_BYTES], aad, out[:n], collective, step, None)

        return job

    def _open_with(self, ticket: _Ticket, device, frame, aad: bytes, out, collective: str, step, segment) -> None:
        """Verify ``frame`` under ``ticket`` and write ``out``, or zero ``out`` and raise."""
        n = len(out)
        t0 = time.perf_counter()
        try:
            self._run(ticket, device, aead_engines.open_into, frame, aad, out)
        except InvalidTag:
            aead_engines.wipe(out, device, n)
            raise self._refuse_tag(collective, step, segment) from None
        self.counters.add_frame(False, n, time.perf_counter() - t0)

    # -- refusals: the channel closes, the caller gets a typed error --------------------
    def _refuse_size(self, got: int, n: int, collective: str, step, segment) -> FrameFormatError:
        self.failure = "truncated or padded frame"
        return FrameFormatError(f"frame is {got} bytes, expected {n + TAG_BYTES}",
                                link=self.name, collective=collective, step=step, segment=segment)

    def _refuse_tag(self, collective: str, step, segment) -> IntegrityError:
        self.failure = f"authentication failed in {collective} step {step}" + (
            f" segment {segment}" if segment is not None else "")
        return IntegrityError("frame failed authentication (tampered, replayed, reordered, "
                              "dropped, spliced or wrong key)",
                              link=self.name, collective=collective, step=step, segment=segment)

    def open_job(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
                 segment: int | None = None) -> Job:
        """Take the next expected nonce now; return a job that verifies ``frame`` and writes
        the plaintext into ``out``, or zeroes ``out`` and raises :class:`IntegrityError`."""
        device = aead_engines.device_of(self.aead_engine, frame, out, link=self.name)
        n = len(out)
        ticket = self._take(device, n)

        def job() -> None:
            if len(frame) != n + TAG_BYTES:
                raise self._refuse_size(len(frame), n, collective, step, segment)
            self._open_with(ticket, device, frame, aad, out, collective, step, segment)
            if device is not None:
                self._top_up(n, device)

        return job

    def seal(self, plaintext, frame, aad: bytes) -> None:
        self.seal_job(plaintext, frame, aad)()

    # -- host frames, sealed on the calling thread ------------------------------------
    # A prepared two-rank op (``ccddp.comm.prepared``) seals and opens four small frames in
    # host memory per op, on the thread that takes their nonces: :meth:`seal` and
    # :meth:`open` without the job, the engine choice or the ticket (issue 42). The same
    # nonces in the same order (``_next``, under the lock), the same frames and counters,
    # the same refusals and failures; a channel whose engine is not ``auto`` takes
    # :meth:`seal`/:meth:`open`.
    def seal_host(self, plaintext, frame, aad: bytes) -> None:
        """:meth:`seal` of host buffers OpenSSL takes as they are (numpy arrays, bytes-likes)."""
        if self.aead_engine is not AeadEngine.AUTO:
            return self.seal(plaintext, frame, aad)
        n = len(plaintext)
        if len(frame) != n + TAG_BYTES:
            raise FrameFormatError(f"frame buffer is {len(frame)} bytes, expected {n + TAG_BYTES}", link=self.name)
        with self._lock:
            key, _, nonce = self._next()
        t0 = time.perf_counter()
        key.aead.openssl.encrypt_into(nonce, plaintext, aad, frame)
        self.counters.add_frame(True, n, time.perf_counter() - t0)

    def open_host(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
                  segment: int | None = None) -> None:
        """:meth:`open` into a host buffer OpenSSL takes as it is (a numpy array, a bytearray):
        ``out`` holds verified plaintext, or zeros and :class:`IntegrityError` is raised."""
        if self.aead_engine is not AeadEngine.AUTO:
            return self.open(frame, out, aad, collective=collective, step=step, segment=segment)
        n = len(out)
        with self._lock:
            key, _, nonce = self._next()
        if len(frame) != n + TAG_BYTES:
            raise self._refuse_size(len(frame), n, collective, step, segment)
        t0 = time.perf_counter()
        try:
            key.aead.openssl.decrypt_into(nonce, frame, aad, out)
        except InvalidTag:
            aead_engines.wipe(out, None, n)
            raise self._refuse_tag(collective, step, segment) from None
        self.counters.add_frame(False, n, time.perf_counter() - t0)

    def open(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
             segment: int | None = None) -> None:
        self.open_job(frame, out, aad, collective=collective, step=step, segment=segment)()
