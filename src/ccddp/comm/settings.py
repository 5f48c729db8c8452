"""Settings of the secure collectives, validated once and compared across ranks.

Example::

    s = CommSettings(impl="secure", segment_bytes=1 << 20, chains=2)
    s.fingerprint()   # equal on every rank, or the group refuses to start
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace

from ccddp.chains import auto_chains
from ccddp.comm.domains import check_setting
from ccddp.crypto.channel import DEFAULT_ROTATE_AFTER, AeadEngine
from ccddp.errors import ConfigError

#: The engine's schedules: the unsealed ring (the trust-domain hierarchy's, inside a domain)
#: and the two sealed ones. gloo's own plaintext collectives, the CC-off reference of
#: measurements, are no engine schedule (``ccddp.bench.reference``).
IMPLS = ("ring", "secure-naive", "secure")
ALGORITHMS = ("ring", "tree")
TAGS = ("segment", "message")
ALLGATHER_MODES = ("per-link", "group-key")
PLACEMENTS = ("auto", "device", "staged")
DEVICE_WIRES = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class CommSettings:
    """How collectives run.

    - ``impl``: ``secure`` (pipelined segments, the default), ``secure-naive`` (the
      paper's emulation: seal whole chunk, send, receive, open, reduce) or ``ring``
      (the same schedule as ``secure``, unsealed: inside a trust domain, and as a
      measurement's crypto-free baseline).
    - ``algorithm``: ``ring`` or ``tree`` (binary tree: reduce up, broadcast down).
    - ``segment_bytes``: pipelining unit of ``secure``/``ring``, and the bytes one tag covers
      when ``tag="segment"`` (multi-chain: segments verified in parallel).
    - ``tag``: ``segment`` (one tag per segment) or ``message`` (one tag per chunk message,
      the batched-MAC end: fewest tags, no pipelining inside a chunk).
    - ``chains``: crypto threads sealing/opening segments in parallel; 1 runs crypto on
      the calling thread (still overlapped with transfer, which gloo runs on its own
      threads); 0 (default) picks ``cores // local ranks``, at least 1.
    - ``allgather``: ``per-link`` keys (default) or ``group-key`` (forward ciphertext; see docs).
    - ``rotate_after``: messages per link key before the key is ratcheted.
    - ``timeout_s``: how long any wait on a peer may take before ``PeerTimeoutError``.
    - ``check_descriptors``: exchange a sealed descriptor (op, length, dtype, settings) with
      each neighbour, in the same round trip as the collective's data (which then travels
      on a tag derived from it), so mismatches fail with a clear message.
    - ``aead_engine``: ``auto`` (OpenSSL for host memory, the Triton engine for device
      tensors) or ``triton`` (the Triton engine for every frame; CPU ones through Triton's
      interpreter, for checks). Frames are the same either way.
    - ``pad_budget_bytes``: keystream each link may keep generated ahead on the device
      (pads); 0 = none.
    - ``placement``: where a device (CUDA) tensor's frames are sealed: ``device`` (in
      device memory, by the Triton engine), ``staged`` (copied to pinned host memory and
      sealed by OpenSSL, as a CPU TEE relaying for a GPU would) or ``auto`` (from the
      measured rates of a calibrated profile, else the device engine when Triton is
      installed). Frames are the same either way; CPU tensors are not affected.
    - ``device_wire``: what carries the sealed device frames of the pipelined collectives
      (``secure``): ``nccl`` (an internal NCCL communicator, one GPU per rank), ``gloo``
      (the ciphertext copied to host memory: any number of ranks per GPU) or ``auto``
      (NCCL where every rank of the group has a GPU of its own, else gloo). Every rank
      must ask for the same.
    - ``trust_domains``: which ranks share a trust boundary (:mod:`ccddp.comm.domains`):
      ``"rank"`` (default: every link sealed), ``"node"`` or a list of rank lists. The
      ccddp backend's all-reduce, broadcast and reduce-scatter (equal chunks) run
      hierarchically over domains, plaintext only inside one.
    """

    impl: str = "secure"
    algorithm: str = "ring"
    # 4 MiB: gloo costs ~50-100 us of CPU per message, so on a CPU-bound host fewer,
    # larger segments beat deeper pipelines (measured in BENCHMARKS.md).
    segment_bytes: int = 4 << 20
    tag: str = "segment"
    chains: int = 0
    allgather: str = "per-link"
    rotate_after: int = DEFAULT_ROTATE_AFTER
    timeout_s: float = 60.0
    check_descriptors: bool = True
    aead_engine: str = AeadEngine.AUTO.value
    pad_budget_bytes: int = 0
    placement: str = "auto"
    device_wire: str = "auto"
    trust_domains: object = "rank"

    def __post_init__(self) -> None:
        # Canonical (hashable) form: a name, or a tuple of tuples of ranks.
        object.__setattr__(self, "trust_domains", check_setting(self.trust_domains))
        if self.impl not in IMPLS:
            raise ConfigError(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.tag not in TAGS:
            raise ConfigError(f"tag must be one of {', '.join(TAGS)}, got {self.tag!r}")
        if self.allgather not in ALLGATHER_MODES:
            raise ConfigError(f"allgather must be one of {', '.join(ALLGATHER_MODES)}, got {self.allgather!r}")
        if self.segment_bytes < 1024:
            raise ConfigError(f"segment_bytes must be >= 1024, got {self.segment_bytes}")
        if self.chains < 0:
            raise ConfigError(f"chains must be >= 0 (0 = automatic), got {self.chains}")
        if self.rotate_after < 1:
            raise ConfigError(f"rotate_after must be >= 1, got {self.rotate_after}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        engines = tuple(e.value for e in AeadEngine)
        if self.aead_engine not in engines:
            raise ConfigError(f"aead_engine must be one of {', '.join(engines)}, got {self.aead_engine!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.device_wire not in DEVICE_WIRES:
            raise ConfigError(f"device_wire must be one of {', '.join(DEVICE_WIRES)}, got {self.device_wire!r}")
        if self.pad_budget_bytes < 0:
            raise ConfigError(f"pad_budget_bytes must be >= 0, got {self.pad_budget_bytes}")

    @property
    def secure(self) -> bool:
        return self.impl in ("secure", "secure-naive")

    def with_(self, **changes) -> "CommSettings":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)

    def resolved_chains(self) -> int:
        """Crypto threads to use on this rank: cores shared by the ranks of this node."""
        if self.chains:
            return self.chains
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return auto_chains(os.cpu_count() or 1, local)

    def channel_options(self) -> dict:
        """What every link channel of a group is built with, besides its key and counter."""
        return {"rotate_after": self.rotate_after, "aead_engine": self.aead_engine,
                "pad_budget": self.pad_budget_bytes}

    def fingerprint(self) -> str:
        """Everything two ranks must agree on (timeouts, local thread counts, the local
        crypto engine and the placement of device tensors, whose frames are the same
        either way, may differ; the trust-domain setting is agreed on by itself)."""
        d = self.as_dict()
        # trust_domains: agreed on by itself (SecureGroup's "trust domains" context).
        for local in ("timeout_s", "chains", "aead_engine", "pad_budget_bytes", "placement", "trust_domains"):
            d.pop(local)
        return json.dumps(d, sort_keys=True)
