"""One direction of one secure link: AES-256-GCM with counter nonces.

The nonce is ``link id (32 bits) || message counter (64 bits)``. Both ends keep the
counter; it is never read from the wire, so a replayed, reordered or dropped frame is
opened with the wrong nonce and fails its tag. Counters are taken in program order by
the thread that schedules the work (``seal_job``/``open_job``), and the returned jobs can
then run on any thread: that is how segments of one message are sealed in parallel
(multi-chain) while both ends still agree on every nonce.

The key is ratcheted (HKDF) every ``rotate_after`` messages; the counter keeps counting,
so no (key, nonce) pair can repeat.

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
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import ratchet
from ccddp.errors import ConfigError, FrameFormatError, IntegrityError

TAG_BYTES = 16
NONCE_BYTES = 12
DEFAULT_ROTATE_AFTER = 1 << 32
# One AES-GCM call takes at most 2**31-1 bytes (OpenSSL's int lengths); larger messages
# ("one tag per message", the naive schedule) are cut into frames of at most this size.
MAX_FRAME_BYTES = 1 << 30

Job = Callable[[], None]
NonceRecorder = Callable[[bytes, bytes], None]


def link_id(src: int, dst: int) -> int:
    """32-bit link id of ``src -> dst`` (ranks below 65536)."""
    if not (0 <= src < 1 << 16 and 0 <= dst < 1 << 16):
        raise ConfigError(f"rank out of range for a link id: {src}->{dst}")
    return (src << 16) | dst


class LinkChannel:
    """Seals (sender side) or opens (receiver side) the frames of one directed link."""

    def __init__(self, key: bytes, link_id: int, name: str, *, rotate_after: int = DEFAULT_ROTATE_AFTER,
                 counters: CryptoCounters | None = None, recorder: NonceRecorder | None = None,
                 start_counter: int = 0) -> None:
        if len(key) != 32:
            raise ConfigError("AES-256-GCM needs a 32-byte key")
        if rotate_after < 1:
            raise ConfigError("rotate_after must be >= 1")
        self.name = name
        self.link_id = link_id
        self.rotate_after = rotate_after
        self.counters = counters if counters is not None else CryptoCounters()
        self.recorder = recorder
        self._epoch = start_counter // rotate_after
        for e in range(1, self._epoch + 1):
            key = ratchet(key, e)
        self._key = key
        self._aead = AESGCM(key)
        # Both ends must start from the same counter; only a resumed link starts above 0.
        self._counter = start_counter
        self._lock = threading.Lock()
        self.failure: str | None = None

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def epoch(self) -> int:
        return self._epoch

    def _take(self) -> tuple[AESGCM, bytes]:
        with self._lock:
            if self.failure is not None:
                raise IntegrityError(f"link {self.name} is closed after an earlier failure: {self.failure}",
                                     link=self.name)
            counter = self._counter
            self._counter += 1
            epoch = counter // self.rotate_after
            while self._epoch < epoch:
                self._epoch += 1
                self._key = ratchet(self._key, self._epoch)
                self._aead = AESGCM(self._key)
            nonce = struct.pack(">IQ", self.link_id, counter)
            if self.recorder is not None:
                self.recorder(hashlib.sha256(self._key).digest()[:8], nonce)
            return self._aead, nonce

    def seal_job(self, plaintext, frame, aad: bytes) -> Job:
        """Take the next nonce now; return a job that writes ``ciphertext || tag`` into ``frame``."""
        aead, nonce = self._take()
        n = len(plaintext)
        if len(frame) != n + TAG_BYTES:
            raise FrameFormatError(f"frame buffer is {len(frame)} bytes, expected {n + TAG_BYTES}", link=self.name)
        counters = self.counters

        def job() -> None:
            t0 = time.perf_counter()
            aead.encrypt_into(nonce, plaintext, aad, frame)
            counters.add_frame(True, n, time.perf_counter() - t0)

        return job

    def open_job(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
                 segment: int | None = None) -> Job:
        """Take the next expected nonce now; return a job that verifies ``frame`` and writes
        the plaintext into ``out``, or zeroes ``out`` and raises :class:`IntegrityError`."""
        aead, nonce = self._take()
        counters = self.counters
        n = len(out)

        def job() -> None:
            if len(frame) != n + TAG_BYTES:
                self.failure = "truncated or padded frame"
                raise FrameFormatError(f"frame is {len(frame)} bytes, expected {n + TAG_BYTES}",
                                       link=self.name, collective=collective, step=step, segment=segment)
            t0 = time.perf_counter()
            try:
                aead.decrypt_into(nonce, frame, aad, out)
            except InvalidTag:
                # OpenSSL writes plaintext before it checks the tag: never leave it behind.
                memoryview(out).cast("B")[:] = bytes(n)
                self.failure = f"authentication failed in {collective} step {step}" + (
                    f" segment {segment}" if segment is not None else "")
                raise IntegrityError("frame failed authentication (tampered, replayed, reordered, "
                                     "dropped, spliced or wrong key)",
                                     link=self.name, collective=collective, step=step,
                                     segment=segment) from None
            counters.add_frame(False, n, time.perf_counter() - t0)

        return job

    def seal(self, plaintext, frame, aad: bytes) -> None:
        self.seal_job(plaintext, frame, aad)()

    def open(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
             segment: int | None = None) -> None:
        self.open_job(frame, out, aad, collective=collective, step=step, segment=segment)()
