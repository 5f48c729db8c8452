"""AMD SEV-SNP attestation reports: parse, and verify offline against AMD's chain.

A report (SEV-SNP firmware ABI, report versions 2 and 3: 1184 bytes, little-endian) is
signed by the chip's VCEK (ECDSA P-384, SHA-384 over bytes ``0x000..0x29F``). The VCEK
certificate is signed by AMD's ASK, the ASK by the ARK (RSA-PSS, SHA-384, salt 48), and
the ARK is self-signed. Nothing here fetches anything: the operator stages the ASK/ARK
(and, where the evidence does not carry it, the VCEK) as files, and the ARK's public key
must equal one pinned below, so a staged file cannot substitute another root.

:func:`verify_snp` checks, in this order, and raises :class:`AttestationError` naming the
first claim that fails: the report's structure (``report.size``, ``report.version``,
``report.signature_algo``, ``report.signing_key``), the chain (``certs.ark``,
``certs.ask``, ``certs.vcek``, ``certs.validity``), the VCEK's match with the report
(``vcek.product``, ``vcek.chip_id``, ``vcek.tcb``), the signature (``report.signature``),
the binding (``report_data``) and then the user's policy (``policy.*``, ``tcb.*``,
``guest_svn``, ``vmpl``, ``measurement``; see :mod:`ccddp.crypto.attest.policy`).
Claims are checked before any are trusted: nothing of the report is read as policy
input until its signature verified.

Example::

    trust = TrustStore.from_dir("certs/")          # ask_ark_milan.pem, vcek.der, ...
    verdicts = verify_snp(report, trust, policy, expected_report_data=binding.ljust(64, b"\\0"))
    [v.claim for v in verdicts]                   # every claim that passed, in order
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from ccddp.errors import AttestationError

REPORT_BYTES = 0x4A0          # 1184: every report version so far has this size
SIGNED_BYTES = 0x2A0          # the signature covers everything before it
REPORT_DATA_BYTES = 64
SUPPORTED_VERSIONS = (2, 3)   # the layouts this parser was written against
SIG_ALGO_ECDSA_P384_SHA384 = 1

# Policy bits (ABI spec, "Guest Policy").
POLICY_SMT = 1 << 16
POLICY_RESERVED_ONE = 1 << 17   # must be 1
POLICY_MIGRATE_MA = 1 << 18
POLICY_DEBUG = 1 << 19
POLICY_SINGLE_SOCKET = 1 << 20

# AMD's OIDs in the VCEK certificate (KDS spec, "VCEK Certificate extensions").
_OID_PRODUCT = "1.3.6.1.4.1.3704.1.2"
_OID_HWID = "1.3.6.1.4.1.3704.1.4"
_OID_TCB = {"bootloader": "1.3.6.1.4.1.3704.1.3.1", "tee": "1.3.6.1.4.1.3704.1.3.2",
            "snp": "1.3.6.1.4.1.3704.1.3.3", "microcode": "1.3.6.1.4.1.3704.1.3.8"}

#: SHA-256 of each ARK's SubjectPublicKeyInfo (DER). The root of trust: a chain is
#: accepted only if its ARK carries one of these keys. Computed from AMD's published
#: ARK certificates (the KDS ``cert_chain`` of each product), and checked equal in two
#: independent copies of them (google/go-sev-guest verify/trust/, virtee/sev
#: src/certs/snp/builtin/). Turin is not here: its TCB_VERSION has another layout.
PINNED_ARK_SPKI_SHA256 = {
    "Milan": "9f056bee44377e29308cb5ffa895bdfb62d18881fa6bed8d6f075b0204089cb9",
    "Genoa": "429a69c9422aa258ee4d8db5fcda9c6470ef15f8cd5a9cebd6cbc7d90b863831",
}

# The most bytes a certificate file may have: AMD's are ~2 KiB each; a staged file is
# the operator's, but a bound keeps a wrong path (a disk image) from being read whole.
_MAX_CERT_FILE = 1 << 16
_MAX_CERT_FILES = 256


def _fail(claim: str, message: str) -> AttestationError:
    return AttestationError(f"SEV-SNP attestation refused, claim {claim!r}: {message}", claim=claim)


# -- the report ------------------------------------------------------------------------

@dataclass(frozen=True)
class TcbVersion:
    """A TCB_VERSION (Milan/Genoa layout): the security patch level of each component."""

    bootloader: int
    tee: int
    snp: int
    microcode: int

    @classmethod
    def from_u64(cls, raw: bytes) -> "TcbVersion":
        # byte 0 boot loader, 1 TEE, 2-5 reserved, 6 SNP firmware, 7 microcode
        return cls(raw[0], raw[1], raw[6], raw[7])

    def as_dict(self) -> dict[str, int]:
        return {"bootloader": self.bootloader, "tee": self.tee, "snp": self.snp, "microcode": self.microcode}


@dataclass(frozen=True)
class SnpReport:
    """The fields of an attestation report that verification uses. ``raw`` is the report."""

    raw: bytes
    version: int
    guest_svn: int
    policy: int
    vmpl: int
    signature_algo: int
    current_tcb: TcbVersion
    platform_info: int
    flags: int
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    reported_tcb: TcbVersion
    chip_id: bytes
    committed_tcb: TcbVersion
    launch_tcb: TcbVersion
    sig_r: int
    sig_s: int

    @property
    def signing_key(self) -> int:
        """0: VCEK, 1: VLEK, 7: none (flags bits 4:2)."""
        return (self.flags >> 2) & 0x7

    @property
    def debug(self) -> bool:
        return bool(self.policy & POLICY_DEBUG)

    @property
    def migrate_ma(self) -> bool:
        return bool(self.policy & POLICY_MIGRATE_MA)

    def summary(self) -> dict:
        """Printable fields (hex for byte strings)."""
        return {"version": self.version, "guest_svn": self.guest_svn, "policy": f"{self.policy:#x}",
                "debug": self.debug, "migrate_ma": self.migrate_ma, "vmpl": self.vmpl,
                "measurement": self.measurement.hex(), "report_data": self.report_data.hex(),
                "host_data": self.host_data.hex(), "chip_id": self.chip_id.hex(),
                "reported_tcb": self.reported_tcb.as_dict(), "current_tcb": self.current_tcb.as_dict(),
                "committed_tcb": self.committed_tcb.as_dict(), "launch_tcb": self.launch_tcb.as_dict()}


def parse_report(data: bytes) -> SnpReport:
    """Parse a report; its size and version are checked before any field is read."""
    data = bytes(data)
    if len(data) != REPORT_BYTES:
        raise _fail("report.size", f"a report is {REPORT_BYTES} bytes, got {len(data)}")
    (version,) = struct.unpack_from("<I", data, 0x00)
    if version not in SUPPORTED_VERSIONS:
        raise _fail("report.version", f"report version {version} is not one of {list(SUPPORTED_VERSIONS)}")
    guest_svn, policy = struct.unpack_from("<IQ", data, 0x04)
    vmpl, sig_algo = struct.unpack_from("<II", data, 0x30)
    (platform_info,) = struct.unpack_from("<Q", data, 0x40)
    (flags,) = struct.unpack_from("<I", data, 0x48)
    # The signature: R and S, 72 bytes each, little-endian (zero-extended P-384 scalars).
    sig = data[SIGNED_BYTES:SIGNED_BYTES + 144]
    return SnpReport(
        raw=data, version=version, guest_svn=guest_svn, policy=policy, vmpl=vmpl, signature_algo=sig_algo,
        current_tcb=TcbVersion.from_u64(data[0x38:0x40]), platform_info=platform_info, flags=flags,
        report_data=data[0x50:0x90], measurement=data[0x90:0xC0], host_data=data[0xC0:0xE0],
        id_key_digest=data[0xE0:0x110], author_key_digest=data[0x110:0x140], report_id=data[0x140:0x160],
        reported_tcb=TcbVersion.from_u64(data[0x180:0x188]), chip_id=data[0x1A0:0x1E0],
        committed_tcb=TcbVersion.from_u64(data[0x1E0:0x1E8]), launch_tcb=TcbVersion.from_u64(data[0x1F0:0x1F8]),
        sig_r=int.from_bytes(sig[:72], "little"), sig_s=int.from_bytes(sig[72:], "little"))


# -- the certificates ------------------------------------------------------------------

def load_certificates(data: bytes, what: str) -> list[x509.Certificate]:
    """Certificates from PEM (one or more) or DER bytes; a typed error if neither."""
    if len(data) > _MAX_CERT_FILE:
        raise _fail("certs.file", f"{what} is {len(data)} bytes; a certificate file is at most {_MAX_CERT_FILE}")
    # AMD's VCEKs have serial number 0, which RFC 5280 forbids: cryptography warns (and may
    # one day refuse). The signature chain, not the serial, is what is trusted here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            certs = (x509.load_pem_x509_certificates(data) if b"-----BEGIN" in data
                     else [x509.load_der_x509_certificate(data)])
            # cryptography parses fields when first read: read every one used here now, so a
            # malformed certificate (a VCEK is host-supplied) is refused here, typed, and not
            # as a bare ValueError halfway through verification.
            for c in certs:
                c.subject, c.issuer, c.extensions, c.public_key(), c.serial_number
                c.not_valid_before_utc, c.not_valid_after_utc, c.signature_algorithm_oid, c.tbs_certificate_bytes
            return certs
        except Exception as e:  # noqa: BLE001 - whatever the parser raises on bad input is a refusal
            raise _fail("certs.file", f"{what} is not a well-formed X.509 certificate (PEM or DER): "
                                      f"{type(e).__name__}: {str(e)[:200]}") from None


def _spki_sha256(cert: x509.Certificate) -> str:
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


def _check_pss_signed(cert: x509.Certificate, issuer: x509.Certificate, claim: str) -> None:
    """``cert`` is signed by ``issuer`` with RSA-PSS/SHA-384/salt 48 (AMD's scheme), the only
    scheme accepted: a chain signed another way is not AMD's."""
    key = issuer.public_key()
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 4096:
        raise _fail(claim, f"the issuer {issuer.subject.rfc4514_string()} does not hold an RSA-4096 key")
    if cert.signature_algorithm_oid != x509.oid.SignatureAlgorithmOID.RSASSA_PSS:
        raise _fail(claim, f"{cert.subject.rfc4514_string()} is not signed with RSA-PSS")
    if cert.issuer != issuer.subject:
        raise _fail(claim, f"{cert.subject.rfc4514_string()} names issuer {cert.issuer.rfc4514_string()}, "
                           f"not {issuer.subject.rfc4514_string()}")
    try:
        key.verify(cert.signature, cert.tbs_certificate_bytes, _PSS, hashes.SHA384())
    except InvalidSignature:
        raise _fail(claim, f"the signature on {cert.subject.rfc4514_string()} does not verify under "
                           f"{issuer.subject.rfc4514_string()}") from None


def _check_validity(cert: x509.Certificate, at: _dt.datetime, name: str) -> None:
    if not (cert.not_valid_before_utc <= at <= cert.not_valid_after_utc):
        raise _fail("certs.validity", f"the {name} certificate is valid from {cert.not_valid_before_utc:%Y-%m-%d} "
                                      f"to {cert.not_valid_after_utc:%Y-%m-%d}, not at {at:%Y-%m-%d %H:%M} UTC")


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _ext_value(cert: x509.Certificate, oid: str) -> bytes | None:
    try:
        ext = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid))
    except x509.ExtensionNotFound:
        return None
    return getattr(ext.value, "value", None)


