"""Hardware profiles: what a machine costs, as data, and where every number came from.

A profile is a TOML file whose fields are listed, with units, in :data:`FIELDS`; every
field is required, so a profile says explicitly what it assumes. (A field added after
profiles were first saved names a ``fallback`` field instead: an older profile without it
still loads, with the fallback's value marked assumed -- the ``[staging]`` fields, which
``ccddp calibrate --device cuda`` measures.) Each value is a record
(:class:`FieldValue`): the value, its :class:`Source` (measured, fitted, derived, public
spec, assumed), a note saying which measurement, fit or document it rests on, and, for
fitted or measured values, one standard error::

    [crypto]
    crypto_op_us = { value = 12.3, source = "measured", stderr = 0.4, note = "intercept ..." }

A bare number is accepted too (a profile written by hand) and counts as ASSUMED. Built-in
profiles live in ``ccddp/sim/profiles/``; ``ccddp calibrate --out PATH`` writes one
through :func:`write_profile`. Any ``--profile`` option takes a built-in name or a path.

Example::

    hw = load_profile("h100-cc")
    hw.link_gbps                       # 370.0 (GB/s per direction)
    hw.field("cc_exchange_toll_us").source   # Source.MEASURED (production CC)
    hw.assumed()                       # names of the fields nothing measured
    faster = hw.replace(enc_gbps=2 * hw.enc_gbps)
    write_profile(faster.as_records(), "/tmp/mine.toml")

Optional ``[workloads.<name>]`` tables override, per workload, what the profile would
otherwise derive from FLOPs: ``forward_ms``, ``backward_ms``, ``optimizer_ms``,
``data_ms``, ``input_bytes``, ``kernel_launches`` (see :data:`WORKLOAD_KEYS`).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ccddp.config import INT_MAX, INT_MIN, parse_toml, read_bounded
from ccddp.errors import ConfigError


class Source(str, Enum):
    """Where a profile value comes from, from most to least trustworthy."""

    MEASURED = "measured"        # measured on this machine (calibrate) or this system (a cited run)
    FITTED = "fitted"            # solved so the model reproduces one cited published number
    DERIVED = "derived"          # follows from the system's structure or from other fields
    PUBLIC_SPEC = "public spec"  # a vendor's data sheet or a standard
    ASSUMED = "assumed"          # nothing measured it: a plausible value, the first to replace


@dataclass(frozen=True)
class FieldValue:
    """One profile value with its provenance.

    ``stderr``: one standard error of a fitted or measured value, in the field's unit
    (None where no spread is known).

    Example::

        FieldValue(2.3, Source.MEASURED, "AES-256-GCM seal, one core", stderr=0.05)
    """

    value: Any
    source: Source = Source.ASSUMED
    note: str = ""
    stderr: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value, "source": self.source.value}
        if self.stderr is not None:
            d["stderr"] = self.stderr
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class Field:
    name: str
    section: str
    kind: str            # float | int | bool | str | choice
    unit: str
    doc: str
    check: str = "nonneg"  # nonneg | pos | frac (0, 1] | unit [0, 1] | ge1 | any
    choices: tuple[str, ...] = ()
    allow_inf: bool = False  # a rate that may be "free" (inf)
    # A field added after profiles were first written: a profile without it (a saved
    # calibration) still loads, with this other field's value, marked assumed.
    fallback: str = ""
    # Or a value of its own for such a profile (marked assumed), where no other field
    # stands in for it: 0 for a cost older profiles did not model.
    default: float | None = None

    @property
    def recorded(self) -> bool:
        """Whether values carry a source (every field but the name and description)."""
        return self.kind != "str"


#: Device-link protection a CC system offers (the ``device_link`` field).
DEVICE_LINKS = ("untrusted", "fenced", "encrypted")

FIELDS: tuple[Field, ...] = (
    Field("name", "profile", "str", "", "Profile name, shown in every result.", "any"),
    Field("description", "profile", "str", "", "One line: what machine this describes.", "any"),
    Field("gpus_per_node", "profile", "int", "devices", "Devices behind one host: one trust "
          "domain (a fenced group) and one NVLink domain; rings longer than this become "
          "hierarchical across nodes, relayed by CPU TEEs.", "ge1"),
    # compute
    Field("compute_tflops", "compute", "float", "TFLOP/s", "Effective forward-pass FLOP rate "
          "of one device, used when a workload gives FLOPs rather than measured times.", "pos"),
    Field("backward_ratio", "compute", "float", "x", "Backward time / forward time when derived "
          "from FLOPs (about 2).", "pos"),
    Field("optimizer_gbps", "compute", "float", "GB/s", "Gradient bytes the optimizer step "
          "processes per second (memory bound; folds in Adam's extra state traffic).", "pos"),
    Field("kernel_launch_us", "compute", "float", "us", "One kernel launch with CC off "
          "(0 on a CPU).", "nonneg"),
    Field("cc_launch_toll", "compute", "float", "x", "Kernel launch time CC-on / CC-off. "
          "Applies to crypto launches and to a workload's kernel launches.", "ge1"),
    # link
    Field("link_gbps", "link", "float", "GB/s", "Point-to-point bandwidth per device per "
          "direction between ring neighbours (NVLink, or gloo loopback on a CPU host).", "pos"),
    Field("link_latency_us", "link", "float", "us", "Latency of one message.", "nonneg"),
    Field("nvls", "link", "bool", "", "CC-off all-reduce may reduce in the switch (NVLink "
          "SHARP).", "any"),
    Field("reduce_gbps", "link", "float", "GB/s", "Element-wise sum rate, bytes of one "
          "operand per second.", "pos"),
    Field("segment_overhead_us", "link", "float", "us", "Software cost per message a ring "
          "schedule posts (isend/irecv/wait; Python-level on a CPU host). Paid by secure and "
          "plaintext P2P schedules, not by the library's own all-reduce.", "nonneg"),
    Field("link_cpu_gbps", "link", "float", "GB/s", "Bytes per second one host core moves "
          "through the link's software path, counting each byte sent (a ring step also "
          "receives as many): the core time a transfer takes from ranks that share host cores "
          "(gloo over loopback TCP copies through the kernel at both ends). inf where the link "
          "has its own engine (NVLink, RDMA DMA), so transfers cost no core time.", "pos",
          allow_inf=True),
    Field("cc_exchange_toll_us", "link", "float", "us", "Fixed extra cost of every "
          "cross-device operation in CC mode (firmware bookkeeping, not wire encryption).",
          "nonneg"),
    Field("cc_bandwidth_kept", "link", "float", "fraction", "Large-transfer link bandwidth "
          "kept in CC mode.", "frac"),
    # trust
    Field("device_link", "trust", "choice", "", "What protects the device link inside a "
          "node in CC mode: 'untrusted' (nothing: every hop must be sealed in software, the "
          "paper's threat model and ccddp's on a CPU host), 'fenced' (the node's devices "
          "form one trust domain and the link carries plaintext inside it: Hopper CC), "
          "'encrypted' (the hardware encrypts the link: Blackwell CC). Links between nodes "
          "always leave the trust domain.", "any", DEVICE_LINKS),
    Field("cc_nvls", "trust", "bool", "", "The switch may still reduce in CC mode (its "
          "NVSwitch is inside the trust boundary: Hopper; Blackwell turns multicast off). "
          "Sealed data is never reduced in a switch.", "any"),
    # crypto
    Field("enc_gbps", "crypto", "float", "GB/s", "AES-CTR rate of one seal (keystream + XOR). "
          "Device-wide on a GPU; per thread when chains_scale_enc.", "pos"),
    Field("dec_gbps", "crypto", "float", "GB/s", "The same for one open.", "pos"),
    Field("mac_gbps", "crypto", "float", "GB/s", "GHASH rate of ONE chain (GHASH is serial "
          "per chain; chains run in parallel). inf when enc/dec rates already include the MAC "
          "(stitched CPU AES-GCM).", "pos", allow_inf=True),
    Field("mac_chains", "crypto", "int", "chains", "Default chains per message (multi-chain "
          "MAC on a device; crypto threads on a CPU). 0: ccddp's automatic rule, the host's "
          "cores shared by the ranks on it (needs host_cores > 0).", "nonneg"),
    Field("max_chains", "crypto", "int", "chains", "Chains beyond this add nothing (device "
          "parallelism, or cores a rank may use).", "ge1"),
    Field("chains_scale_enc", "crypto", "bool", "", "Chains are threads running whole "
          "AES-GCM (CPU), so they also divide the CTR part.", "any"),
    Field("crypto_op_us", "crypto", "float", "us", "Fixed cost of one seal or open call, "
          "besides its kernel launch: setup, key schedule, AAD, Python call.", "nonneg"),
    Field("op_fixed_us", "crypto", "float", "us", "Fixed cost of one sealed collective "
          "call beyond the plaintext one: descriptor, frame setup (specs, arena, slots, "
          "AADs), posts; per rank per op (per bucket all-reduce). Paid once per call on top "
          "of the per-seal, per-tag and per-message costs; measured by `ccddp calibrate` as "
          "what a small sealed all-reduce costs beyond gloo's that the rest of the model does "
          "not explain. 0 in a profile written before the field existed.", "nonneg",
          default=0.0),
    Field("op_bucket_share", "crypto", "float", "fraction", "Share of the naive ring's "
          "seal/open byte cost that scales with the whole bucket rather than the chunk it "
          "seals: 0 for an engine that seals what it sends (ccddp's secure-naive); an "
          "emulation whose crypto kernels run beside the library's all-reduce on the whole "
          "bucket has 1. ccddp's other schedules always seal what they send.", "unit"),
    Field("tag_us", "crypto", "float", "us", "Fixed cost per tag: finalize, compare, "
          "metadata. Batched MAC pays it once per batch.", "nonneg"),
    Field("tag_bytes", "crypto", "float", "B", "Metadata sent per tag (tag + counter).",
          "nonneg"),
    Field("xor_gbps", "crypto", "float", "GB/s", "Rate of applying a pre-computed pad "
          "(pad pre-computation).", "pos"),
    Field("envelope_chains", "crypto", "int", "chains", "Most chains any measurement or fit "
          "behind this profile used: `tune` stays at or below it unless told otherwise.",
          "ge1"),
    Field("envelope_min_bytes", "crypto", "float", "B", "Smallest message one measured or "
          "fitted seal/open covered: `tune` proposes no smaller segment unless told "
          "otherwise.", "pos"),
    Field("envelope_max_bytes", "crypto", "float", "B", "Largest message one measured or "
          "fitted seal/open covered (the fixed + per-byte line is extrapolated beyond).",
          "pos"),
    # bounce / input path
    Field("pcie_gbps", "bounce", "float", "GB/s", "Host-to-device input rate, CC off.", "pos"),
    Field("cc_pcie_kept", "bounce", "float", "fraction", "Host-to-device bandwidth kept "
          "through the CC bounce buffer.", "frac"),
    Field("cpu_crypto_gbps", "bounce", "float", "GB/s", "AES-GCM rate of one CPU-TEE core "
          "(input sealing, inter-node relay).", "pos"),
    Field("cpu_crypto_threads", "bounce", "int", "cores", "CPU-TEE cores for AES-GCM, shared "
          "by the node's input sealing and inter-node relays.", "ge1"),
    Field("bounce_threads", "bounce", "int", "cores", "Cores sealing one device's batch "
          "(loader or driver threads).", "ge1"),
    Field("bounce_pipelined", "bounce", "bool", "", "CPU seal, PCIe copy and device open "
          "of the input overlap (driver staging) rather than run one after another.", "any"),
    Field("input_path_shared", "bounce", "bool", "", "One host prepares and sends every "
          "device's batch, so data + transfer time grow with devices per node.", "any"),
    # host staging of device frames (placement "staged": device -> pinned host, OpenSSL,
    # pinned host -> device) beside the device engine; see ccddp.sim.placement
    Field("staging_d2h_gbps", "staging", "float", "GB/s", "Device-to-host copy rate into "
          "page-locked (pinned) host memory, per byte: the first leg of a frame staged through "
          "host OpenSSL. A memory copy on a CPU host.", "pos", fallback="pcie_gbps"),
    Field("staging_h2d_gbps", "staging", "float", "GB/s", "Pinned host-to-device copy rate, "
          "per byte: the last leg of a staged frame, and the bounce path's ciphertext copy.",
          "pos", fallback="pcie_gbps"),
    Field("staging_copy_us", "staging", "float", "us", "Fixed cost of one staging copy, "
          "either direction (enqueue, DMA setup, the wait for it).", "nonneg",
          fallback="kernel_launch_us"),
    # inter-node
    Field("inter_node_gbps", "internode", "float", "GB/s", "Network bandwidth of one node.",
          "pos"),
    Field("inter_node_latency_us", "internode", "float", "us", "Network latency.", "nonneg"),
    # host sharing
    Field("host_cores", "host", "int", "cores", "0: ranks own accelerators. >0: ranks run on "
          "this many shared host cores, so their work contends.", "nonneg"),
    Field("compute_threads", "host", "int", "threads", "Threads one rank's compute uses when "
          "alone (only with host_cores > 0).", "ge1"),
    Field("overlap_efficiency", "host", "float", "fraction", "Share of communication busy "
          "time that hides under backward compute; 1 on accelerators, ~0 when both run on the "
          "same cores.", "unit"),
    Field("interference", "host", "float", "fraction", "Only with host_cores > 0: how much "
          "longer communication work takes when it time-shares cores with backward compute "
          "than alone (caches, TLBs and memory bandwidth shared beyond the time slice, "
          "context switches) with one compute thread per core; the model scales it by the "
          "compute threads per core (ranks x compute_threads / host_cores, at least 1). "
          "0 on accelerators.", "nonneg"),
)

WORKLOAD_KEYS: dict[str, str] = {
    "forward_ms": "measured forward time of one iteration, ms",
    "backward_ms": "measured backward time, ms",
    "optimizer_ms": "optimizer step time, ms",
    "data_ms": "data loading/preprocessing per device per iteration, ms",
    "input_bytes": "bytes of one device's batch sent host-to-device",
    "kernel_launches": "kernel launches per iteration that pay the CC launch toll",
}

_BY_NAME = {f.name: f for f in FIELDS}
SECTIONS = tuple(dict.fromkeys(f.section for f in FIELDS))
_RECORD_KEYS = {"value", "source", "note", "stderr"}


@dataclass(frozen=True)
class HardwareProfile:
    """A validated hardware profile; see :data:`FIELDS` for every field's unit and meaning.
    Attributes hold the plain values; :meth:`field` gives a value's provenance.

    Example::

        hw = load_profile("paper-h100")
        hw.workload_overrides("gpt2-xl")   # {'forward_ms': ..., ...}
        hw.field("crypto_op_us").note      # which published number it was fitted to
    """

    name: str
    description: str
    gpus_per_node: int
    compute_tflops: float
    backward_ratio: float
    optimizer_gbps: float
    kernel_launch_us: float
    cc_launch_toll: float
    link_gbps: float
    link_latency_us: float
    nvls: bool
    reduce_gbps: float
    segment_overhead_us: float
    link_cpu_gbps: float
    cc_exchange_toll_us: float
    cc_bandwidth_kept: float
    device_link: str
    cc_nvls: bool
    enc_gbps: float
    dec_gbps: float
    mac_gbps: float
    mac_chains: int
    max_chains: int
    chains_scale_enc: bool
    crypto_op_us: float
    op_fixed_us: float
    op_bucket_share: float
    tag_us: float
    tag_bytes: float
    xor_gbps: float
    envelope_chains: int
    envelope_min_bytes: float
    envelope_max_bytes: float
    pcie_gbps: float
    cc_pcie_kept: float
    cpu_crypto_gbps: float
    cpu_crypto_threads: int
    bounce_threads: int
    bounce_pipelined: bool
    input_path_shared: bool
    staging_d2h_gbps: float
    staging_h2d_gbps: float
    staging_copy_us: float
    inter_node_gbps: float
    inter_node_latency_us: float
    host_cores: int
    compute_threads: int
    overlap_efficiency: float
    interference: float
    workloads: dict[str, dict[str, float]] = field(default_factory=dict, compare=False)
    source: str = field(default="", compare=False)
    provenance: dict[str, FieldValue] = field(default_factory=dict, compare=False, repr=False)

    @property
    def sealed_inside_node(self) -> bool:
        """Whether gradients must be sealed in software on the device link (no fence, no
        hardware encryption protects it in CC mode)."""
        return self.device_link == "untrusted"

    def field(self, name: str) -> FieldValue:
        """The record of field ``name``: value, source, note, standard error."""
        if name not in _BY_NAME:
            raise ConfigError(f"unknown profile field '{name}'")
        got = self.provenance.get(name)
        return got if got is not None else FieldValue(getattr(self, name), Source.ASSUMED)

    def assumed(self) -> list[str]:
        """Names of the fields whose value nothing measured, fitted or specified."""
        return [f.name for f in FIELDS if f.recorded and self.field(f.name).source
                is Source.ASSUMED]

    def workload_overrides(self, name: str) -> dict[str, float]:
        """Per-workload measured values this profile carries (empty if none)."""
        return dict(self.workloads.get(name, {}))

    def as_dict(self) -> dict[str, Any]:
        """Flat dict of every field's plain value plus ``workloads`` (JSON rows, arithmetic)."""
        d = {f.name: getattr(self, f.name) for f in FIELDS}
        d["workloads"] = {k: dict(v) for k, v in self.workloads.items()}
        return d

    def as_records(self) -> dict[str, Any]:
        """Every field as its :class:`FieldValue` (name and description as strings) plus
        ``workloads``; round-trips through :func:`write_profile`."""
        d: dict[str, Any] = {f.name: self.field(f.name) if f.recorded else getattr(self, f.name)
                             for f in FIELDS}
        d["workloads"] = {k: dict(v) for k, v in self.workloads.items()}
        return d

    def replace(self, **changes: Any) -> "HardwareProfile":
        """A validated copy with some fields changed: a plain value keeps nothing of the old
        record's provenance (it becomes ASSUMED, "set by the caller"); pass a
        :class:`FieldValue` to say where it comes from."""
        d = self.as_records()
        for k, v in changes.items():
            if k in _BY_NAME and _BY_NAME[k].recorded and not isinstance(v, FieldValue):
                v = FieldValue(v, Source.ASSUMED, "set by the caller")
            d[k] = v
        return validate_profile(d, source=self.source)


