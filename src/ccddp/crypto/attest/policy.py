"""The user's attestation policy: which evidence is accepted, as a TOML file.

Example (the fields with a default default to the strict choice; what the host could
otherwise choose for the guest -- the firmware versions (TCB), and for TDX the RTMRs that
measure what MRTD does not: firmware configuration, kernel, command line -- has no
default: a policy names the values it accepts, or says ``"any"``)::

    format = "ccddp-attestation-policy/1"

    [snp]
    # MEASUREMENT values (96 hex digits) of the launch images you built and trust.
    measurements = ["b07af9620f3b839b...2b01"]
    min_tcb = { bootloader = 2, tee = 0, snp = 5, microcode = 68 }   # required (or "any")
    allow_debug = false              # a debug VM's memory can be read by the host
    allow_migration_agent = false    # a migration agent can move the VM's memory out
    max_vmpl = 0                     # the report must come from VMPL 0..max_vmpl
    min_guest_svn = 0
    host_data = []                   # accepted HOST_DATA values (hex); empty: any

    [gpu]                            # NVIDIA GPU evidence (see GpuPolicy)
    driver_versions = ["550.90.07"]
    vbios_versions = ["96.00.9f.00.01"]

A field this file does not know is refused (a misspelt ``allow_debgu = false`` must not
silently leave the default in force), and so is a value of the wrong type.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ccddp.crypto.attest.snp import SnpReport, TcbVersion
from ccddp.errors import AttestationError

POLICY_FORMAT = "ccddp-attestation-policy/1"
_MAX_POLICY_BYTES = 1 << 20
_TOP = {"format", "snp", "tdx", "gpu"}
_SNP = {"measurements", "allow_debug", "allow_migration_agent", "max_vmpl", "min_guest_svn", "min_tcb",
        "host_data"}
_TCB = ("bootloader", "tee", "snp", "microcode")


def _bad(field: str, message: str) -> AttestationError:
    return AttestationError(f"attestation policy file refused, claim 'policy_file.{field}': field {field!r} "
                            f"{message}", claim=f"policy_file.{field}")


def _hexes(field: str, value: object, nbytes: int) -> frozenset[bytes]:
    if not isinstance(value, list):
        raise _bad(field, "must be a list of hex strings")
    out = set()
    for v in value:
        try:
            b = bytes.fromhex(v) if isinstance(v, str) else None
        except ValueError:
            b = None
        if b is None or len(b) != nbytes:
            raise _bad(field, f"each entry must be {2 * nbytes} hex digits, got {str(v)[:120]!r}")
        out.add(b)
    return frozenset(out)


#: The value of a required field that accepts whatever the evidence shows, said on purpose.
ANY = "any"


def _uint(field: str, value: object, top: int) -> int:
    # bool is an int in Python; "true" is not a level.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise _bad(field, f"must be an integer 0..{top}, got {value!r}")
    return value


def _flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(field, f"must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class SnpPolicy:
    """What an SEV-SNP report must show (see the module's example)."""

    measurements: frozenset[bytes]
    allow_debug: bool = False
    allow_migration_agent: bool = False
    max_vmpl: int = 0
    min_guest_svn: int = 0
    min_tcb: TcbVersion = TcbVersion(0, 0, 0, 0)
    host_data: frozenset[bytes] = frozenset()

    @classmethod
    def from_mapping(cls, doc: dict) -> "SnpPolicy":
        unknown = sorted(set(doc) - _SNP)
        if unknown:
            raise _bad(f"snp.{unknown[0]}", f"is unknown (known: {sorted(_SNP)})")
        if "measurements" not in doc:
            raise _bad("snp.measurements", "is required: the launch measurements you accept")
        meas = _hexes("snp.measurements", doc["measurements"], 48)
        if not meas:
            raise _bad("snp.measurements", "is empty: no launch would be accepted")
        if "min_tcb" not in doc:
            raise _bad("snp.min_tcb", "is required: the lowest firmware and microcode versions you accept, e.g. "
                                      "{ bootloader = 3, tee = 0, snp = 8, microcode = 115 } (a host can run old, "
                                      f"vulnerable firmware under a genuine key of its TCB), or \"{ANY}\"")
        tcb_doc = {} if doc["min_tcb"] == ANY else doc["min_tcb"]
        if not isinstance(tcb_doc, dict):
            raise _bad("snp.min_tcb", "must be a table {bootloader, tee, snp, microcode}")
        unknown = sorted(set(tcb_doc) - set(_TCB))
        if unknown:
            raise _bad(f"snp.min_tcb.{unknown[0]}", f"is an unknown component (known: {list(_TCB)})")
        tcb = TcbVersion(**{k: _uint(f"snp.min_tcb.{k}", tcb_doc.get(k, 0), 255) for k in _TCB})
        return cls(measurements=meas,
                   allow_debug=_flag("snp.allow_debug", doc.get("allow_debug", False)),
                   allow_migration_agent=_flag("snp.allow_migration_agent", doc.get("allow_migration_agent", False)),
                   max_vmpl=_uint("snp.max_vmpl", doc.get("max_vmpl", 0), 3),
                   min_guest_svn=_uint("snp.min_guest_svn", doc.get("min_guest_svn", 0), 0xFFFFFFFF),
                   min_tcb=tcb,
                   host_data=_hexes("snp.host_data", doc.get("host_data", []), 32))

    def check(self, r: SnpReport) -> list[tuple[str, str]]:
        """The policy's claims on a report whose signature verified: (claim, detail) for
        each that holds, or :class:`AttestationError` naming the first that does not."""
        out = []

        def fail(claim: str, message: str) -> AttestationError:
            return AttestationError(f"SEV-SNP attestation refused, claim {claim!r}: {message}", claim=claim)

        if r.debug and not self.allow_debug:
            raise fail("policy.debug", f"the guest policy {r.policy:#x} allows debugging (its memory can be read "
                                       "by the host), and the attestation policy forbids it")
        out.append(("policy.debug", "debug " + ("on (allowed by the policy)" if r.debug else "off")))
        if r.migrate_ma and not self.allow_migration_agent:
            raise fail("policy.migration_agent", f"the guest policy {r.policy:#x} allows a migration agent, "
                                                 "and the attestation policy forbids it")
        out.append(("policy.migration_agent", "allowed" if r.migrate_ma else "not allowed"))
        if r.vmpl > self.max_vmpl:
            raise fail("vmpl", f"the report comes from VMPL {r.vmpl}; the policy accepts 0..{self.max_vmpl}")
        out.append(("vmpl", str(r.vmpl)))
        have, need = r.reported_tcb.as_dict(), self.min_tcb.as_dict()
        for k in _TCB:
            if have[k] < need[k]:
                raise fail(f"tcb.{k}", f"REPORTED_TCB {k} is {have[k]}, the policy's minimum is {need[k]}")
        out.append(("tcb", f"{have} >= {need}"))
        if r.guest_svn < self.min_guest_svn:
            raise fail("guest_svn", f"GUEST_SVN is {r.guest_svn}, the policy's minimum is {self.min_guest_svn}")
        out.append(("guest_svn", str(r.guest_svn)))
        if self.host_data and r.host_data not in self.host_data:
            raise fail("host_data", f"HOST_DATA {r.host_data.hex()} is not one the policy accepts")
        out.append(("host_data", "accepted" if self.host_data else "any (the policy lists none)"))
        if r.measurement not in self.measurements:
            raise fail("measurement", f"MEASUREMENT {r.measurement.hex()} is not one the policy accepts")
        out.append(("measurement", r.measurement.hex()))
        return out


_TDX = {"mrtds", "rtmr0", "rtmr1", "rtmr2", "rtmr3", "allow_debug", "min_tee_tcb_svn"}


@dataclass(frozen=True)
class TdxPolicy:
    """What a TDX quote must show::

        [tdx]
        mrtds = ["<96 hex digits>"]        # required: the TD images you built
        rtmr0 = ["<96 hex>"]               # required, rtmr0..rtmr2 (rtmr3 optional): accepted values, or "any"
        min_tee_tcb_svn = "<32 hex>"       # required: each of the 16 TEE_TCB_SVN bytes at least this, or "any"
        allow_debug = false                # TDATTRIBUTES.DEBUG

    MRTD measures only the TD's firmware image: with direct boot the host (VMM) chooses the
    firmware's configuration, the kernel and its command line, measured into RTMR0, RTMR1
    and RTMR2 only. A policy without them would accept a TD of genuine firmware running the
    host's kernel, so each is required, as accepted values or an explicit ``"any"``.
    RTMR3 is extended by the running guest (its kernel, pinned by RTMR1/2): optional.
    """

    mrtds: frozenset[bytes]
    rtmrs: tuple[frozenset[bytes] | None, ...] = (None, None, None, None)
    allow_debug: bool = False
    min_tee_tcb_svn: bytes = bytes(16)

    @classmethod
    def from_mapping(cls, doc: dict) -> "TdxPolicy":
        unknown = sorted(set(doc) - _TDX)
        if unknown:
            raise _bad(f"tdx.{unknown[0]}", f"is unknown (known: {sorted(_TDX)})")
        if "mrtds" not in doc:
            raise _bad("tdx.mrtds", "is required: the TD measurements (MRTD) you accept")
        mrtds = _hexes("tdx.mrtds", doc["mrtds"], 48)
        if not mrtds:
            raise _bad("tdx.mrtds", "is empty: no TD would be accepted")
        rtmrs = tuple(_rtmr(doc, i) for i in range(4))
        if "min_tee_tcb_svn" not in doc:
            raise _bad("tdx.min_tee_tcb_svn", "is required: the lowest TDX module version you accept (the 16 "
                                              "TEE_TCB_SVN bytes, 32 hex digits; a host can run an old, vulnerable "
                                              f"one), or \"{ANY}\"")
        svn = "00" * 16 if doc["min_tee_tcb_svn"] == ANY else doc["min_tee_tcb_svn"]
        try:
            svn_b = bytes.fromhex(svn) if isinstance(svn, str) else b""
        except ValueError:
            svn_b = b""
        if len(svn_b) != 16:
            raise _bad("tdx.min_tee_tcb_svn", "must be 32 hex digits (the 16 TEE_TCB_SVN bytes)")
        return cls(mrtds=mrtds, rtmrs=rtmrs, allow_debug=_flag("tdx.allow_debug", doc.get("allow_debug", False)),
                   min_tee_tcb_svn=svn_b)

    def check(self, q) -> list[tuple[str, str]]:
        """The policy's claims on a quote whose signatures verified (a
        :class:`ccddp.crypto.attest.tdx.TdxQuote`)."""
        def fail(claim: str, message: str) -> AttestationError:
            return AttestationError(f"TDX attestation refused, claim {claim!r}: {message}", claim=claim)

        out = []
        if q.debug and not self.allow_debug:
            raise fail("policy.debug", f"TDATTRIBUTES {q.td_attributes:#x} has DEBUG set (the host can read the "
                                       "TD's memory), and the attestation policy forbids it")
        out.append(("policy.debug", "debug " + ("on (allowed by the policy)" if q.debug else "off")))
        for i, have in enumerate(q.tee_tcb_svn):
            if have < self.min_tee_tcb_svn[i]:
                raise fail("tee_tcb_svn", f"TEE_TCB_SVN byte {i} is {have}, the policy's minimum is "
                                          f"{self.min_tee_tcb_svn[i]}")
        out.append(("tee_tcb_svn", f"{q.tee_tcb_svn.hex()} >= {self.min_tee_tcb_svn.hex()}"))
        if q.mrtd not in self.mrtds:
            raise fail("mrtd", f"MRTD {q.mrtd.hex()} is not one the policy accepts")
        out.append(("mrtd", q.mrtd.hex()))
        for i, accepted in enumerate(self.rtmrs):
            if accepted is not None and q.rtmrs[i] not in accepted:
                raise fail(f"rtmr{i}", f"RTMR{i} {q.rtmrs[i].hex()} is not one the policy accepts")
            out.append((f"rtmr{i}", "accepted" if accepted is not None else "any (as the policy says)"))
        return out

#: What RTMR0..RTMR2 measure that the host chooses (with direct boot, MRTD covers none of it).
_RTMR_HOLDS = ("the firmware's configuration (ACPI tables, TD HOB)", "the kernel and boot loader",
               "the kernel command line and initrd")


def _rtmr(doc: dict, i: int) -> frozenset[bytes] | None:
    """The accepted values of RTMR ``i`` (None: any, said or, for RTMR3, left out)."""
    field = f"rtmr{i}"
    if doc.get(field) == ANY or (field not in doc and i == 3):
        return None
    if field not in doc:
        raise _bad(f"tdx.{field}", f"is required: RTMR{i} measures {_RTMR_HOLDS[i]}, which the host chooses and "
                                   f"MRTD does not cover; list the values you accept, or write {field} = \"{ANY}\"")
    return _hexes(f"tdx.{field}", doc[field], 48)


_GPU = {"driver_versions", "vbios_versions", "allow_devtools", "measurements"}


def _strings(field: str, value: object) -> frozenset[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _bad(field, "must be a non-empty list of version strings")
    return frozenset(v.strip().lower() for v in value)


@dataclass(frozen=True)
class GpuPolicy:
    """What an NVIDIA GPU's evidence must show (checked after its signature, chain and
    nonce, see :func:`ccddp.crypto.attest.gpu.verify_gpu`)::

        [gpu]
        driver_versions = ["550.90.07"]      # required: the driver versions you accept
        vbios_versions = ["96.00.9f.00.01"]  # required: the VBIOS versions (nvidia-smi's form)
        allow_devtools = false               # CC on in developer-tools mode (debuggable)
        # optional golden values, by SPDM measurement block index (1-based, as the report
        # numbers them; NVIDIA's RIM files count from 0: RIM index i is block i + 1).
        # Each block listed must equal one of its values; blocks not listed are not compared.
        measurements = { "2" = ["8048dfd1...<96 hex>"], "3" = ["164f445c..."] }

    The CC mode must be on (``allow_devtools`` also accepts devtools mode). It is the
    driver's word (NVML on the machine that made the evidence), not part of the signed
    report: it is as trustworthy as that machine, which its CPU evidence attests.
    """

    driver_versions: frozenset[str]
    vbios_versions: frozenset[str]
    allow_devtools: bool = False
    measurements: tuple[tuple[int, frozenset[bytes]], ...] = ()

    @classmethod
    def from_mapping(cls, doc: dict) -> "GpuPolicy":
        unknown = sorted(set(doc) - _GPU)
        if unknown:
            raise _bad(f"gpu.{unknown[0]}", f"is unknown (known: {sorted(_GPU)})")
        for req in ("driver_versions", "vbios_versions"):
            if req not in doc:
                raise _bad(f"gpu.{req}", "is required: the versions you accept")
        meas_doc = doc.get("measurements", {})
        if not isinstance(meas_doc, dict):
            raise _bad("gpu.measurements", "must be a table of block index = [hex values]")
        meas = []
        for key, values in sorted(meas_doc.items(), key=lambda kv: str(kv[0])):
            if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) <= 255):
                raise _bad(f"gpu.measurements.{key}", "is not a block index 1..255")
            if not isinstance(values, list) or not values:
                raise _bad(f"gpu.measurements.{key}", "must be a non-empty list of hex strings")
            first = values[0] if isinstance(values[0], str) else ""
            nbytes = len(first) // 2
            if not 1 <= nbytes <= 64:
                raise _bad(f"gpu.measurements.{key}", "must list hex strings of one length (1..64 bytes)")
            meas.append((int(key), _hexes(f"gpu.measurements.{key}", values, nbytes)))
        return cls(driver_versions=_strings("gpu.driver_versions", doc["driver_versions"]),
                   vbios_versions=_strings("gpu.vbios_versions", doc["vbios_versions"]),
                   allow_devtools=_flag("gpu.allow_devtools", doc.get("allow_devtools", False)),
                   measurements=tuple(sorted(meas)))

    def check(self, r, cc_mode: str) -> list[tuple[str, str]]:
        """The policy's claims on a report whose signature verified (a
        :class:`ccddp.crypto.attest.gpu.GpuReport`) and the provider's CC mode."""
        def fail(claim: str, message: str) -> AttestationError:
            return AttestationError(f"GPU attestation refused, claim {claim!r}: {message}", claim=claim)

        out = []
        if cc_mode == "on" or (cc_mode == "devtools" and self.allow_devtools):
            out.append(("gpu.cc_mode", cc_mode + (" (allowed by the policy)" if cc_mode == "devtools" else "")))
        elif cc_mode == "devtools":
            raise fail("gpu.cc_mode", "the GPU's CC mode is on in developer-tools mode (debuggable), and the policy "
                                      "forbids it (allow_devtools = false)")
        else:
            raise fail("gpu.cc_mode", f"the GPU's CC mode is {cc_mode}" + (
                " (the evidence does not say: a bare report)" if cc_mode == "unknown" else "")
                + "; the policy needs it on")
        drv = r.driver_version
        if drv is None or drv.lower() not in self.driver_versions:
            raise fail("gpu.driver_version", f"driver version {drv!r} is not one the policy accepts "
                                             f"({sorted(self.driver_versions)})")
        out.append(("gpu.driver_version", drv))
        vb = r.vbios_version
        if vb is None or vb.lower() not in self.vbios_versions:
            raise fail("gpu.vbios_version", f"VBIOS version {vb!r} is not one the policy accepts "
                                            f"({sorted(self.vbios_versions)})")
        out.append(("gpu.vbios_version", vb))
        for index, accepted in self.measurements:
            have = r.measurements.get(index)
            if have is None:
                raise fail("gpu.measurement", f"the report has no measurement block {index}, which the policy lists")
            if have not in accepted:
                raise fail("gpu.measurement", f"measurement block {index} is {have.hex()}, not a value the policy "
                                              "accepts")
        out.append(("gpu.measurement", f"{len(self.measurements)} blocks equal the policy's golden values"
                    if self.measurements else "not compared (the policy lists no golden values)"))
        return out


