"""Schedules: how the secure all-reduce is run, with the names the real implementation uses.

- ``naive``: the paper's emulation (``secure-naive``): seal the whole chunk, send, receive,
  open, reduce; nothing overlaps.
- ``pipelined``: ccddp's ``secure``: chunks cut into ``segment_bytes`` segments; sealing
  segment i+1 overlaps the transfer of i and the open of i-1, and segments flow across ring
  steps without waiting for the whole chunk.
- ``group-key-allgather``: ``pipelined`` reduce-scatter, then an all-gather that forwards
  ciphertext under a group key: (n-1)+1 seals instead of 2(n-1).
- ``hw-link`` (model only): the library's own all-reduce under CC where the hardware
  encrypts the device link (Blackwell NVLink): no software crypto inside a node, only CC's
  tolls, and no NVLS (CC turns multicast off). Refused for profiles whose link is
  plaintext (Hopper), where it would send gradients in the clear.

``tag="message"`` puts one tag on each chunk (no pipelining inside it, as in
``ccddp.comm``); ``mac_batch=k`` with ``tag="segment"`` models seed 002's batched MAC (one
tag per k segments, verified lazily before the collective returns). ``pad_budget_bytes``
models seed 002's pad pre-computation: each peer's pad table holds that many keystream
bytes, refilled once per iteration while links idle (forward, optimizer) and drained by
backward's bursts of all-reduces; sealing/opening covered bytes costs an XOR.

Example::

    Schedule("pipelined", segment_bytes=4 << 20, chains=8)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ccddp.errors import ConfigError

SCHEDULES = ("naive", "pipelined", "group-key-allgather", "hw-link")
ALGORITHMS = ("ring", "tree")
TAGS = ("segment", "message")
MIB = 1 << 20


@dataclass(frozen=True)
class Schedule:
    """Settings of the CC-on all-reduce (``chains=None``: the profile's ``mac_chains``;
    ``bucket_cap_mb=None``: the workload's own bucket plan)."""

    schedule: str = "pipelined"
    algorithm: str = "ring"
    bucket_cap_mb: float | None = None
    # ccddp.comm.CommSettings' default, so "pipelined" models what ccddp runs.
    segment_bytes: int = 4 * MIB
    chains: int | None = None
    tag: str = "segment"
    mac_batch: int = 1
    pad_budget_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, "
                              f"got {self.schedule!r}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}, "
                              f"got {self.algorithm!r}")
        if self.tag not in TAGS:
            raise ConfigError(f"tag must be one of {', '.join(TAGS)}, got {self.tag!r}")
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise ConfigError(f"bucket_cap_mb must be > 0, got {self.bucket_cap_mb}")
        if not self.segment_bytes >= 1024:
            raise ConfigError(f"segment size must be >= 1024 bytes, got {self.segment_bytes}")
        if self.chains is not None and not self.chains >= 1:
            raise ConfigError(f"chains must be >= 1, got {self.chains}")
        if not self.mac_batch >= 1:
            raise ConfigError(f"mac_batch must be >= 1, got {self.mac_batch}")
        if not self.pad_budget_bytes >= 0:
            raise ConfigError(f"pad budget must be >= 0, got {self.pad_budget_bytes}")

    def chains_for(self, hw: Any) -> int:
        return int(self.chains if self.chains is not None else hw.mac_chains)

    @property
    def segmented(self) -> bool:
        """Whether chunks are cut into pipelined segments."""
        return self.schedule != "naive" and self.tag == "segment"

    def with_(self, **changes: Any) -> "Schedule":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["Schedule", "SCHEDULES", "ALGORITHMS", "TAGS"]
