"""Settings of the secure collectives, validated once and compared across ranks.

Every field is typed and bounded, however the settings arrive (``CommSettings(...)``,
``pg_options``, ``CCDDP_SETTINGS`` through :func:`settings_from_json`): a violation is a
:class:`~ccddp.errors.ConfigError` naming the field.

Example::

    s = CommSettings(impl="secure", segment_bytes=1 << 20, chains=2)
    s.fingerprint()   # equal on every rank, or the group refuses to start
    settings_from_json('{"trust_domains": [[0, 1], [2, 3]]}')
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import asdict, dataclass, fields, replace

from ccddp.chains import auto_chains
from ccddp.comm.domains import check_setting
from ccddp.config import INT_MAX, check_int, check_number
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

#: The environment variable :func:`settings_from_json` reads for the ccddp backend.
SETTINGS_ENV = "CCDDP_SETTINGS"
#: Bounds of the integer and number fields: (lowest, highest). A segment is one gloo
#: message (its length is a C int); a wait longer than ~11 days is no timeout.
INT_BOUNDS = {"segment_bytes": (1024, (1 << 31) - 1), "chains": (0, 1024), "rotate_after": (1, INT_MAX),
              "pad_budget_bytes": (0, 1 << 40)}
MAX_TIMEOUT_S = 1e6
#: ``CCDDP_SETTINGS`` is a small JSON object: larger or deeper is not settings.
MAX_SETTINGS_BYTES = 1 << 16
MAX_SETTINGS_DEPTH = 4


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
        # Types and bounds first, so the checks below compare values of the right kind, and
        # nothing later overflows (a timeout of 1e400, a segment of 10**400 bytes).
        for name, (low, high) in INT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                value = int(value)          # numpy integers too
            object.__setattr__(self, name, check_int(value, field=name, low=low, high=high))
        check_number(self.timeout_s, field="timeout_s", low=0, high=MAX_TIMEOUT_S)
        if not isinstance(self.check_descriptors, bool):
            raise ConfigError(f"check_descriptors must be true or false, got {type(self.check_descriptors).__name__}")
        for name in ("impl", "algorithm", "tag", "allgather", "aead_engine", "placement", "device_wire"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string, got {type(getattr(self, name)).__name__}")
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
        # trust_domains: agreed on by itself (the session's "trust domains" context).
        for local in ("timeout_s", "chains", "aead_engine", "pad_budget_bytes", "placement", "trust_domains"):
            d.pop(local)
        return json.dumps(d, sort_keys=True)


def settings_from_json(text: str, *, timeout_s: float | None = None, what: str = SETTINGS_ENV) -> CommSettings:
    """The :class:`CommSettings` that the JSON object ``text`` asks for (defaults for an
    empty text); its wait limit is ``timeout_s`` unless ``text`` names one itself.

    ``text`` is typically an environment variable, set by whoever started the process: it
    is bounded before it is parsed (64 KiB, 4 levels, UTF-8: an environment string holds
    the bytes that were not UTF-8 as surrogates), must be an object whose keys are
    ``CommSettings`` fields, and every field is typed and bounded. Every violation is one
    :class:`ConfigError` that names ``what`` and the field.

    Example::

        settings_from_json(os.environ.get("CCDDP_SETTINGS", ""), timeout_s=1800)
        settings_from_json('{"trust_domains": ["01"]}')
        # ConfigError: CCDDP_SETTINGS: trust_domains: domain 0 must be a list of ranks, got '01'
    """
    from ccddp.crypto.wirejson import parse_json

    text = (text or "").strip()
    if not text:
        fields_given: dict = {}
    else:
        try:
            # Back to the bytes the environment held (os.environ decodes with surrogateescape).
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as e:
            raise ConfigError(f"{what} is not UTF-8 text (character {e.start + 1})") from None
        fields_given = parse_json(data, what=what, max_bytes=MAX_SETTINGS_BYTES, max_depth=MAX_SETTINGS_DEPTH)
        if not isinstance(fields_given, dict):
            raise ConfigError(f"{what} must be a JSON object of collective settings, e.g. "
                              f'{{"trust_domains": "node"}}; got a {type(fields_given).__name__}')
    known = [f.name for f in fields(CommSettings)]
    unknown = sorted(set(fields_given) - set(known))
    if unknown:
        raise ConfigError(f"{what}: unknown setting {unknown[0][:40]!r}; the settings are {', '.join(known)}")
    if timeout_s is not None:
        fields_given.setdefault("timeout_s", timeout_s)
    try:
        return CommSettings(**fields_given)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None

