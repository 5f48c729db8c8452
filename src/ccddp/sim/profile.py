"""Hardware profiles: what a machine costs, as data.

A profile is a TOML file whose fields are listed, with units, in :data:`FIELDS`; every
field is required, so a profile says explicitly what it assumes. Built-in profiles live in
``ccddp/sim/profiles/`` and cite their sources in comments; ``ccddp calibrate --out PATH``
writes a ``local`` profile through :func:`write_profile`. Any ``--profile`` option takes a
built-in name or a path.

Example::

    hw = load_profile("h100-cc")
    hw.link_gbps                       # 370.0 (GB/s per direction)
    faster = hw.replace(enc_gbps=2 * hw.enc_gbps)
    write_profile(faster.as_dict(), "/tmp/mine.toml")
    load_profile("/tmp/mine.toml").enc_gbps

Optional ``[workloads.<name>]`` tables override, per workload, what the profile would
otherwise derive from FLOPs: ``forward_ms``, ``backward_ms``, ``optimizer_ms``,
``data_ms``, ``input_bytes``, ``kernel_launches`` (see :data:`WORKLOAD_KEYS`).
"""

from __future__ import annotations

import math
import textwrap
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ccddp.errors import ConfigError


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


FIELDS: tuple[Field, ...] = (
    Field("name", "profile", "str", "", "Profile name, shown in every result.", "any"),
    Field("description", "profile", "str", "", "One line: what machine this describes.", "any"),
    Field("gpus_per_node", "profile", "int", "devices", "Devices behind one host (one NVLink "
          "domain); rings longer than this become hierarchical across nodes.", "ge1"),
    # compute
    Field("compute_tflops", "compute", "float", "TFLOP/s", "Effective forward-pass FLOP rate "
          "of one device, used when a workload gives FLOPs rather than measured times.", "pos"),
    Field("backward_ratio", "compute", "float", "x", "Backward time / forward time when derived "
          "from FLOPs (about 2).", "pos"),
    Field("optimizer_gbps", "compute", "float", "GB/s", "Gradient bytes the optimizer step "
          "processes per second (memory bound; folds in Adam's extra state traffic).", "pos"),
    Field("kernel_launch_us", "compute", "float", "us", "One kernel launch with CC off "
          "(0 on a CPU).", "nonneg"),
    Field("cc_launch_toll", "compute", "float", "x", "Kernel launch time CC-on / CC-off "
          "(seed 003: Hopper ~2.0-2.6x, B300 ~3.5-3.9x). Applies to crypto launches and to a "
          "workload's kernel_launches.", "ge1"),
    # link
    Field("link_gbps", "link", "float", "GB/s", "Point-to-point bandwidth per device per "
          "direction between ring neighbours (NVLink, or gloo loopback on a CPU host).", "pos"),
    Field("link_latency_us", "link", "float", "us", "Latency of one message.", "nonneg"),
    Field("nvls", "link", "bool", "", "CC-off all-reduce may use NVLink SHARP (reduction in "
          "the switch). Sealed data can never be reduced in the switch, and Blackwell CC turns "
          "multicast off (seed 003), so secure schedules never use it.", "any"),
    Field("link_encrypted", "link", "bool", "", "The device link is encrypted by hardware "
          "in CC mode (Blackwell NVLink, seed 003), which allows the 'hw-link' schedule; "
          "Hopper leaves NVLink in plaintext.", "any"),
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
          "cross-device message in CC mode (seed 003: +9-13 us Hopper, +10-15 us B300).",
          "nonneg"),
    Field("cc_bandwidth_kept", "link", "float", "fraction", "Large-transfer link bandwidth "
          "kept in CC mode (seed 003: 0.94 Hopper, 0.89 B300).", "frac"),
    # crypto
    Field("enc_gbps", "crypto", "float", "GB/s", "AES-CTR rate of one seal (keystream + XOR). "
          "Device-wide on a GPU; per thread when chains_scale_enc.", "pos"),
    Field("dec_gbps", "crypto", "float", "GB/s", "The same for one open.", "pos"),
    Field("mac_gbps", "crypto", "float", "GB/s", "GHASH rate of ONE chain (GHASH is serial "
          "per chain; chains run in parallel). inf when enc/dec rates already include the MAC "
          "(stitched CPU AES-GCM).", "pos", allow_inf=True),
    Field("mac_chains", "crypto", "int", "chains", "Default chains per message (multi-chain "
          "MAC, paper Fig. 7; crypto threads on a CPU).", "ge1"),
    Field("max_chains", "crypto", "int", "chains", "Chains beyond this add nothing (device "
          "parallelism, or cores a rank may use).", "ge1"),
    Field("chains_scale_enc", "crypto", "bool", "", "Chains are threads running whole "
          "AES-GCM (CPU), so they also divide the CTR part.", "any"),
    Field("crypto_op_us", "crypto", "float", "us", "Fixed cost of one seal or open call, "
          "besides its kernel launch: setup, key schedule, Python call.", "nonneg"),
    Field("tag_us", "crypto", "float", "us", "Fixed cost per tag: finalize, compare, "
          "metadata. Batched MAC (seed 002) pays it once per batch.", "nonneg"),
    Field("tag_bytes", "crypto", "float", "B", "Metadata sent per tag (tag + counter).",
          "nonneg"),
    Field("xor_gbps", "crypto", "float", "GB/s", "Rate of applying a pre-computed pad "
          "(pad pre-computation, seed 002).", "pos"),
    Field("crypto_unit", "crypto", "choice", "", "Bytes one ring seal/open processes: "
          "'chunk' (bucket/n, the real ring) or 'bucket' (the whole bucket: how the paper's "
          "emulation behaves, see paper-h100).", "any", ("chunk", "bucket")),
    # bounce / input path
    Field("pcie_gbps", "bounce", "float", "GB/s", "Host-to-device input rate, CC off.", "pos"),
    Field("cc_pcie_kept", "bounce", "float", "fraction", "Host-to-device bandwidth kept "
          "through the CC bounce buffer (seed 003: pageable 0.78, pinned ~0.2).", "frac"),
    Field("cpu_crypto_gbps", "bounce", "float", "GB/s", "AES-GCM rate of one CPU-TEE core "
          "(input sealing, inter-node relay).", "pos"),
    Field("cpu_crypto_threads", "bounce", "int", "cores", "CPU-TEE cores for AES-GCM, shared "
          "by the node's input sealing and inter-node relays.", "ge1"),
    Field("bounce_threads", "bounce", "int", "cores", "Cores sealing one device's batch "
          "(loader or driver threads).", "ge1"),
    Field("bounce_pipelined", "bounce", "bool", "", "CPU seal, PCIe copy and device open "
          "of the input overlap (driver staging) rather than run one after another.", "any"),
    Field("input_path_shared", "bounce", "bool", "", "One host prepares and sends every "
          "device's batch, so data + transfer time grow with devices per node (paper "
          "Sec. VI-B: CC-off 1.2x longer on 4 GPUs than 2).", "any"),
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