@dataclass(frozen=True)
class AttestationPolicy:
    """A parsed policy file: ``snp``, ``tdx`` and ``gpu``, each None when the file has no
    such table (then no evidence of that kind is accepted); at least one is present.
    With ``gpu``, every rank must also present its GPU's evidence."""

    snp: SnpPolicy | None
    tdx: TdxPolicy | None = None
    gpu: GpuPolicy | None = None

    @classmethod
    def from_toml(cls, text: str) -> "AttestationPolicy":
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise _bad("toml", f"is not valid TOML: {e}") from None
        unknown = sorted(set(doc) - _TOP)
        if unknown:
            raise _bad(unknown[0], f"is unknown (known: {sorted(_TOP)})")
        if doc.get("format") != POLICY_FORMAT:
            raise _bad("format", f"must be {POLICY_FORMAT!r}, got {doc.get('format')!r}")
        snp, tdx, gpu = doc.get("snp"), doc.get("tdx"), doc.get("gpu")
        for name, table in (("snp", snp), ("tdx", tdx), ("gpu", gpu)):
            if table is not None and not isinstance(table, dict):
                raise _bad(name, "must be a table")
        if snp is None and tdx is None and gpu is None:
            raise _bad("tee", "is missing: neither [snp] nor [tdx] is given, so the policy accepts no evidence")
        return cls(snp=SnpPolicy.from_mapping(snp) if snp is not None else None,
                   tdx=TdxPolicy.from_mapping(tdx) if tdx is not None else None,
                   gpu=GpuPolicy.from_mapping(gpu) if gpu is not None else None)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "AttestationPolicy":
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > _MAX_POLICY_BYTES:
                raise _bad("file", f"is too large: {p} is {size} bytes; a policy is at most {_MAX_POLICY_BYTES}")
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise _bad("file", f"is missing: {p} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise _bad("file", f"cannot be read: {p}: {e}") from None
        return cls.from_toml(text)
