"""Schedules: how the secure all-reduce is run, with the names the real implementation uses.

- ``naive``: the paper's emulation (``secure-naive``): seal the whole chunk, send, receive,
  open, reduce; nothing overlaps.
- ``pipelined``: ccddp's ``secure``: chunks cut into ``segment_bytes`` segments; sealing
  segment i+1 overlaps the transfer of i and the open of i-1, and segments flow across ring
  steps without waiting for the whole chunk.
- ``group-key-allgather``: ``pipelined`` reduce-scatter, then an all-gather that forwards
  ciphertext under a group key: (n-1)+1 seals instead of 2(n-1).
- ``native`` (model only): the CC system as it is: inside a node the library's own
  all-reduce, protected by the system rather than sealed in software (Hopper CC fences the
  node's devices into one trust domain and leaves NVLink in plaintext inside it;
  Blackwell CC encrypts NVLink in hardware), paying CC's per-exchange toll at the
  bandwidth CC keeps, with the switch reduction only where the switch is inside the trust
  boundary; between nodes a CPU-TEE relay. Refused for profiles whose device link is
  untrusted (the paper's emulation, a CPU host), where it would send gradients in the
  clear.

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

from ccddp.chains import auto_chains
from ccddp.errors import ConfigError

SCHEDULES = ("naive", "pipelined", "group-key-allgather", "native")
ALGORITHMS = ("ring", "tree")
TAGS = ("segment", "message")
MIB = 1 << 20


@dataclass(frozen=True)
class Schedule:
    """Settings of the CC-on all-reduce (``chains=None``: the profile's ``mac_chains``, or
    ccddp's automatic rule where that is 0; ``bucket_cap_mb=None``: the workload's own
    bucket plan)."""

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

    def chains_for(self, hw: Any, n: int = 1) -> int:
        """Chains a rank of an ``n``-rank job runs: these settings', else the profile's,
        else (``mac_chains = 0``) the rule ccddp's collectives apply: the host's cores
        shared by the ranks on it."""
        if self.chains is not None:
            return int(self.chains)
        if hw.mac_chains:
            return int(hw.mac_chains)
        return auto_chains(hw.host_cores, min(n, hw.gpus_per_node))

    @property
    def sealed(self) -> bool:
        """Whether this schedule seals gradients in software."""
        return self.schedule != "native"

    @property
    def segmented(self) -> bool:
        """Whether chunks are cut into pipelined segments."""
        return self.schedule not in ("naive", "native") and self.tag == "segment"

    @classmethod
    def default_for(cls, hw: Any, **settings: Any) -> "Schedule":
        """The schedule a system runs unless told otherwise: its native protection where
        its device link is protected (production CC), else ccddp's pipelined one."""
        return cls("native" if hw.device_link != "untrusted" else "pipelined", **settings)

    def with_(self, **changes: Any) -> "Schedule":
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["Schedule", "SCHEDULES", "ALGORITHMS", "TAGS"]
