"""The input path of the paper's Fig. 2: CPU TEE -> encrypted bounce buffer -> device.

The loader side seals each batch tensor into a staging buffer with the CPU<->device key;
the device side opens it before forward. On a CPU-only machine both ends are in one
process, but the crypto is real and timed as its own phase.

Example::

    path = BouncePath(key, session_id=group.session_id)
    staged = path.stage(batch)        # ciphertext only: what crosses PCIe
    batch = path.receive(staged)      # verified plaintext on the device side
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import KEY_BYTES, SESSION_ID_BYTES, _hkdf
from ccddp.errors import ConfigError

_BOUNCE_LINK = 0xFFFE0000
_SALT_BYTES = 32
_LABEL = b"ccddp/v1/bounce/path-key"


@dataclass
class StagedTensor:
    frame: torch.Tensor  # uint8: ciphertext || tag
    shape: tuple
    dtype: torch.dtype


class BouncePath:
    """Seals batches on the CPU side and opens them on the device side.

    ``key`` (32 bytes) is the CPU<->device key, e.g.
    ``derive_purpose_key(group.secret, group.session_id, f"bounce/{rank}")``;
    ``session_id`` (the group's) is bound into every frame's AAD.

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
                 device: str | torch.device = "cpu") -> None:
        if len(session_id) != SESSION_ID_BYTES or not any(session_id):
            raise ConfigError(f"BouncePath needs the group's {SESSION_ID_BYTES}-byte session id")
        if len(key) != KEY_BYTES:
            raise ConfigError(f"BouncePath needs a {KEY_BYTES}-byte key, got {len(key)} bytes")
        self.counters = counters if counters is not None else CryptoCounters()
        # This path's own key (see the class docstring): counters that start at zero
        # never meet a key another path sealed under.
        own = _hkdf(bytes(key), os.urandom(_SALT_BYTES), _LABEL)
        self._tx = LinkChannel(own, _BOUNCE_LINK, "cpu->device", counters=self.counters)
        self._rx = LinkChannel(own, _BOUNCE_LINK, "cpu->device", counters=self.counters)
        self.session_id = session_id
        self.device = torch.device(device)
        self._staged_batches = 0
        self._opened_batches = 0

    def _aad(self, batch: int, index: int, t_bytes: int, dtype: torch.dtype) -> bytes:
        return FrameContext(self.session_id, batch, Op.BOUNCE, Phase.NONE, 0, index, 0, 0, t_bytes,
                            str(dtype).removeprefix("torch.")).pack()

    def stage(self, batch: dict[str, torch.Tensor]) -> dict[str, StagedTensor]:
        """Seal every tensor of ``batch`` into its own staging buffer."""
        staged = {}
        for i, (name, t) in enumerate(sorted(batch.items())):
            plain = t.detach().contiguous().view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            frame = torch.empty(plain.numel() + TAG_BYTES, dtype=torch.uint8)
            self._tx.seal(plain.numpy(), frame.numpy(), self._aad(self._staged_batches, i, plain.numel(), t.dtype))
            self.counters.add_message(sealed=True)
            staged[name] = StagedTensor(frame, tuple(t.shape), t.dtype)
        self._staged_batches += 1
        return staged

    def receive(self, staged: dict[str, StagedTensor]) -> dict[str, torch.Tensor]:
        """Open every staged tensor (raises ``IntegrityError`` if one was changed)."""
        out = {}
        batch = self._opened_batches
        for i, (name, st) in enumerate(sorted(staged.items())):
            t = torch.empty(st.shape, dtype=st.dtype)
            plain = t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            self._rx.open(st.frame.numpy(), plain.numpy(), self._aad(batch, i, plain.numel(), st.dtype),
                          collective="bounce", step=batch)
            self.counters.add_message(sealed=False)
            out[name] = t.to(self.device)
        self._opened_batches += 1
        return out