def _check_value(f: Field, value: Any) -> Any:
    where = f"profile field '{f.name}'"
    if f.kind in ("str", "choice"):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        if f.kind == "choice" and value not in f.choices:
            raise ConfigError(f"{where} must be one of {', '.join(f.choices)}, got {value!r}")
        return value
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number ({f.unit}), got {value!r}")
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        # Before anything converts it to a float (OverflowError) or prints it.
        raise ConfigError(f"{where} is an integer outside a 64-bit field")
    if math.isnan(value):
        raise ConfigError(f"{where} must be a number ({f.unit}), got nan")
    if value < 0:
        raise ConfigError(f"{where} must not be negative, got {value}")
    if f.check == "pos" and value == 0:
        raise ConfigError(f"{where} must be > 0, got {value}")
    if f.check == "ge1" and value < 1:
        raise ConfigError(f"{where} must be >= 1, got {value}")
    if f.check == "frac" and not 0 < value <= 1:
        raise ConfigError(f"{where} must be in (0, 1], got {value}")
    if f.check == "unit" and not value <= 1:
        raise ConfigError(f"{where} must be in [0, 1], got {value}")
    if f.kind == "int":
        if value != int(value) or math.isinf(value):
            raise ConfigError(f"{where} must be an integer, got {value}")
        return int(value)
    if math.isinf(value) and not f.allow_inf:
        raise ConfigError(f"{where} must be finite, got {value}")
    return float(value)


