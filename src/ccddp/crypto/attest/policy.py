"""The user's attestation policy: which evidence is accepted, as a TOML file.

Example (every field but ``measurements`` is optional; the defaults are the strict
choice)::

    format = "ccddp-attestation-policy/1"

    [snp]
    # MEASUREMENT values (96 hex digits) of the launch images you built and trust.
    measurements = ["b07af9620f3b839b...2b01"]
    allow_debug = false              # a debug VM's memory can be read by the host
    allow_migration_agent = false    # a migration agent can move the VM's memory out
    max_vmpl = 0                     # the report must come from VMPL 0..max_vmpl
    min_guest_svn = 0
    min_tcb = { bootloader = 2, tee = 0, snp = 5, microcode = 68 }
    host_data = []                   # accepted HOST_DATA values (hex); empty: any

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
_TOP = {"format", "snp"}
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
        tcb_doc = doc.get("min_tcb", {})
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


@dataclass(frozen=True)
class AttestationPolicy:
    """A parsed policy file. ``snp`` is None when the file has no ``[snp]`` table (then
    no SEV-SNP evidence is accepted)."""

    snp: SnpPolicy | None

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
        snp = doc.get("snp")
        if snp is not None and not isinstance(snp, dict):
            raise _bad("snp", "must be a table")
        if snp is None:
            raise _bad("snp", "is missing: the policy accepts no evidence at all")
        return cls(snp=SnpPolicy.from_mapping(snp))

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
