"""One direction of one secure link: AES-256-GCM with counter nonces.

The nonce is ``link id (32 bits) || message counter (64 bits)``. Both ends keep the
counter; it is never read from the wire, so a replayed, reordered or dropped frame is
opened with the wrong nonce and fails its tag. Counters are taken in program order by
the thread that schedules the work (``seal_job``/``open_job``), and the returned jobs can
then run on any thread: that is how segments of one message are sealed in parallel
(multi-chain) while both ends still agree on every nonce.

The key is ratcheted (HKDF) every ``rotate_after`` messages; the counter keeps counting,
so no (key, nonce) pair can repeat.

The AES-GCM engine follows the buffers: host memory (bytes, numpy arrays, CPU tensors)
goes through OpenSSL, device tensors (uint8, 1-D) through the Triton engine
(``ccddp.crypto.device``); ``aead_engine="triton"`` sends every buffer there (CPU ones
through Triton's interpreter: for tests). Both write the same frames. With a
``pad_budget`` the channel keeps keystream for its next counters on the device (pads,
refilled after each device frame, or ahead of the first with :meth:`prepare_pads`), so a
device seal or open that finds its pad skips AES. A job that used a pad releases it with a
fence recorded on the stream it launched its kernels on: the pad's bytes are refilled only
once those kernels are done, and a job waits on its pad's own keystream kernel before it
launches, so refills and frames may run on different streams.

Example::

    tx = LinkChannel(key, link_id=1, name="0->1")
    rx = LinkChannel(key, link_id=1, name="0->1")
    frame = bytearray(len(data) + TAG_BYTES)
    tx.seal(data, frame, aad)
    out = bytearray(len(data))
    rx.open(frame, out, aad)      # raises IntegrityError on any change
"""

from __future__ import annotations

import enum
import hashlib
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import ratchet
from ccddp.errors import ConfigError, FrameFormatError, IntegrityError

if TYPE_CHECKING:
    from ccddp.crypto.device import DeviceAESGCM, Pad, PadBuffer, PadEvent

TAG_BYTES = 16
NONCE_BYTES = 12
DEFAULT_ROTATE_AFTER = 1 << 32
# One AES-GCM call takes at most 2**31-1 bytes (OpenSSL's int lengths); larger messages
# ("one tag per message", the naive schedule) are cut into frames of at most this size.
MAX_FRAME_BYTES = 1 << 30

Job = Callable[[], None]
NonceRecorder = Callable[[bytes, bytes], None]
PadRecorder = Callable[["PadEvent", bytes, bytes], None]


class AeadEngine(enum.Enum):
    """Which AES-GCM implementation seals a channel's buffers."""

    AUTO = "auto"        # OpenSSL for host memory, Triton for device tensors
    TRITON = "triton"    # Triton for every buffer (CPU ones through its interpreter)


@dataclass
class _EpochKey:
    """The key of one epoch and its engines (the device one made on first use)."""

    epoch: int
    key: bytes
    openssl: AESGCM
    key_id: bytes
    _device: DeviceAESGCM | None = field(default=None, repr=False)

    def device(self) -> DeviceAESGCM:
        if self._device is None:
            from ccddp.crypto.device import DeviceAESGCM

            self._device = DeviceAESGCM(self.key)
        return self._device


@dataclass(frozen=True)
class _Ticket:
    """What one frame's job needs: its epoch's key, its nonce, its pad if one was made and
    the buffer that holds it (the channel may replace its buffer before the job runs)."""

    key: _EpochKey
    nonce: bytes
    pad: Pad | None = None
    pads: PadBuffer | None = None


def _tensor_type():
    """torch.Tensor if torch is loaded (a buffer can only be a tensor then), else None."""
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def _as_host(buf: Any) -> Any:
    """A buffer OpenSSL can read or write: CPU tensors as numpy views."""
    tensor = _tensor_type()
    return buf.numpy() if tensor is not None and isinstance(buf, tensor) else buf