def _record(f: Field, raw: Any) -> FieldValue:
    """A field's record from a FieldValue, a TOML inline table or a bare value."""
    where = f"profile field '{f.name}'"
    if isinstance(raw, FieldValue):
        rec = raw
    elif isinstance(raw, Mapping):
        extra = sorted(set(raw) - _RECORD_KEYS)
        if extra or "value" not in raw:
            raise ConfigError(f"{where}: a record has keys value, source, note, stderr"
                              + (f"; got '{extra[0]}'" if extra else "; 'value' is missing"))
        try:
            src = Source(raw.get("source", Source.ASSUMED.value))
        except ValueError:
            raise ConfigError(f"{where}: source must be one of "
                              f"{', '.join(s.value for s in Source)}, got {raw.get('source')!r}"
                              ) from None
        note = raw.get("note", "")
        stderr = raw.get("stderr")
        if not isinstance(note, str):
            raise ConfigError(f"{where}: note must be a string")
        if stderr is not None and (isinstance(stderr, bool) or not isinstance(stderr, (int, float))
                                   or not stderr >= 0):
            raise ConfigError(f"{where}: stderr must be a non-negative number, got {stderr!r}")
        rec = FieldValue(raw["value"], src, note, None if stderr is None else float(stderr))
    else:
        rec = FieldValue(raw, Source.ASSUMED, "no source given")
    return FieldValue(_check_value(f, rec.value), Source(rec.source), rec.note, rec.stderr)