def _der_small_int(raw: bytes | None, what: str) -> int:
    """A DER INTEGER 0..255 (how AMD encodes each SPL in the VCEK): ``02 01 xx`` or
    ``02 02 00 xx``."""
    if raw is not None and len(raw) == 3 and raw[:2] == b"\x02\x01" and raw[2] < 0x80:
        return raw[2]
    if raw is not None and len(raw) == 4 and raw[:3] == b"\x02\x02\x00" and raw[3] >= 0x80:
        return raw[3]
    raise _fail("vcek.tcb", f"the VCEK's {what} extension is missing or not a small DER integer")


@dataclass(frozen=True)
class AmdChain:
    """One product's ASK and ARK, the ARK checked against the pinned key."""

    product: str
    ask: x509.Certificate
    ark: x509.Certificate


class TrustStore:
    """The staged certificates: AMD chains (ASK + ARK per product, ARK pinned) and any
    VCEKs. Built from a directory (``TrustStore.from_dir``) or from certificates.

    A certificate whose subject CN is ``ARK-<product>`` is an ARK, ``SEV-<product>`` an
    ASK, ``SEV-VCEK`` a VCEK; file names do not matter (AMD's KDS ``cert_chain`` file holds
    ASK and ARK together).
    """

    def __init__(self, certs: list[x509.Certificate], pins: Mapping[str, str] | None = None,
                 crls: list[x509.CertificateRevocationList] | None = None) -> None:
        # ``pins`` replaces AMD's pinned ARK keys: for tests that sign with a chain of their
        # own (never set from a file or the environment).
        pins = PINNED_ARK_SPKI_SHA256 if pins is None else pins
        arks: dict[str, x509.Certificate] = {}
        asks: dict[str, x509.Certificate] = {}
        self.vceks: list[x509.Certificate] = []
        for c in certs:
            cn = _common_name(c)
            if cn.startswith("ARK-"):
                product = cn[4:]
                pin = pins.get(product)
                # A root is accepted only if its key is AMD's: the file is the operator's,
                # the pin is not (refusing here, not at use, names the bad file early).
                if pin is None or not hmac.compare_digest(_spki_sha256(c), pin):
                    raise _fail("certs.ark", f"the ARK for {product!r} does not carry AMD's pinned key "
                                             f"(products pinned: {sorted(pins)})")
                _check_pss_signed(c, c, "certs.ark")  # self-signed
                arks[product] = c
            elif cn == "SEV-VCEK":
                self.vceks.append(c)
            elif cn.startswith("SEV-"):
                asks[cn[4:]] = c
            else:
                raise _fail("certs.file", f"unexpected certificate {c.subject.rfc4514_string()} among the AMD "
                                          "certificates")
        self.chains: dict[str, AmdChain] = {}
        for product, ask in asks.items():
            if product not in arks:
                raise _fail("certs.ark", f"the ASK for {product} has no ARK among the staged certificates")
            _check_pss_signed(ask, arks[product], "certs.ask")
            self.chains[product] = AmdChain(product, ask, arks[product])
        if not self.chains:
            raise _fail("certs.ask", "no ASK/ARK pair was staged (AMD's cert_chain file for the product)")
        # AMD's CRL (KDS ``/vcek/v1/<product>/crl``) is issued by the ARK and lists revoked
        # ASKs; a CRL no staged ARK signed is refused rather than ignored.
        self.crls: dict[str, x509.CertificateRevocationList] = {}
        for crl in crls or []:
            chain = next((c for c in self.chains.values() if c.ark.subject == crl.issuer), None)
            if chain is None:
                raise _fail("certs.crl", f"a CRL from {crl.issuer.rfc4514_string()} has no staged ARK")
            if crl.signature_algorithm_oid != x509.oid.SignatureAlgorithmOID.RSASSA_PSS:
                raise _fail("certs.crl", f"the {chain.product} CRL is not signed with RSA-PSS")
            try:
                chain.ark.public_key().verify(crl.signature, crl.tbs_certlist_bytes, _PSS, hashes.SHA384())
            except InvalidSignature:
                raise _fail("certs.crl", f"the {chain.product} CRL is not signed by ARK-{chain.product}") from None
            self.crls[chain.product] = crl

    @classmethod
    def from_dir(cls, path: str | Path, pins: Mapping[str, str] | None = None) -> "TrustStore":
        p = Path(path)
        if not p.is_dir():
            raise _fail("certs.file", f"certificate directory {p} does not exist")
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in (".pem", ".der", ".crt", ".cer"))
        if len(files) > _MAX_CERT_FILES:
            raise _fail("certs.file", f"{p} holds {len(files)} certificate files; at most {_MAX_CERT_FILES}")
        certs: list[x509.Certificate] = []
        crls: list[x509.CertificateRevocationList] = []
        for f in sorted(p.glob("*.crl")):
            try:
                data = f.read_bytes()[:_MAX_CERT_FILE * 16]
                crls.append(x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data))
            except (OSError, ValueError) as e:
                raise _fail("certs.crl", f"{f} is not a readable CRL: {e}") from None
        for f in files:
            try:
                data = f.read_bytes() if f.stat().st_size <= _MAX_CERT_FILE else b"\0" * (_MAX_CERT_FILE + 1)
            except OSError as e:
                raise _fail("certs.file", f"{f} cannot be read: {e.strerror}") from None
            certs.extend(load_certificates(data, str(f)))
        return cls(certs, pins, crls)

    def find_vcek(self, report: SnpReport) -> x509.Certificate | None:
        """A staged VCEK for this report's chip and reported TCB, if any."""
        for v in self.vceks:
            if _ext_value(v, _OID_HWID) == report.chip_id and _vcek_tcb(v) == report.reported_tcb:
                return v
        return None