def _as_tensor(buf: Any):
    """A 1-D uint8 tensor over the same memory (host buffers: a CPU tensor view; a
    read-only one is copied, which only inputs can be)."""
    import numpy as np
    import torch

    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
            raise FrameFormatError("tensor buffers must be contiguous 1-D uint8 tensors")
        return buf
    arr = np.asarray(buf) if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise FrameFormatError("buffers must be contiguous")
    arr = arr.reshape(-1).view(np.uint8)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy())


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
        try:
            self.aead_engine = AeadEngine(aead_engine)
        except ValueError:
            raise ConfigError(f"aead_engine must be one of {', '.join(e.value for e in AeadEngine)}, "
                              f"got {aead_engine!r}") from None
        self.name = name
        self.link_id = link_id
        self.rotate_after = rotate_after
        self.counters = counters if counters is not None else CryptoCounters()
        self.recorder = recorder
        self.pad_budget = pad_budget
        self.pad_recorder = pad_recorder
        self._pads: PadBuffer | None = None
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
        return _EpochKey(epoch, key, AESGCM(key), hashlib.sha256(key).digest()[:8])

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def epoch(self) -> int:
        return self._key.epoch

    def _nonce(self, counter: int) -> bytes:
        return struct.pack(">IQ", self.link_id, counter)

    def _device_of(self, *buffers):
        """The torch device whose engine handles these buffers, or None for OpenSSL."""
        tensor = _tensor_type()
        devices = {b.device for b in buffers if tensor is not None and isinstance(b, tensor) and b.device.type != "cpu"}
        if devices:
            if len(devices) > 1 or not all(isinstance(b, tensor) and b.device in devices for b in buffers):
                raise FrameFormatError("a frame and its plaintext must be on the same device", link=self.name)
            return devices.pop()
        if self.aead_engine is AeadEngine.TRITON:
            import torch

            return torch.device("cpu")
        return None

    def _take(self, device=None, nbytes: int = 0) -> _Ticket:
        with self._lock:
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
            pads, pad = self._pads, None
            if device is not None and pads is not None and pads.device == device:
                pad = pads.take(counter, epoch, nbytes)
            if pad is None:
                return _Ticket(self._key, nonce)
            if self.pad_recorder is not None:
                from ccddp.crypto.device import PadEvent

                self.pad_recorder(PadEvent.USED, self._key.key_id, nonce)
            return _Ticket(self._key, nonce, pad, pads)

    # -- pads ----------------------------------------------------------------------
    def prepare_pads(self, nbytes: int, device) -> int:
        """Generate keystream for this link's next frames of up to ``nbytes`` bytes on
        ``device``, within the pad budget (none if it is 0); return how many pads wait."""
        import torch

        device = torch.device(device)
        with self._lock:
            self._refill(nbytes, device)
            return self._pads.ready() if self._pads is not None else 0

    def _refill(self, nbytes: int, device) -> None:
        """Top up the pads (caller holds the lock): counters not taken yet, this epoch only
        (the next epoch's key does not exist before its first frame)."""
        from ccddp.crypto.device import PadBuffer, PadEvent, pad_bytes

        if self.pad_budget < pad_bytes(nbytes) or self.failure is not None:
            return
        if self._pads is None or self._pads.device != device:
            self._pads = PadBuffer(self.pad_budget, device)
        key = self._key
        if self._counter // self.rotate_after != key.epoch:
            return
        made = self._pads.refill(key.device(), self._nonce, next_counter=self._counter, epoch=key.epoch,
                                 epoch_end=(key.epoch + 1) * self.rotate_after, nbytes=nbytes)
        if self.pad_recorder is not None:
            for p in made:
                self.pad_recorder(PadEvent.MADE, key.key_id, self._nonce(p.counter))

    def _release_pad(self, ticket: _Ticket, device) -> None:
        """The frame's kernels are launched (or failed to): its pad's bytes may be written
        again once what this thread launched on its current stream, them included, is done."""
        if ticket.pad is not None:
            # Through the module, not a name bound once: tests swap in fences they control.
            from ccddp.crypto.device import pads as device_pads

            fence = device_pads.stream_fence(device)
            with self._lock:
                ticket.pads.release(ticket.pad, fence)

    def _top_up(self, nbytes: int, device) -> None:
        """After a device frame: pads for the next frames, assumed of the same size."""
        if self.pad_budget:
            with self._lock:
                self._refill(nbytes, device)

    # -- frames --------------------------------------------------------------------
    def seal_job(self, plaintext, frame, aad: bytes) -> Job:
        """Take the next nonce now; return a job that writes ``ciphertext || tag`` into ``frame``.

        A frame buffer of the wrong size is refused before a nonce is taken: the refusal
        leaves the channel as it was (same next counter, same pads), so the peer, which
        never sees the refused frame, stays in step.
        """
        device = self._device_of(plaintext, frame)
        n = len(plaintext)
        if len(frame) != n + TAG_BYTES:
            raise FrameFormatError(f"frame buffer is {len(frame)} bytes, expected {n + TAG_BYTES}", link=self.name)
        ticket = self._take(device, n)
        counters = self.counters

        def job() -> None:
            t0 = time.perf_counter()
            if device is None:
                ticket.key.openssl.encrypt_into(ticket.nonce, _as_host(plaintext), aad, _as_host(frame))
            else:
                try:
                    self._device_seal(ticket, _as_tensor(plaintext), aad, _as_tensor(frame))
                finally:
                    self._release_pad(ticket, device)
            counters.add_frame(True, n, time.perf_counter() - t0)
            if device is not None:
                self._top_up(n, device)

        return job

    def _device_seal(self, ticket: _Ticket, plaintext, aad: bytes, frame) -> None:
        aead = ticket.key.device()
        if ticket.pad is None:
            aead.encrypt_into(ticket.nonce, plaintext, aad, frame)
        else:
            from ccddp.crypto.device import Segment

            ticket.pad.written.wait()
            aead.encrypt_segments([Segment(ticket.nonce, aad, 0, plaintext.numel(), 0, ticket.pad.offset)],
                                  plaintext, frame, pad=ticket.pads.arena)

    def _device_open(self, ticket: _Ticket, frame, aad: bytes, out) -> None:
        aead = ticket.key.device()
        if ticket.pad is None:
            aead.decrypt_into(ticket.nonce, frame, aad, out)
        else:
            from ccddp.crypto.device import Segment

            ticket.pad.written.wait()
            aead.decrypt_segments([Segment(ticket.nonce, aad, 0, out.numel(), 0, ticket.pad.offset)],
                                  frame, out, pad=ticket.pads.arena)

    def open_job(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
                 segment: int | None = None) -> Job:
        """Take the next expected nonce now; return a job that verifies ``frame`` and writes
        the plaintext into ``out``, or zeroes ``out`` and raises :class:`IntegrityError`."""
        device = self._device_of(frame, out)
        n = len(out)
        ticket = self._take(device, n)
        counters = self.counters

        def job() -> None:
            if len(frame) != n + TAG_BYTES:
                self.failure = "truncated or padded frame"
                raise FrameFormatError(f"frame is {len(frame)} bytes, expected {n + TAG_BYTES}",
                                       link=self.name, collective=collective, step=step, segment=segment)
            t0 = time.perf_counter()
            try:
                if device is None:
                    ticket.key.openssl.decrypt_into(ticket.nonce, _as_host(frame), aad, _as_host(out))
                else:
                    try:
                        # The device engine writes no unverified plaintext: out is zeros on failure.
                        self._device_open(ticket, _as_tensor(frame), aad, _as_tensor(out))
                    finally:
                        self._release_pad(ticket, device)
            except InvalidTag:
                if device is None:
                    # OpenSSL writes plaintext before it checks the tag: never leave it behind.
                    memoryview(_as_host(out)).cast("B")[:] = bytes(n)
                self.failure = f"authentication failed in {collective} step {step}" + (
                    f" segment {segment}" if segment is not None else "")
                raise IntegrityError("frame failed authentication (tampered, replayed, reordered, "
                                     "dropped, spliced or wrong key)",
                                     link=self.name, collective=collective, step=step,
                                     segment=segment) from None
            counters.add_frame(False, n, time.perf_counter() - t0)
            if device is not None:
                self._top_up(n, device)

        return job

    def seal(self, plaintext, frame, aad: bytes) -> None:
        self.seal_job(plaintext, frame, aad)()

    def open(self, frame, out, aad: bytes, *, collective: str = "?", step: int | None = None,
             segment: int | None = None) -> None:
        self.open_job(frame, out, aad, collective=collective, step=step, segment=segment)()
