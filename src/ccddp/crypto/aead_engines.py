"""Which AES-256-GCM implementation runs a buffer, and the buffers it is handed.

Invariants:

- the engine follows the buffers: host memory (bytes, bytearrays, memoryviews, numpy
  arrays, CPU tensors) goes through OpenSSL (``cryptography``'s ``AESGCM``), device tensors
  (contiguous 1-D uint8) through the Triton engine (``ccddp.crypto.device``);
  :attr:`AeadEngine.TRITON` sends every buffer there (CPU ones through Triton's
  interpreter: for tests). A frame and its plaintext on different devices, or a device
  tensor beside a host buffer, are refused (:class:`~ccddp.errors.FrameFormatError`);
- both engines write the same frames (``ciphertext || tag``, NIST SP 800-38D) for the same
  key, nonce, AAD and plaintext, so the choice is local: peers may choose differently;
- buffers are used in place: host ones through views (CPU tensors as numpy arrays), and
  for the Triton engine as 1-D uint8 tensors over the same memory; only a read-only input
  is copied. Output never overlaps input (``cryptography`` 51 refuses it);
- an open that fails raises ``InvalidTag``: the Triton engine leaves zeros in ``out``,
  OpenSSL may leave unverified plaintext, so the caller wipes ``out`` (:func:`wipe`) before
  it lets the failure go on (the channel does);
- nothing here takes a nonce, counts frames or keeps state between frames, besides one
  key's engines (:class:`AeadKey`); a device engine is built on first use, and neither
  torch nor Triton is imported before a buffer needs them.

Example::

    aead = AeadKey(key)
    device = device_of(AeadEngine.AUTO, plaintext, frame, link="0->1")   # None: OpenSSL
    seal_into(aead, device, nonce, plaintext, aad, frame)
    try:
        open_into(aead, device, nonce, frame, aad, out)
    except InvalidTag:
        wipe(out, device)
        raise
"""

from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ccddp.errors import ConfigError, FrameFormatError

if TYPE_CHECKING:
    import torch

    from ccddp.crypto.device import DeviceAESGCM


class AeadEngine(enum.Enum):
    """Which AES-GCM implementation seals a channel's buffers."""

    AUTO = "auto"        # OpenSSL for host memory, Triton for device tensors
    TRITON = "triton"    # Triton for every buffer (CPU ones through its interpreter)


def engine_named(value: AeadEngine | str) -> AeadEngine:
    """The engine ``value`` names, or a :class:`~ccddp.errors.ConfigError` listing them."""
    try:
        return AeadEngine(value)
    except ValueError:
        raise ConfigError(f"aead_engine must be one of {', '.join(e.value for e in AeadEngine)}, "
                          f"got {value!r}") from None


class AeadKey:
    """One key's engines: OpenSSL's, made with the key, and the Triton engine's, made on
    first use (its key schedule is uploaded to the device then)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.openssl = AESGCM(key)
        self._device: DeviceAESGCM | None = None

    def device(self) -> DeviceAESGCM:
        if self._device is None:
            from ccddp.crypto.device import DeviceAESGCM

            self._device = DeviceAESGCM(self._key)
        return self._device

    def __repr__(self) -> str:
        return "AeadKey(...)"


def _tensor_type():
    """torch.Tensor if torch is loaded (a buffer can only be a tensor then), else None."""
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def device_of(engine: AeadEngine, *buffers: Any, link: str = "?") -> torch.device | None:
    """The torch device whose Triton engine handles these buffers, or None for OpenSSL."""
    tensor = _tensor_type()
    devices = {b.device for b in buffers if tensor is not None and isinstance(b, tensor) and b.device.type != "cpu"}
    if devices:
        if len(devices) > 1 or not all(isinstance(b, tensor) and b.device in devices for b in buffers):
            raise FrameFormatError("a frame and its plaintext must be on the same device", link=link)
        return devices.pop()
    if engine is AeadEngine.TRITON:
        import torch

        return torch.device("cpu")
    return None


def as_host(buf: Any) -> Any:
    """A buffer OpenSSL can read or write: CPU tensors as numpy views."""
    tensor = _tensor_type()
    return buf.numpy() if tensor is not None and isinstance(buf, tensor) else buf


def as_tensor(buf: Any):
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


def seal_into(aead: AeadKey, device, nonce: bytes, plaintext, aad: bytes, frame, *, pad=None,
              pad_offset: int = 0) -> None:
    """Write ``ciphertext || tag`` into ``frame`` with the engine of ``device`` (None:
    OpenSSL). ``pad``: an arena holding this nonce's keystream at ``pad_offset`` (Triton
    only), already written as far as the current stream is concerned."""
    if device is None:
        aead.openssl.encrypt_into(nonce, as_host(plaintext), aad, as_host(frame))
        return
    plaintext, frame = as_tensor(plaintext), as_tensor(frame)
    if pad is None:
        aead.device().encrypt_into(nonce, plaintext, aad, frame)
    else:
        from ccddp.crypto.device import Segment

        aead.device().encrypt_segments([Segment(nonce, aad, 0, plaintext.numel(), 0, pad_offset)],
                                       plaintext, frame, pad=pad)


def open_into(aead: AeadKey, device, nonce: bytes, frame, aad: bytes, out, *, pad=None, pad_offset: int = 0) -> None:
    """Verify ``frame`` and write its plaintext into ``out``, or raise ``InvalidTag`` (then
    ``out`` may hold unverified plaintext: :func:`wipe` it). ``pad`` as for :func:`seal_into`."""
    if device is None:
        aead.openssl.decrypt_into(nonce, as_host(frame), aad, as_host(out))
        return
    frame, out = as_tensor(frame), as_tensor(out)
    if pad is None:
        aead.device().decrypt_into(nonce, frame, aad, out)
    else:
        from ccddp.crypto.device import Segment

        aead.device().decrypt_segments([Segment(nonce, aad, 0, out.numel(), 0, pad_offset)], frame, out, pad=pad)


def wipe(out, device, nbytes: int) -> None:
    """Zero the ``nbytes`` of ``out`` after a failed open. OpenSSL writes plaintext before it
    checks the tag; the Triton engine has written zeros already, which are left as they are."""
    if device is None:
        memoryview(as_host(out)).cast("B")[:] = bytes(nbytes)