def _flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Accept both the sectioned TOML layout and a flat dict."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, Mapping) and key not in _BY_NAME:
            for k, v in value.items():
                if k in flat:
                    raise ConfigError(f"profile field '{k}' is given twice")
                flat[k] = v
        else:
            if key in flat:
                raise ConfigError(f"profile field '{key}' is given twice")
            flat[key] = value
    return flat


def validate_profile(data: Mapping[str, Any], *, source: str = "<dict>") -> HardwareProfile:
    """Check every field and build the profile; ConfigError names the first bad field.
    Values may be plain, :class:`FieldValue` records or ``{value, source, note, stderr}``
    tables."""
    flat = _flatten(data)
    workloads = flat.pop("workloads", {}) or {}
    unknown = sorted(set(flat) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"{source}: unknown profile field '{unknown[0]}'")
    values: dict[str, Any] = {}
    records: dict[str, FieldValue] = {}
    for f in FIELDS:
        if f.name not in flat and f.fallback:
            flat[f.name] = FieldValue(values[f.fallback], Source.ASSUMED,
                                      f"not in this profile (written before the field existed): "
                                      f"{f.fallback}'s value")
        if f.name not in flat:
            if f.default is None:
                raise ConfigError(f"{source}: profile field '{f.name}' is missing ({f.doc})")
            flat[f.name] = FieldValue(f.default, Source.ASSUMED,
                                      "not in this profile (written before the field existed)")
        try:
            if f.recorded:
                records[f.name] = _record(f, flat[f.name])
                values[f.name] = records[f.name].value
            else:
                values[f.name] = _check_value(f, flat[f.name])
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    if values["mac_chains"] == 0 and values["host_cores"] == 0:
        raise ConfigError(f"{source}: profile field 'mac_chains' = 0 (automatic: host cores "
                          "shared by the ranks) needs host_cores > 0")
    if values["envelope_min_bytes"] > values["envelope_max_bytes"]:
        raise ConfigError(f"{source}: profile field 'envelope_min_bytes' is larger than "
                          "'envelope_max_bytes'")
    if not isinstance(workloads, Mapping):
        raise ConfigError(f"{source}: [workloads] must be a table of tables")
    clean: dict[str, dict[str, float]] = {}
    for wname, over in workloads.items():
        if not isinstance(over, Mapping):
            raise ConfigError(f"{source}: [workloads.{wname}] must be a table")
        for k, v in over.items():
            key = f"workloads.{wname}.{k}"
            if k not in WORKLOAD_KEYS:
                raise ConfigError(f"{source}: unknown profile field '{key}'")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                    or (isinstance(v, int) and v > INT_MAX) or math.isinf(v):
                raise ConfigError(f"{source}: profile field '{key}' must be a finite "
                                  f"non-negative number, got {v!r}")
        clean[wname] = {k: float(v) for k, v in over.items()}
    return HardwareProfile(**values, workloads=clean, source=source, provenance=records)


