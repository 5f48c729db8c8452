"""The input path of the paper's Fig. 2: CPU TEE -> encrypted bounce buffer -> device.

Three stages, each its own measured phase (:class:`BouncePhases`):

1. **host seal** -- the loader side (the CPU TEE) seals each batch tensor with OpenSSL
   into a host staging buffer, page-locked when the batch goes to a CUDA device (so the
   copy is a DMA the host does not wait for);
2. **copy to device** -- the ciphertext goes to the device: on CUDA on a copy stream of
   the path's own, and with :meth:`BouncePath.prefetch` one batch ahead (while batch i is
   used, batch i+1's ciphertext is already on its way);
3. **device open** -- the Triton engine (:class:`ccddp.crypto.device.DeviceAESGCM`) opens
   the frame where it is used.

Which side opens is the :class:`Opener`: ``device`` (the three stages above; the default
for a CUDA device) or ``host`` (OpenSSL opens on the CPU and the plaintext is copied: the
default on a CPU-only machine, where both ends are this process and the crypto is still
real). ``opener="device"`` with ``device="cpu"`` runs the device open through Triton's
interpreter on CPU tensors: the same code as on a GPU, for tests (correct, not fast).

Invariants:

- every frame is OpenSSL's: the loader seals with OpenSSL, and what crosses to the device
  is those bytes, unchanged (the Triton engine reads the same frames it would write);
- nothing unverified is returned: a batch comes back only when every one of its frames
  verified (a failed frame raises :class:`~ccddp.errors.IntegrityError`; the engines leave
  zeros, never plaintext, in its output, and the batch's other tensors are dropped);
- a device open runs after its copy in stream order (the consumer's stream waits on the
  copy's event), and a pinned staging buffer is not written again before the copy that
  reads it has finished (torch's pinned-memory cache holds a block until such copies are
  done);
- the loader and the opener agree on every nonce and AAD by counting batches each on its
  own side, never by reading them from the staged buffers.

On a GPU without confidential computing, this path is the study's emulation of what
CC's bounce buffer costs (:data:`EMULATION_NOTE`, carried by :meth:`BouncePath.describe`
into every result that reports it).

Example::

    path = BouncePath(key, session_id=group.session_id, device="cuda")
    for batch in path.prefetch(loader):     # batch i+1 sealed and copying while i is used
        loss = model(**batch)
    path.phases.snapshot()                  # {"seal_s", "copy_s", "open_s", "batches"}
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, fields
from typing import Iterable, Iterator

import torch

from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase
from ccddp.crypto.channel import AeadEngine
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import KEY_BYTES, SESSION_ID_BYTES, _hkdf
from ccddp.errors import ConfigError

_BOUNCE_LINK = 0xFFFE0000
_SALT_BYTES = 32
_LABEL = b"ccddp/v1/bounce/path-key"

#: What a result measured through this path on a GPU says about itself.
EMULATION_NOTE = ("emulation: ccddp seals each batch on the host (OpenSSL), copies the ciphertext and "
                  "opens it on the device (Triton). On a GPU without confidential computing this is the "
                  "study's emulation of what CC's bounce buffer costs, not a measurement of NVIDIA CC "
                  "(whose driver encrypts the copy itself)")
#: What a result measured through the interpreter says about itself.
INTERPRETER_NOTE = ("correctness only: the device open ran in Triton's interpreter on the CPU; its times "
                    "are not a speed of anything")


class Opener(str, enum.Enum):
    """Which side opens a staged batch."""

    HOST = "host"        # OpenSSL on the CPU, then the plaintext is copied to the device
    DEVICE = "device"    # the ciphertext is copied, the Triton engine opens it on the device


@dataclass
class BouncePhases:
    """Seconds spent in each stage, summed over the batches opened so far.

    ``seal_s`` is host wall time; on CUDA ``copy_s`` and ``open_s`` are device times
    (CUDA events: a prefetched copy overlaps the previous batch's use, so its time is not
    part of anyone's wall time), elsewhere wall times. A batch's phases are added when it
    is opened (only then are its copy's events complete), all three at once.
    """

    seal_s: float = 0.0
    copy_s: float = 0.0
    open_s: float = 0.0
    batches: int = 0

    def add(self, seal_s: float, copy_s: float, open_s: float) -> None:
        self.seal_s += seal_s
        self.copy_s += copy_s
        self.open_s += open_s
        self.batches += 1

    def snapshot(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def diff(after: dict, before: dict) -> dict:
        return {k: after[k] - before[k] for k in after}


@dataclass
class StagedTensor:
    """One sealed tensor: ``frame`` (uint8 ciphertext || tag) in host staging memory, and,
    once copied, ``device_frame`` (the same bytes in the opener's memory)."""

    frame: torch.Tensor
    shape: tuple
    dtype: torch.dtype
    device_frame: torch.Tensor | None = None


class StagedBatch(dict):
    """A sealed batch: its tensors by name (:class:`StagedTensor`, as a dict), and what the
    path records about it on the way (``seal_s``; the copy's timing once sent)."""

    def __init__(self, tensors: dict[str, StagedTensor], seal_s: float) -> None:
        super().__init__(tensors)
        self.seal_s = seal_s
        self.copy: _Copy | None = None


@dataclass
class _Copy:
    """One batch's copy to the device: seconds (CPU), or the events around it on the
    path's copy stream (CUDA; read once the consumer has waited on ``done``)."""

    seconds: float = 0.0
    start: object = None
    done: object = None

    def elapsed_s(self) -> float:
        if self.done is None:
            return self.seconds
        self.done.synchronize()
        return self.start.elapsed_time(self.done) / 1e3


class BouncePath:
    """Seals batches on the CPU side and opens them on the device side.

    ``key`` (32 bytes) is the CPU<->device key, e.g.
    ``derive_purpose_key(group.secret, group.session_id, f"bounce/{rank}")``;
    ``session_id`` (the group's) is bound into every frame's AAD. ``device``: where
    batches are used; ``opener``: :class:`Opener` (default: ``device`` for a GPU,
    ``host`` for the CPU).

    The path does not seal under ``key`` itself: it seals under a key of its own, derived
    from ``key`` with HKDF and 32 fresh random bytes drawn when it is made. Its counter
    starts at zero, and with the given key that would repeat (key, nonce) pairs whenever a
    caller hands the same key to a second path (two loaders, a restarted loop, a key kept
    across runs). With a key that no other path has -- both ends live in this object, so
    no one else needs it -- no (key, nonce) pair can repeat whatever key it is given,
    unless two paths draw the same 32 random bytes. A frame staged by one path therefore
    opens only in that path.

    Example::

        a = BouncePath(key, session_id=sid)
        b = BouncePath(key, session_id=sid)       # the same key: still its own nonces
        a.receive(a.stage(batch))                 # opens
        b.receive(a.stage(batch))                 # IntegrityError: sealed by another path
    """

    def __init__(self, key: bytes, *, session_id: bytes, counters: CryptoCounters | None = None,
                 device: str | torch.device = "cpu", opener: Opener | str | None = None) -> None:
        if len(session_id) != SESSION_ID_BYTES or not any(session_id):
            raise ConfigError(f"BouncePath needs the group's {SESSION_ID_BYTES}-byte session id")
        if len(key) != KEY_BYTES:
            raise ConfigError(f"BouncePath needs a {KEY_BYTES}-byte key, got {len(key)} bytes")
        self.device = torch.device(device)
        self.opener = _opener_for(opener, self.device)
        self.counters = counters if counters is not None else CryptoCounters()
        self.phases = BouncePhases()
        # This path's own key (see the class docstring): counters that start at zero
        # never meet a key another path sealed under.
        own = _hkdf(bytes(key), _fresh_salt(), _LABEL)
        self._tx = LinkChannel(own, _BOUNCE_LINK, "cpu->device", counters=self.counters)
        # The device opener forces the Triton engine: CUDA frames would pick it anyway,
        # CPU ones (tests) run it in the interpreter.
        engine = AeadEngine.TRITON if self.opener is Opener.DEVICE else AeadEngine.AUTO
        self._rx = LinkChannel(own, _BOUNCE_LINK, "cpu->device", counters=self.counters, aead_engine=engine)
        self.session_id = session_id
        self.cuda = self.device.type == "cuda"
        # Page-locked staging only where a DMA reads it; the copy stream only where a copy
        # can overlap the consumer's work.
        self.pinned = self.cuda
        self._copy_stream = torch.cuda.Stream(self.device) if self.cuda and self.opener is Opener.DEVICE else None
        self._staged_batches = 0
        self._sent_batches = 0
        self._opened_batches = 0

    # -- what the path reports -------------------------------------------------------
    @property
    def batches_staged(self) -> int:
        """Batches sealed on the host so far."""
        return self._staged_batches

    @property
    def batches_sent(self) -> int:
        """Batches whose ciphertext was sent to the device (device opener) so far."""
        return self._sent_batches

    @property
    def batches_opened(self) -> int:
        """Batches opened and handed to the consumer so far."""
        return self._opened_batches

    def describe(self) -> dict:
        """How this path runs, for a result file: device, opener, engines, and the note a
        reader needs (GPU: :data:`EMULATION_NOTE`; interpreter: :data:`INTERPRETER_NOTE`)."""
        d = {"device": str(self.device), "opener": self.opener.value, "seal_engine": "openssl",
             "open_engine": "triton" if self.opener is Opener.DEVICE else "openssl",
             "pinned_staging": self.pinned, "copy_stream": self._copy_stream is not None}
        if self.cuda:
            d["note"] = EMULATION_NOTE
        elif self.opener is Opener.DEVICE:
            d["note"] = INTERPRETER_NOTE
        return d

    # -- the three stages ------------------------------------------------------------
    def _aad(self, batch: int, index: int, t_bytes: int, dtype: torch.dtype) -> bytes:
        return FrameContext(self.session_id, batch, Op.BOUNCE, Phase.NONE, 0, index, 0, 0, t_bytes,
                            str(dtype).removeprefix("torch.")).pack()

    def stage(self, batch: dict[str, torch.Tensor]) -> StagedBatch:
        """Host seal: every tensor of ``batch`` (host tensors) into its own staging buffer."""
        t0 = time.perf_counter()
        staged = {}
        for i, (name, t) in enumerate(sorted(batch.items())):
            if t.device.type != "cpu":
                raise ConfigError(f"the loader side seals host tensors; batch tensor {name!r} is on {t.device}")
            plain = _bytes_of(t.detach().contiguous())
            frame = torch.empty(plain.numel() + TAG_BYTES, dtype=torch.uint8, pin_memory=self.pinned)
            self._tx.seal(plain.numpy(), frame.numpy(), self._aad(self._staged_batches, i, plain.numel(), t.dtype))
            self.counters.add_message(sealed=True)
            staged[name] = StagedTensor(frame, tuple(t.shape), t.dtype)
        self._staged_batches += 1
        return StagedBatch(staged, time.perf_counter() - t0)

    def send(self, staged: StagedBatch) -> StagedBatch:
        """Copy to device: start copying ``staged``'s ciphertext to the device (device
        opener; on CUDA asynchronously, on the path's copy stream). Returns ``staged``."""
        if self.opener is not Opener.DEVICE:
            raise ConfigError("only the device opener copies ciphertext to the device; the host opener "
                              "opens on the host and copies the plaintext")
        if staged.copy is not None:
            raise ConfigError("this batch was already sent")
        staged.copy = self._copy_to_cuda(staged) if self.cuda else self._copy_on_host(staged)
        self._sent_batches += 1
        return staged

    def _copy_on_host(self, staged: StagedBatch) -> _Copy:
        """The device is the CPU: the copy into the opener's own buffer stands for PCIe."""
        t0 = time.perf_counter()
        for st in staged.values():
            st.device_frame = st.frame.clone()
        return _Copy(seconds=time.perf_counter() - t0)

    def _copy_to_cuda(self, staged: StagedBatch) -> _Copy:
        consumer = torch.cuda.current_stream(self.device)
        # Device frames are allocated on the consumer's stream, which opens and frees them
        # after waiting on this copy; the copy stream first waits for the consumer, whose
        # pending work may still use the memory the allocator hands out here.
        frames = [torch.empty(st.frame.numel(), dtype=torch.uint8, device=self.device) for st in staged.values()]
        copy = _Copy(start=torch.cuda.Event(enable_timing=True), done=torch.cuda.Event(enable_timing=True))
        self._copy_stream.wait_stream(consumer)
        with torch.cuda.stream(self._copy_stream):
            copy.start.record(self._copy_stream)
            for st, dst in zip(staged.values(), frames):
                dst.copy_(st.frame, non_blocking=True)
                st.device_frame = dst
            copy.done.record(self._copy_stream)
        return copy

    def receive(self, staged: StagedBatch) -> dict[str, torch.Tensor]:
        """Open every staged tensor on the opener's side and return the batch on the
        device (raises ``IntegrityError``, returning nothing, if any frame was changed)."""
        if self.opener is Opener.DEVICE:
            if getattr(staged, "copy", None) is None:
                self.send(staged)
            out, copy_s, open_s = self._open_on_device(staged)
        else:
            out, copy_s, open_s = self._open_on_host(staged)
        self.phases.add(getattr(staged, "seal_s", 0.0), copy_s, open_s)
        self._opened_batches += 1
        return out

    def _open_on_host(self, staged: dict[str, StagedTensor]) -> tuple[dict, float, float]:
        batch = self._opened_batches
        out, copy_s = {}, 0.0
        t0 = time.perf_counter()
        for i, (name, st) in enumerate(sorted(staged.items())):
            t = torch.empty(st.shape, dtype=st.dtype, pin_memory=self.pinned)
            plain = _bytes_of(t)
            self._rx.open(st.frame.numpy(), plain.numpy(), self._aad(batch, i, plain.numel(), st.dtype),
                          collective="bounce", step=batch)
            self.counters.add_message(sealed=False)
            c0 = time.perf_counter()
            out[name] = t.to(self.device)
            copy_s += time.perf_counter() - c0
        return out, copy_s, time.perf_counter() - t0 - copy_s

    def _open_on_device(self, staged: StagedBatch) -> tuple[dict, float, float]:
        batch = self._opened_batches
        start = end = None
        if self.cuda:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(staged.copy.done)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(consumer)
        t0 = time.perf_counter()
        out = {}
        for i, (name, st) in enumerate(sorted(staged.items())):
            t = torch.empty(st.shape, dtype=st.dtype, device=self.device)
            plain = _bytes_of(t)
            # The engine checks the tag before it writes: a failed frame leaves zeros.
            self._rx.open(st.device_frame, plain, self._aad(batch, i, plain.numel(), st.dtype),
                          collective="bounce", step=batch)
            self.counters.add_message(sealed=False)
            out[name] = t
        open_s = time.perf_counter() - t0
        if self.cuda:
            end.record(consumer)
            end.synchronize()
            open_s = start.elapsed_time(end) / 1e3
        return out, staged.copy.elapsed_s(), open_s

    # -- one batch ahead ---------------------------------------------------------------
    def prefetch(self, batches: Iterable[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of ``batches``, opened on the device, with the next one sealed and
        on its way before each is handed out.

        Example::

            for batch in path.prefetch(loader):
                path.batches_sent == path.batches_opened + 1   # until the last batch
        """
        source = iter(batches)
        ahead = self._stage_next(source)
        try:
            while ahead is not None:
                current = ahead
                ahead = self._stage_next(source)
                yield self.receive(current)
        except GeneratorExit:
            # A consumer that stops early leaves one batch sealed but unopened: open it
            # (and drop it), so the opener's counters stay in step with the loader's and
            # the path can take further batches. (After a failure the link is closed, and
            # the failure itself is what the consumer sees.)
            if ahead is not None:
                self.receive(ahead)
            raise

    def _stage_next(self, source: Iterator[dict[str, torch.Tensor]]) -> StagedBatch | None:
        batch = next(source, None)
        if batch is None:
            return None
        staged = self.stage(batch)
        return self.send(staged) if self.opener is Opener.DEVICE else staged


def _fresh_salt() -> bytes:
    """The random bytes that make a path's own key (a function, so a test can fix them
    and check frames against OpenSSL byte for byte)."""
    return os.urandom(_SALT_BYTES)


def _opener_for(opener: Opener | str | None, device: torch.device) -> Opener:
    """The opener asked for, checked against the device; by default the device's own."""
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"the bounce path runs on cpu or cuda devices, got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"the bounce path on {device} needs a CUDA device; none is available here")
    if opener is None:
        return Opener.DEVICE if device.type == "cuda" else Opener.HOST
    try:
        chosen = Opener(opener)
    except ValueError:
        raise ConfigError(f"opener must be one of {', '.join(o.value for o in Opener)}, got {opener!r}") from None
    if chosen is Opener.DEVICE:
        from ccddp.crypto.device import interpreting, triton_available

        if not triton_available():
            raise ConfigError("the device opener needs Triton: pip install 'ccddp[gpu]'")
        if device.type == "cpu" and not interpreting():
            raise ConfigError("the device opener on CPU tensors needs Triton's interpreter: set "
                              "TRITON_INTERPRET=1 before starting Python")
    return chosen


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a 1-D uint8 view (an empty one on its device)."""
    return t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)