@dataclass(frozen=True)
class HardwareProfile:
    """A validated hardware profile; see :data:`FIELDS` for every field's unit and meaning.

    Example::

        hw = load_profile("paper-h100")
        hw.workload_overrides("gpt2-xl")   # {'forward_ms': ..., ...}
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
    link_encrypted: bool
    reduce_gbps: float
    segment_overhead_us: float
    link_cpu_gbps: float
    cc_exchange_toll_us: float
    cc_bandwidth_kept: float
    enc_gbps: float
    dec_gbps: float
    mac_gbps: float
    mac_chains: int
    max_chains: int
    chains_scale_enc: bool
    crypto_op_us: float
    tag_us: float
    tag_bytes: float
    xor_gbps: float
    crypto_unit: str
    pcie_gbps: float
    cc_pcie_kept: float
    cpu_crypto_gbps: float
    cpu_crypto_threads: int
    bounce_threads: int
    bounce_pipelined: bool
    input_path_shared: bool
    inter_node_gbps: float
    inter_node_latency_us: float
    host_cores: int
    compute_threads: int
    overlap_efficiency: float
    interference: float
    workloads: dict[str, dict[str, float]] = field(default_factory=dict, compare=False)
    source: str = field(default="", compare=False)

    def workload_overrides(self, name: str) -> dict[str, float]:
        """Per-workload measured values this profile carries (empty if none)."""
        return dict(self.workloads.get(name, {}))

    def as_dict(self) -> dict[str, Any]:
        """Flat dict of every field plus ``workloads``; round-trips through write_profile."""
        d = {f.name: getattr(self, f.name) for f in FIELDS}
        d["workloads"] = {k: dict(v) for k, v in self.workloads.items()}
        return d

    def replace(self, **changes: Any) -> "HardwareProfile":
        """A validated copy with some fields changed."""
        d = self.as_dict()
        d.update(changes)
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


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    """Accept both the sectioned TOML layout and a flat dict."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                if k in flat:
                    raise ConfigError(f"profile field '{k}' is given twice")
                flat[k] = v
        else:
            if key in flat:
                raise ConfigError(f"profile field '{key}' is given twice")
            flat[key] = value
    return flat


