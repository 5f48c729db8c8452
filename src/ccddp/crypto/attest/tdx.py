"""Intel TDX quotes (version 4, ECDSA P-256): parse, and verify offline to Intel's root.

A v4 quote is a 48-byte header and the 584-byte TD report body, signed (ECDSA P-256,
SHA-256) by an *attestation key* the Quoting Enclave (QE) made; the QE vouches for that
key in its own SGX report (REPORTDATA = SHA-256(attestation key || QE auth data)), and
that QE report is signed by the platform's PCK key, whose certificate chains to Intel's
SGX Root CA (all certificates carried in the quote, certification data type 5 inside
type 6). :func:`verify_tdx` checks each link and raises :class:`AttestationError`
naming the first claim that fails: ``quote.size``, ``quote.version``,
``quote.att_key_type``, ``quote.tee_type``, ``quote.certification``, ``certs.file``,
``certs.root`` (pinned key, self-signed), ``certs.pck_ca``, ``certs.pck``,
``certs.validity``, ``certs.crl`` (only with CRLs given), ``qe_report.signature``,
``qe_report.identity`` (Intel's TD QE: pinned MRSIGNER, ISVPRODID 2),
``qe_report.binding``, ``quote.signature``, ``report_data`` and then the policy
(``policy.debug``, ``mrtd``, ``rtmr<i>``, ``tee_tcb_svn``).

Not evaluated: the TCB *status* from Intel's signed TCB Info and QE Identity collateral
(UpToDate / OutOfDate / revoked levels); ``min_tee_tcb_svn`` in the policy is a direct
floor on the TD's TEE_TCB_SVN instead.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from ccddp.crypto.attest.snp import Verdict, load_certificates
from ccddp.errors import AttestationError

HEADER_BYTES = 48
BODY_BYTES = 584
SIGNED_BYTES = HEADER_BYTES + BODY_BYTES          # 632: what the attestation key signs
MAX_QUOTE_BYTES = 1 << 16                         # real ones are ~5 KiB (the PCK chain in PEM)
QE_REPORT_BYTES = 384
TEE_TYPE_TDX = 0x81
ATT_KEY_ECDSA_P256 = 2
CERT_QE_REPORT = 6
CERT_PCK_CHAIN = 5
TD_ATTR_DEBUG = 1 << 0

#: SHA-256 of the SubjectPublicKeyInfo of Intel's SGX Root CA (CN=Intel SGX Root CA), the
#: root of every PCK chain (SGX and TDX). The same certificate is embedded in
#: google/go-tdx-guest (verify/trusted_root.pem) and in many other open-source verifiers.
PINNED_INTEL_ROOT_SPKI_SHA256 = "a0af031289f5d5d4132f9186068a7fc13628633ba235777472e29b6b6c67a49e"
#: Intel's TD Quoting Enclave identity (Intel's QE Identity collateral, id "TD_QE"):
#: MRSIGNER of the enclave signer, and ISVPRODID 2. A QE report with another signer is
#: not Intel's QE, whatever key signed it.
INTEL_TD_QE_MRSIGNER = bytes.fromhex("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
INTEL_TD_QE_ISVPRODID = 2


def _fail(claim: str, message: str) -> AttestationError:
    return AttestationError(f"TDX attestation refused, claim {claim!r}: {message}", claim=claim)


@dataclass(frozen=True)
class TdxQuote:
    raw: bytes                  # the quote, without any zero padding after it
    version: int
    tee_tcb_svn: bytes
    mrseam: bytes
    td_attributes: int
    xfam: int
    mrtd: bytes
    mrconfigid: bytes
    mrowner: bytes
    mrownerconfig: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]
    report_data: bytes
    signature: bytes            # r || s, big-endian, 32 bytes each
    attestation_key: bytes      # x || y, 64 bytes
    qe_report: bytes
    qe_signature: bytes
    qe_auth: bytes
    pck_chain_pem: bytes = field(repr=False)

    @property
    def debug(self) -> bool:
        return bool(self.td_attributes & TD_ATTR_DEBUG)

    def summary(self) -> dict:
        return {"version": self.version, "mrtd": self.mrtd.hex(), "rtmrs": [r.hex() for r in self.rtmrs],
                "td_attributes": f"{self.td_attributes:#x}", "debug": self.debug,
                "tee_tcb_svn": self.tee_tcb_svn.hex(), "report_data": self.report_data.hex()}


def looks_like_tdx_quote(data: bytes) -> bool:
    """A v4 quote header with the TDX TEE type (to tell a quote from an SNP report)."""
    return len(data) >= 8 and struct.unpack_from("<HHI", data, 0)[::2] == (4, TEE_TYPE_TDX)


def parse_quote(data: bytes) -> TdxQuote:
    """Parse a v4 TDX quote; every length is checked against what is there before use."""
    data = bytes(data)
    if len(data) > MAX_QUOTE_BYTES:
        raise _fail("quote.size", f"a quote of {len(data)} bytes is over the {MAX_QUOTE_BYTES}-byte limit")
    if len(data) < SIGNED_BYTES + 4:
        raise _fail("quote.size", f"{len(data)} bytes is shorter than a quote header and TD report")
    version, att_key_type, tee_type = struct.unpack_from("<HHI", data, 0)
    if version != 4:
        raise _fail("quote.version", f"quote version {version} is not 4")
    if att_key_type != ATT_KEY_ECDSA_P256:
        raise _fail("quote.att_key_type", f"attestation key type {att_key_type} is not ECDSA P-256 (2)")
    if tee_type != TEE_TYPE_TDX:
        raise _fail("quote.tee_type", f"TEE type {tee_type:#x} is not TDX (0x81)")
    (sig_len,) = struct.unpack_from("<I", data, SIGNED_BYTES)
    end = SIGNED_BYTES + 4 + sig_len
    if end > len(data):
        raise _fail("quote.size", f"the signature data ({sig_len} bytes) runs past the quote's {len(data)} bytes")
    # Quotes read through a fixed-size buffer come zero-padded; anything else after the
    # quote is not part of what was signed, and is refused rather than ignored.
    if data[end:].strip(b"\0"):
        raise _fail("quote.size", f"{len(data) - end} bytes after the quote's end are not zero padding")
    sd = data[SIGNED_BYTES + 4:end]
    if len(sd) < 128 + 6:
        raise _fail("quote.certification", "the signature data is too short for a signature and key")
    sig, akey = sd[:64], sd[64:128]
    ctype, csize = struct.unpack_from("<HI", sd, 128)
    cd = sd[134:]
    if ctype != CERT_QE_REPORT or csize != len(cd):
        raise _fail("quote.certification", f"certification data type {ctype} ({csize} bytes) is not a QE report "
                                           f"(type {CERT_QE_REPORT}) filling the rest of the signature data")
    if len(cd) < QE_REPORT_BYTES + 64 + 2:
        raise _fail("quote.certification", "the QE report certification data is truncated")
    qe_report, qe_sig = cd[:QE_REPORT_BYTES], cd[QE_REPORT_BYTES:QE_REPORT_BYTES + 64]
    (auth_len,) = struct.unpack_from("<H", cd, QE_REPORT_BYTES + 64)
    pos = QE_REPORT_BYTES + 66
    if pos + auth_len + 6 > len(cd):
        raise _fail("quote.certification", f"QE auth data of {auth_len} bytes runs past the certification data")
    auth = cd[pos:pos + auth_len]
    itype, isize = struct.unpack_from("<HI", cd, pos + auth_len)
    pem = cd[pos + auth_len + 6:]
    if itype != CERT_PCK_CHAIN or isize != len(pem):
        raise _fail("quote.certification", f"inner certification data type {itype} ({isize} bytes) is not the "
                                           f"PCK chain (type {CERT_PCK_CHAIN}) filling the rest")
    b = data[HEADER_BYTES:SIGNED_BYTES]
    return TdxQuote(
        raw=data[:end], version=version, tee_tcb_svn=b[0:16], mrseam=b[16:64],
        td_attributes=struct.unpack_from("<Q", b, 120)[0], xfam=struct.unpack_from("<Q", b, 128)[0],
        mrtd=b[136:184], mrconfigid=b[184:232], mrowner=b[232:280], mrownerconfig=b[280:328],
        rtmrs=tuple(b[328 + 48 * i:376 + 48 * i] for i in range(4)), report_data=b[520:584],
        signature=sig, attestation_key=akey, qe_report=qe_report, qe_signature=qe_sig, qe_auth=auth,
        pck_chain_pem=pem)


def _ecdsa(sig: bytes) -> bytes:
    return utils.encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate, claim: str) -> None:
    """``cert`` is signed by ``issuer`` (ECDSA), and ``issuer`` is a CA."""
    try:
        bc = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise _fail(claim, f"{issuer.subject.rfc4514_string()} is not a CA certificate")
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature) as e:
        raise _fail(claim, f"{cert.subject.rfc4514_string()} is not issued by {issuer.subject.rfc4514_string()}: "
                           f"{e or 'bad signature'}") from None


def _cn(cert: x509.Certificate) -> str:
    return _cn_name(cert.subject)


def _cn_name(name: x509.Name) -> str:
    a = name.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    return str(a[0].value) if a else ""


def verify_tdx(quote_bytes: bytes, policy, *, expected_report_data: bytes | None,
               at: _dt.datetime | None = None, crls: list[x509.CertificateRevocationList] | None = None,
               root_pin: str = PINNED_INTEL_ROOT_SPKI_SHA256, into: list[Verdict] | None = None) -> list[Verdict]:
    """Verify a quote end to end (see the module); ``policy`` is a
    :class:`ccddp.crypto.attest.policy.TdxPolicy` or None. ``crls``: Intel's PCK / root
    CRLs, each checked to be signed by the CA it names before its entries count."""
    at = at or _dt.datetime.now(_dt.timezone.utc)
    passed: list[Verdict] = into if into is not None else []

    def ok(claim: str, detail: str) -> None:
        passed.append(Verdict(claim, True, detail))

    q = parse_quote(quote_bytes)
    ok("quote.size", f"{len(q.raw)} bytes, version {q.version}, TDX, ECDSA P-256")

    certs = load_certificates(q.pck_chain_pem.rstrip(b"\0"), "the quote's PCK chain")
    if len(certs) != 3:
        raise _fail("certs.file", f"the PCK chain holds {len(certs)} certificates, not 3 (PCK, CA, root)")
    pck, ca, root = certs
    der = root.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if not hmac.compare_digest(hashlib.sha256(der).hexdigest(), root_pin):
        raise _fail("certs.root", "the chain's root does not carry Intel's pinned SGX Root CA key")
    _issued_by(root, root, "certs.root")
    _issued_by(ca, root, "certs.pck_ca")
    _issued_by(pck, ca, "certs.pck")
    if _cn(pck) != "Intel SGX PCK Certificate":
        raise _fail("certs.pck", f"the leaf {pck.subject.rfc4514_string()} is not a PCK certificate")
    for cert, name in ((root, "root"), (ca, "PCK CA"), (pck, "PCK")):
        if not (cert.not_valid_before_utc <= at <= cert.not_valid_after_utc):
            raise _fail("certs.validity", f"the {name} certificate is valid from {cert.not_valid_before_utc:%Y-%m-%d} "
                                          f"to {cert.not_valid_after_utc:%Y-%m-%d}, not at {at:%Y-%m-%d %H:%M} UTC")
    ok("certs.chain", f"PCK <- {_cn(ca)} <- Intel SGX Root CA (pinned), valid at {at:%Y-%m-%d}")
    if crls:
        by_issuer = {c.subject: c for c in (root, ca)}
        for crl in crls:
            issuer = by_issuer.get(crl.issuer)
            if issuer is None or not crl.is_signature_valid(issuer.public_key()):
                raise _fail("certs.crl", f"a CRL from {crl.issuer.rfc4514_string()} is not signed by this chain")
            # A CRL past its next update may miss a revocation since: it is refused, not
            # trusted as "nothing revoked".
            if crl.next_update_utc is not None and at > crl.next_update_utc:
                raise _fail("certs.crl", f"the CRL from {_cn_name(crl.issuer)} expired on "
                                         f"{crl.next_update_utc:%Y-%m-%d} (checked at {at:%Y-%m-%d})")
            for cert, name in ((ca, "PCK CA"), (pck, "PCK")):
                if cert.issuer == crl.issuer and crl.get_revoked_certificate_by_serial_number(cert.serial_number):
                    raise _fail("certs.crl", f"the {name} certificate (serial {cert.serial_number:x}) is revoked")
        ok("certs.crl", f"{len(crls)} CRL(s): nothing revoked")

    pck_key = pck.public_key()
    if not isinstance(pck_key, ec.EllipticCurvePublicKey) or not isinstance(pck_key.curve, ec.SECP256R1):
        raise _fail("certs.pck", "the PCK certificate does not hold a P-256 key")
    try:
        pck_key.verify(_ecdsa(q.qe_signature), q.qe_report, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise _fail("qe_report.signature", "the QE report's signature does not verify under the PCK key") from None
    ok("qe_report.signature", "ECDSA P-256 under the PCK key")
    mrsigner = q.qe_report[128:160]
    (isvprodid,) = struct.unpack_from("<H", q.qe_report, 256)
    if mrsigner != INTEL_TD_QE_MRSIGNER or isvprodid != INTEL_TD_QE_ISVPRODID:
        raise _fail("qe_report.identity", f"the QE (MRSIGNER {mrsigner.hex()[:16]}..., ISVPRODID {isvprodid}) is "
                                          "not Intel's TD Quoting Enclave")
    ok("qe_report.identity", "Intel's TD QE")
    expect = hashlib.sha256(q.attestation_key + q.qe_auth).digest() + bytes(32)
    if not hmac.compare_digest(q.qe_report[320:384], expect):
        raise _fail("qe_report.binding", "the QE report does not vouch for this quote's attestation key")
    ok("qe_report.binding", "QE REPORTDATA = SHA-256(attestation key || QE auth data)")
    try:
        akey = ec.EllipticCurvePublicNumbers(int.from_bytes(q.attestation_key[:32], "big"),
                                             int.from_bytes(q.attestation_key[32:], "big"),
                                             ec.SECP256R1()).public_key()
        akey.verify(_ecdsa(q.signature), q.raw[:SIGNED_BYTES], ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise _fail("quote.signature", "the quote's signature does not verify under its attestation key") from None
    ok("quote.signature", "ECDSA P-256 / SHA-256 under the QE-certified attestation key")

    if expected_report_data is None:
        passed.append(Verdict("report_data", True, f"not compared (no binding given): {q.report_data.hex()}"))
    elif len(expected_report_data) != 64 or not hmac.compare_digest(q.report_data, expected_report_data):
        raise _fail("report_data", "REPORTDATA is not this run's binding: the quote was made for another key "
                                   "exchange (replayed from another rank, session or run)")
    else:
        ok("report_data", "equals the binding")
    if policy is not None:
        for claim, detail in policy.check(q):
            ok(claim, detail)
    return passed


def load_crls(directory: str | Path | None) -> list[x509.CertificateRevocationList]:
    """The CRL files (``*.crl``, DER or PEM) in ``directory``; none if it is None."""
    if not directory:
        return []
    out = []
    for f in sorted(Path(directory).glob("*.crl")):
        try:
            data = f.read_bytes()[:1 << 20]
            out.append(x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data))
        except (OSError, ValueError) as e:
            raise _fail("certs.crl", f"{f} is not a readable CRL: {e}") from None
    return out
