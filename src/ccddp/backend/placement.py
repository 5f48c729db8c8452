"""Device tensors in the ``ccddp`` backend: where an op is sealed, and how it is ordered
with the caller's CUDA stream.

Two placements (``CommSettings.placement``), the same frames either way:

- :attr:`Placement.DEVICE`: the op runs on the tensor in device memory; its frames are
  sealed and opened there by the Triton engine, and the transport carries the ciphertext
  through host memory (``ccddp.comm.transport``);
- :attr:`Placement.STAGED`: the tensor is copied to pinned host memory, the op runs there
  exactly as for a CPU tensor (OpenSSL), and the result is copied back -- what a CPU TEE
  relaying for a GPU does, and what NVIDIA's driver does through its bounce buffer.

``auto`` stages a call of at most 1 MiB (:func:`stages_small`: a device-engine call is a
fixed ~0.2 ms of host work); above that it takes the faster one by a calibrated profile's
measured rates (``CCDDP_PROFILE``: the TOML that ``ccddp calibrate --device cuda --out PATH``
writes), and without them the device engine when Triton is installed. Ops that ccddp runs on host memory only
(all-to-all, gather, scatter, point-to-point messages) are always staged.

Ordering, c10d's contract for device tensors (the op sees what the caller's stream wrote
before the call; after waiting on the work, the caller sees the result):

1. at the call, staging copies are queued on the caller's current stream, and then an
   event is recorded on it (:meth:`DeviceOrder.after_caller`);
2. the op's job waits for that event on the host (a staged op reads host memory), then
   runs on the group's own stream for that device, so it overlaps the caller's compute;
3. the job synchronizes that stream before the op completes: the work's future holds
   finished tensors.

Example::

    dist.init_process_group("ccddp")
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)               # sealed on the GPU (placement "device" or "auto")
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ccddp.config import read_toml
from ccddp.errors import ConfigError

PROFILE_ENV = "CCDDP_PROFILE"


class Placement(enum.Enum):
    DEVICE = "device"
    STAGED = "staged"


@dataclass(frozen=True)
class PlacementRates:
    """What decides ``auto``: seconds per byte of a large frame, sealed by the sender and
    opened by the receiver, on each placement (per-call costs left out: ``ccddp.sim``'s
    placement model has them, for the model's questions).

    The device side is priced as on the NCCL wire, frames staying in device memory. Where
    ranks share a GPU (the gloo wire) a device frame's ciphertext is copied to host and
    back too, as much as a staged one's plaintext, so the true comparison is the device
    engine against host AES-GCM alone: this one then leans toward ``device``, the
    placement that keeps plaintext on the GPU (it is chosen before the wire is known)."""

    device_s_per_byte: float
    staged_s_per_byte: float

    def faster(self) -> Placement:
        return Placement.DEVICE if self.device_s_per_byte <= self.staged_s_per_byte else Placement.STAGED


# The profile fields (GB/s) each placement's per-byte cost is made of: the device engine's
# seal and open; the copy to pinned host memory, OpenSSL's seal and open on a host core,
# and the copy back.
_DEVICE_FIELDS = ("enc_gbps", "dec_gbps")
_STAGED_FIELDS = ("staging_d2h_gbps", "cpu_crypto_gbps", "cpu_crypto_gbps", "staging_h2d_gbps")


def rates_from_profile(path: str | None = None) -> PlacementRates | None:
    """The rates of the calibrated profile (a TOML file, as ``ccddp calibrate --device
    cuda --out PATH`` writes it) at ``path`` (default: ``CCDDP_PROFILE``), or None when
    there is none or it did not measure every field both placements need on a device."""
    path = path if path is not None else os.environ.get(PROFILE_ENV, "")
    if not path:
        return None
    # Bounded and typed (ccddp.config): the path comes from the environment.
    sections = read_toml(path, what=f"{PROFILE_ENV}={path} (a calibrated profile)")
    fields = {name: entry for section in sections.values() if isinstance(section, dict)
              for name, entry in section.items() if isinstance(entry, dict)}
    measured = {}
    for name in set(_DEVICE_FIELDS + _STAGED_FIELDS):
        entry = fields.get(name, {})
        value = entry.get("value")
        if entry.get("source") != "measured" or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not (value > 0 and math.isfinite(value)):
            return None       # an assumed rate must not steer the choice
        measured[name] = float(value)
    return PlacementRates(sum(1 / (measured[f] * 1e9) for f in _DEVICE_FIELDS),
                          sum(1 / (measured[f] * 1e9) for f in _STAGED_FIELDS))


def choose(setting: str, device: torch.device, *, triton: bool, rates: PlacementRates | None) -> Placement:
    """The placement of ops on ``device`` under the setting ``setting``.

    Example::

        choose("auto", torch.device("cuda:0"), triton=True, rates=None)   # Placement.DEVICE
    """
    if device.type == "cpu":
        raise ValueError("host tensors have no placement: they are sealed where they are")
    if setting == Placement.STAGED.value:
        return Placement.STAGED
    if setting == Placement.DEVICE.value:
        if not triton:
            raise ConfigError("placement 'device' seals in device memory with the Triton engine, which is not "
                              "installed: pip install 'ccddp[gpu]', or use placement 'staged'")
        return Placement.DEVICE
    if not triton:
        return Placement.STAGED
    return rates.faster() if rates is not None else Placement.DEVICE


#: Under placement ``auto``, a CUDA op of at most this many bytes is staged through host
#: memory whatever the device's placement (issue 42). A device-engine seal or open is a fixed
#: cost of host work (descriptor table and AAD uploads, two or three kernel launches, the
#: tag masks) and an open adds a device-to-host sync for its verdict: ~0.2 ms each on an
#: H100 at 4 KiB, where OpenSSL seals 4 KiB in about a microsecond. Measured (2 ranks on
#: one H100, gloo wire): staged 2.4-2.7x gloo at 4 KiB-1 MiB, device 5.3-8.1x.
STAGE_SMALL_BYTES = 1 << 20


def stages_small(setting: str, nbytes: int) -> bool:
    """Whether an op of ``nbytes`` (its largest tensor) on CUDA tensors is staged through
    host memory because it is small: only under placement ``auto`` (``device`` and
    ``staged`` are the user's word). Every rank decides alike -- the size is the op's, in
    its descriptor -- so the frames of one op take one wire on every rank."""
    return setting == "auto" and nbytes <= STAGE_SMALL_BYTES


def stage_out(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A host working copy of ``t`` (its contents copied now, queued on the caller's
    stream; pinned for a CUDA tensor) and what copies the result back (run by the op)."""
    cuda = t.device.type == "cuda"
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
    host.copy_(t, non_blocking=cuda)
    return host, lambda: t.copy_(host, non_blocking=cuda)


def stage_in(t: torch.Tensor) -> torch.Tensor:
    """A host copy of the input ``t`` (queued on the caller's stream)."""
    return stage_out(t)[0]


class DeviceOrder:
    """The group's streams, one per device, and the ordering of an op's job with the
    caller's stream (see the module's invariants)."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def after_caller(self, job: Callable[[], None], device: torch.device) -> Callable[[], None]:
        """``job``, made to run after what the caller's current stream on ``device`` has
        queued so far (call this after queueing the op's staging copies)."""
        ready = torch.cuda.current_stream(device).record_event()

        def ordered() -> None:
            ready.synchronize()
            stream = self._stream(device)
            try:
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    job()
            finally:
                stream.synchronize()

        return ordered