def builtin_names() -> list[str]:
    """Names of the profiles shipped with ccddp."""
    root = resources.files("ccddp.sim") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a built-in profile by name (``paper-h100``, ``h100-cc``, ``h200-cc``,
    ``b300-cc``, ``local``) or a TOML file by path.

    Example::

        load_profile("b300-cc").device_link  # 'encrypted'
        load_profile("./calibrated.toml")
    """
    text_name = str(name_or_path)
    path = Path(text_name)
    if path.suffix == ".toml" or path.exists() or "/" in text_name:
        if not path.is_file():
            raise ConfigError(f"profile file not found: {text_name}")
        raw = read_bounded(path, what=f"profile {text_name}")
        source = str(path)
    else:
        res = resources.files("ccddp.sim") / "profiles" / f"{text_name}.toml"
        if not res.is_file():
            raise ConfigError(f"unknown profile {text_name!r}; built-in: "
                              f"{', '.join(builtin_names())}, or give a path to a .toml file")
        raw = res.read_bytes()
        source = text_name
    # Size, UTF-8, nesting and integers checked before and after tomllib (ccddp.config).
    return validate_profile(parse_toml(raw, what=source), source=source)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return repr(v)


def _toml_record(rec: FieldValue) -> str:
    parts = [f"value = {_toml_value(rec.value)}", f"source = {_toml_value(rec.source.value)}"]
    if rec.stderr is not None:
        parts.append(f"stderr = {_toml_value(float(rec.stderr))}")
    if rec.note:
        parts.append(f"note = {_toml_value(rec.note)}")
    return "{ " + ", ".join(parts) + " }"


def write_profile(data: Mapping[str, Any], path: str | Path, *,
                  header: list[str] | None = None) -> Path:
    """Validate ``data`` (flat or sectioned; values plain or :class:`FieldValue`) and write
    it as a commented TOML profile, every field a record with its source and note.

    This is the API ``ccddp calibrate --out PATH`` uses. Example::

        d = load_profile("local").as_records()
        d["enc_gbps"] = FieldValue(2.31, Source.MEASURED, "seal, one thread", stderr=0.02)
        write_profile(d, "local.toml", header=["calibrated today"])
    """
    hw = validate_profile(data, source=str(path))
    lines = ["# ccddp hardware profile (schema: ccddp.sim.profile.FIELDS)",
             "# Every value: { value, source (measured | fitted | derived | public spec | "
             "assumed), stderr, note }."]
    lines += [f"# {h}".rstrip() for h in (header or [])]
    lines.append("")
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for f in FIELDS:
            if f.section == section:
                unit = f" [{f.unit}]" if f.unit else ""
                lines.extend(textwrap.wrap(f"{f.doc}{unit}", 88, initial_indent="# ",
                                           subsequent_indent="# "))
                value = _toml_record(hw.field(f.name)) if f.recorded else \
                    _toml_value(getattr(hw, f.name))
                lines.append(f"{f.name} = {value}")
        lines.append("")
    for wname, over in sorted(hw.workloads.items()):
        lines.append(f'[workloads."{wname}"]')
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in over.items())
        lines.append("")
    out = Path(path)
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def describe_fields() -> str:
    """The schema as a plain-text table (for docs and ``--help`` epilogs)."""
    rows = [f"[{f.section}] {f.name} ({f.unit or f.kind}): {f.doc}" for f in FIELDS]
    rows += [f"[workloads.<name>] {k}: {v}" for k, v in WORKLOAD_KEYS.items()]
    return "\n".join(rows)


__all__ = ["FIELDS", "WORKLOAD_KEYS", "DEVICE_LINKS", "Source", "FieldValue",
           "HardwareProfile", "load_profile", "write_profile", "validate_profile",
           "builtin_names", "describe_fields"]