def validate_profile(data: dict[str, Any], *, source: str = "<dict>") -> HardwareProfile:
    """Check every field and build the profile; ConfigError names the first bad field."""
    flat = _flatten(data)
    workloads = flat.pop("workloads", {}) or {}
    unknown = sorted(set(flat) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"{source}: unknown profile field '{unknown[0]}'")
    values = {}
    for f in FIELDS:
        if f.name not in flat:
            raise ConfigError(f"{source}: profile field '{f.name}' is missing ({f.doc})")
        try:
            values[f.name] = _check_value(f, flat[f.name])
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    if not isinstance(workloads, dict):
        raise ConfigError(f"{source}: [workloads] must be a table of tables")
    clean: dict[str, dict[str, float]] = {}
    for wname, over in workloads.items():
        if not isinstance(over, dict):
            raise ConfigError(f"{source}: [workloads.{wname}] must be a table")
        for k, v in over.items():
            key = f"workloads.{wname}.{k}"
            if k not in WORKLOAD_KEYS:
                raise ConfigError(f"{source}: unknown profile field '{key}'")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                    or math.isinf(v):
                raise ConfigError(f"{source}: profile field '{key}' must be a finite "
                                  f"non-negative number, got {v!r}")
        clean[wname] = {k: float(v) for k, v in over.items()}
    return HardwareProfile(**values, workloads=clean, source=source)


def builtin_names() -> list[str]:
    """Names of the profiles shipped with ccddp."""
    root = resources.files("ccddp.sim") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a built-in profile by name (``paper-h100``, ``h100-cc``, ``h200-cc``,
    ``b300-cc``, ``local``) or a TOML file by path.

    Example::

        load_profile("b300-cc").nvls        # True (CC-off may use NVLS)
        load_profile("./calibrated.toml")
    """
    text_name = str(name_or_path)
    path = Path(text_name)
    if path.suffix == ".toml" or path.exists() or "/" in text_name:
        if not path.is_file():
            raise ConfigError(f"profile file not found: {text_name}")
        raw = path.read_text(encoding="utf-8")
        source = str(path)
    else:
        res = resources.files("ccddp.sim") / "profiles" / f"{text_name}.toml"
        if not res.is_file():
            raise ConfigError(f"unknown profile {text_name!r}; built-in: "
                              f"{', '.join(builtin_names())}, or give a path to a .toml file")
        raw = res.read_text(encoding="utf-8")
        source = text_name
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    return validate_profile(data, source=source)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return repr(v)


def write_profile(data: dict[str, Any], path: str | Path, *,
                  notes: dict[str, str] | None = None, header: list[str] | None = None) -> Path:
    """Validate ``data`` (flat or sectioned) and write it as a commented TOML profile.

    ``notes`` adds a comment line under a field's documentation (where its value came
    from, e.g. ``"MEASURED: ..."`` or ``"DEFAULT: ..."``); ``header`` adds comment lines at
    the top. This is the API ``ccddp calibrate --out PATH`` uses. Example::

        d = load_profile("local").as_dict()
        d.update(enc_gbps=2.31, dec_gbps=2.93, link_gbps=0.91)
        write_profile(d, "local.toml", notes={"enc_gbps": "MEASURED: seal, one thread"})
    """
    hw = validate_profile(data, source=str(path))
    notes = notes or {}
    unknown = sorted(set(notes) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"note for unknown profile field '{unknown[0]}'")
    lines = ["# ccddp hardware profile (schema: ccddp.sim.profile.FIELDS)"]
    lines += [f"# {h}".rstrip() for h in (header or [])]
    lines.append("")
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for f in FIELDS:
            if f.section == section:
                unit = f" [{f.unit}]" if f.unit else ""
                lines.extend(textwrap.wrap(f"{f.doc}{unit}", 88, initial_indent="# ",
                                           subsequent_indent="# "))
                if f.name in notes:
                    lines.extend(textwrap.wrap(notes[f.name], 88, initial_indent="# ",
                                               subsequent_indent="#   "))
                lines.append(f"{f.name} = {_toml_value(getattr(hw, f.name))}")
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


__all__ = ["FIELDS", "WORKLOAD_KEYS", "HardwareProfile", "load_profile", "write_profile",
           "validate_profile", "builtin_names", "describe_fields"]
