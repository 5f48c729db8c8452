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

from dataclasses import dataclass

import torch

from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import SESSION_ID_BYTES
from ccddp.errors import ConfigError

_BOUNCE_LINK = 0xFFFE0000


@dataclass
class StagedTensor:
    frame: torch.Tensor  # uint8: ciphertext || tag
    shape: tuple
    dtype: torch.dtype


class BouncePath:
    """Seals batches on the CPU side and opens them on the device side.

    ``key`` must be fresh for this run (derive it from the group's session, e.g.
    ``derive_purpose_key(group.secret, group.session_id, f"bounce/{rank}")``): its counter
    starts at zero, so a key used by an earlier path would repeat nonces. ``session_id``
    (the group's) is bound into every frame's AAD.
    """

    def __init__(self, key: bytes, *, session_id: bytes, counters: CryptoCounters | None = None,
                 device: str | torch.device = "cpu") -> None:
        if len(session_id) != SESSION_ID_BYTES or not any(session_id):
            raise ConfigError(f"BouncePath needs the group's {SESSION_ID_BYTES}-byte session id")
        self.counters = counters if counters is not None else CryptoCounters()
        self._tx = LinkChannel(key, _BOUNCE_LINK, "cpu->device", counters=self.counters)
        self._rx = LinkChannel(key, _BOUNCE_LINK, "cpu->device", counters=self.counters)
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