def _vcek_tcb(vcek: x509.Certificate) -> TcbVersion:
    vals = {k: _der_small_int(_ext_value(vcek, oid), k) for k, oid in _OID_TCB.items()}
    return TcbVersion(**vals)


# -- verification ----------------------------------------------------------------------

class PolicyCheck(Protocol):
    """What :func:`verify_snp` asks of a policy (:class:`ccddp.crypto.attest.policy.SnpPolicy`):
    ``(claim, detail)`` per claim that holds, or :class:`AttestationError`."""

    def check(self, report: "SnpReport") -> list[tuple[str, str]]:
        ...


@dataclass(frozen=True)
class Verdict:
    """One claim and what was found."""

    claim: str
    ok: bool
    detail: str


def verify_snp(report_bytes: bytes, trust: TrustStore, policy: PolicyCheck | None, *,
               expected_report_data: bytes | None, vcek: x509.Certificate | None = None,
               at: _dt.datetime | None = None, into: list[Verdict] | None = None) -> list[Verdict]:
    """Verify a report end to end; return the claims that passed, in order, or raise
    :class:`AttestationError` naming the first that failed.

    ``expected_report_data`` (64 bytes) is what the report must carry (the binding);
    ``None`` skips that claim, for ``ccddp attest verify`` on a saved report with no
    binding to compare (the verdict then says it was not checked). ``vcek`` is the
    evidence's own VCEK, else one is looked up among the staged ones. ``at`` is the time
    certificates must be valid at (default: now). ``into``: a list the passed claims are
    appended to as they pass (so a caller sees them even when a later claim fails).
    """
    at = at or _dt.datetime.now(_dt.timezone.utc)
    passed: list[Verdict] = into if into is not None else []

    def ok(claim: str, detail: str) -> None:
        passed.append(Verdict(claim, True, detail))

    r = parse_report(report_bytes)
    ok("report.size", f"{REPORT_BYTES} bytes, version {r.version}")
    if r.signature_algo != SIG_ALGO_ECDSA_P384_SHA384:
        raise _fail("report.signature_algo", f"signature algorithm {r.signature_algo} is not ECDSA P-384 "
                                             "with SHA-384 (1)")
    if r.signing_key != 0:
        raise _fail("report.signing_key", f"the report is signed by key type {r.signing_key} "
                                          "(0 VCEK, 1 VLEK, 7 none); only VCEK-signed reports are accepted")
    ok("report.signing_key", "VCEK")

    # The chain: VCEK <- ASK <- ARK (pinned).
    if vcek is None:
        vcek = trust.find_vcek(r)
        if vcek is None:
            raise _fail("certs.vcek", f"no VCEK for chip {r.chip_id.hex()[:16]}... at TCB "
                                      f"{r.reported_tcb.as_dict()} was given or staged")
    if _common_name(vcek) != "SEV-VCEK":
        raise _fail("certs.vcek", f"{vcek.subject.rfc4514_string()} is not a VCEK")
    issuer_cn = next((str(a.value) for a in vcek.issuer.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)), "")
    product = issuer_cn[4:] if issuer_cn.startswith("SEV-") else ""
    chain = trust.chains.get(product)
    if chain is None:
        raise _fail("certs.ask", f"the VCEK was issued by {issuer_cn!r}; no staged AMD chain matches "
                                 f"(staged: {sorted(trust.chains)})")
    _check_pss_signed(vcek, chain.ask, "certs.vcek")
    for cert, name in ((chain.ark, "ARK"), (chain.ask, "ASK"), (vcek, "VCEK")):
        _check_validity(cert, at, name)
    ok("certs.chain", f"VCEK <- SEV-{product} <- ARK-{product} (pinned), valid at {at:%Y-%m-%d}")
    crl = trust.crls.get(product)
    if crl is not None:
        # A CRL past its next update may miss a revocation since: refused, not trusted.
        if crl.next_update_utc is not None and at > crl.next_update_utc:
            raise _fail("certs.crl", f"the {product} CRL expired on {crl.next_update_utc:%Y-%m-%d}")
        if crl.get_revoked_certificate_by_serial_number(chain.ask.serial_number) is not None:
            raise _fail("certs.crl", f"the ASK SEV-{product} (serial {chain.ask.serial_number:x}) is revoked")
        ok("certs.crl", f"ARK-{product}'s CRL of {crl.last_update_utc:%Y-%m-%d}: the ASK is not revoked")

    # The VCEK must be this chip's, at this TCB: a genuine VCEK of another chip or of an
    # older TCB would otherwise vouch for a report it never signed.
    prod_name = _ext_value(vcek, _OID_PRODUCT)
    if prod_name is None or product.encode() not in prod_name:
        raise _fail("vcek.product", f"the VCEK's product name does not name {product}")
    hwid = _ext_value(vcek, _OID_HWID)
    if hwid is None or not hmac.compare_digest(hwid, r.chip_id):
        raise _fail("vcek.chip_id", "the VCEK is another chip's: its hwID differs from the report's CHIP_ID")
    vtcb = _vcek_tcb(vcek)
    if vtcb != r.reported_tcb:
        raise _fail("vcek.tcb", f"the VCEK is for TCB {vtcb.as_dict()}, the report's REPORTED_TCB is "
                                f"{r.reported_tcb.as_dict()}")
    ok("vcek.match", f"chip {r.chip_id.hex()[:16]}..., TCB {vtcb.as_dict()}")

    key = vcek.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise _fail("certs.vcek", "the VCEK does not hold a P-384 key")
    try:
        key.verify(utils.encode_dss_signature(r.sig_r, r.sig_s), r.raw[:SIGNED_BYTES], ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        raise _fail("report.signature", "the report's ECDSA P-384 signature does not verify under the VCEK") from None
    ok("report.signature", "ECDSA P-384 / SHA-384 under the VCEK")

    if expected_report_data is None:
        passed.append(Verdict("report_data", True, f"not compared (no binding given): {r.report_data.hex()}"))
    else:
        if len(expected_report_data) != REPORT_DATA_BYTES:
            raise _fail("report_data", f"the expected REPORT_DATA is {len(expected_report_data)} bytes, not 64")
        if not hmac.compare_digest(r.report_data, expected_report_data):
            raise _fail("report_data", "REPORT_DATA is not this run's binding: the report was made for another "
                                       "key exchange (replayed from another rank, session or run)")
        ok("report_data", "equals the binding")

    if policy is not None:
        for claim, detail in policy.check(r):
            ok(claim, detail)
    return passed
