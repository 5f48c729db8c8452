"""NVIDIA GPU attestation (Hopper and later): parse an SPDM GET_MEASUREMENTS report, and
verify it offline to NVIDIA's pinned device identity root.

What the GPU driver returns (``nvmlDeviceGetConfComputeGpuAttestationReport``) is the
SPDM 1.1 GET_MEASUREMENTS *request* the driver sent (37 bytes, with the requester's
32-byte nonce) followed by the GPU's MEASUREMENTS *response* (DMTF SPDM 1.1, DSP0274)::

    request   0 SPDMVersion 1 | 1 code 0xE0 | 2 Param1 (bit 0: signature asked) | 3 Param2
              (0xFF: all blocks) | 4 Nonce 32 | 36 SlotIDParam 1
    response  0 SPDMVersion 1 | 1 code 0x60 | 2 Param1 | 3 Param2 | 4 NumberOfBlocks 1 |
              5 MeasurementRecordLength 3 (LE) | 8 MeasurementRecord | Nonce 32 (the GPU's) |
              OpaqueLength 2 (LE) | OpaqueData | Signature 96 (ECDSA P-384 r || s)
    block     Index 1 | MeasurementSpecification 1 (1 = DMTF) | MeasurementSize 2 (LE) |
              DMTF value type 1 | value size 2 (LE) | value
    opaque    (type u16 LE | size u16 LE | data)*, NVIDIA's field ids: 3 driver version
              (ASCII, NUL-ended), 6 VBIOS version (8 bytes), 20 FWID (48 bytes), ...

The signature is over SHA-384 of ``request || response-without-signature`` with the key
of the GPU's attestation (leaf) certificate; the chain the driver returns is leaf (GSP
FMC) <- GSP BROM (per-chip) <- provisioner ICA <- GH100 Identity <- NVIDIA Device
Identity CA, the root, whose key is pinned below. This layout and these checks follow
NVIDIA's own verifier (nv-local-gpu-verifier 2.7.3, ``verifier/attestation/``,
``cc_admin_utils.py``); nothing of it is imported.

:func:`verify_gpu` checks, in this order, and raises :class:`AttestationError` naming the
first claim that fails (every claim is prefixed ``gpu.``): the report's structure
(``gpu.report.size``, ``gpu.report.request``, ``gpu.report.response``,
``gpu.report.measurement_record``, ``gpu.report.opaque``), the chain
(``gpu.certs.file``, ``gpu.certs.chain``, ``gpu.certs.root`` (pinned key),
``gpu.certs.validity``, ``gpu.certs.leaf``), the signature (``gpu.report.signature``),
the leaf's FWID against the report's (``gpu.certs.fwid``), the binding (``gpu.nonce``)
and then the user's policy (``gpu.cc_mode``, ``gpu.driver_version``,
``gpu.vbios_version``, ``gpu.measurement``; see :class:`GpuPolicy`).

Not checked here: revocation (NVIDIA's OCSP service is online; no OCSP/CRL is consulted),
and NVIDIA's signed reference measurements (RIM files): golden values are the policy's.
The CC mode is *not* in the signed report: it is what the GPU's driver said (NVML) on the
machine that produced the evidence, carried beside the report (see :func:`encode_gpu_evidence`).

Example::

    report, chain, cc = decode_gpu_evidence(blob)
    verdicts = verify_gpu(report, chain, policy.gpu, expected_nonce=binding, cc_mode=cc)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import struct
import warnings
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from ccddp.crypto.attest.snp import Verdict
from ccddp.errors import AttestationError

REQUEST_BYTES = 37
NONCE_BYTES = 32
SIGNATURE_BYTES = 96                  # ECDSA P-384: r || s, 48 bytes each, big-endian
MAX_REPORT_BYTES = 0x2000             # NVML's buffer (NVML_CC_GPU_ATTESTATION_REPORT_SIZE)
MAX_CHAIN_BYTES = 1 << 14             # NVML's is 0x1400; the PEM chain of an H100 is ~4.8 KiB
MAX_CHAIN_CERTS = 8
_MIN_RESPONSE = 8 + NONCE_BYTES + 2 + SIGNATURE_BYTES
SPDM_VERSIONS = (0x11, 0x12)          # GET_MEASUREMENTS has this layout in SPDM 1.1 and 1.2
GET_MEASUREMENTS = 0xE0
MEASUREMENTS = 0x60
DMTF_SPEC = 1

OPAQUE_DRIVER_VERSION = 3
OPAQUE_VBIOS_VERSION = 6
OPAQUE_FWID = 20
#: The TCG DICE FWID extension of the attestation (leaf) certificate; on Hopper its last
#: 48 bytes are the firmware's FWID, which the report's opaque field 20 must equal.
_OID_TCG_DICE_FWID = ("2.23.133.5.4.1", "2.23.133.5.4.1.1")

#: NVIDIA's device identity root (CN=NVIDIA Device Identity CA, O=NVIDIA; ECDSA P-384,
#: self-signed, valid 2021-11-05 .. 9999-12-31), the root of every GPU's attestation
#: chain. Copied from ``verifier/certs/verifier_device_root.pem`` of NVIDIA's
#: nv-local-gpu-verifier 2.7.3 (BSD-3-Clause), where NVIDIA's verifier pins it the same
#: way; the chain the genuine H100 sample of that package carries ends in the same
#: certificate. SHA-256 of the certificate (DER):
#: 102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48.
NVIDIA_DEVICE_ROOT_PEM = b"""-----BEGIN CERTIFICATE-----
MIICCzCCAZCgAwIBAgIQLTZwscoQBBHB/sDoKgZbVDAKBggqhkjOPQQDAzA1MSIw
IAYDVQQDDBlOVklESUEgRGV2aWNlIElkZW50aXR5IENBMQ8wDQYDVQQKDAZOVklE
SUEwIBcNMjExMTA1MDAwMDAwWhgPOTk5OTEyMzEyMzU5NTlaMDUxIjAgBgNVBAMM
GU5WSURJQSBEZXZpY2UgSWRlbnRpdHkgQ0ExDzANBgNVBAoMBk5WSURJQTB2MBAG
ByqGSM49AgEGBSuBBAAiA2IABA5MFKM7+KViZljbQSlgfky/RRnEQScW9NDZF8SX
gAW96r6u/Ve8ZggtcYpPi2BS4VFu6KfEIrhN6FcHG7WP05W+oM+hxj7nyA1r1jkB
2Ry70YfThX3Ba1zOryOP+MJ9vaNjMGEwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8B
Af8EBAMCAQYwHQYDVR0OBBYEFFeF/4PyY8xlfWi3Olv0jUrL+0lfMB8GA1UdIwQY
MBaAFFeF/4PyY8xlfWi3Olv0jUrL+0lfMAoGCCqGSM49BAMDA2kAMGYCMQCPeFM3
TASsKQVaT+8S0sO9u97PVGCpE9d/I42IT7k3UUOLSR/qvJynVOD1vQKVXf0CMQC+
EY55WYoDBvs2wPAH1Gw4LbcwUN8QCff8bFmV4ZxjCRr4WXTLFHBKjbfneGSBWwA=
-----END CERTIFICATE-----
"""
#: SHA-256 of that root's SubjectPublicKeyInfo (DER): what a chain's root must carry.
PINNED_NVIDIA_ROOT_SPKI_SHA256 = "a90c4eb5acfd3e3d03a25db6a26b84f720ad0503196c627c21ddd48dd85b06a4"

#: The CC states a provider reports (NVML ``nvmlSystemGetConfComputeState``): off, on,
#: on in developer-tools mode (debuggable, not for production), or not said (a bare report).
CC_OFF, CC_ON, CC_DEVTOOLS, CC_UNKNOWN = "off", "on", "devtools", "unknown"
_CC_CODES = {CC_OFF: 0, CC_ON: 1, CC_DEVTOOLS: 2, CC_UNKNOWN: 0xFF}


def _fail(claim: str, message: str) -> AttestationError:
    return AttestationError(f"GPU attestation refused, claim {claim!r}: {message}", claim=claim)


# -- the report ------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuReport:
    """The parsed request/response pair. ``measurements`` maps each SPDM block index
    (1-based, as the report numbers them) to its DMTF measurement value; ``opaque`` maps
    NVIDIA's opaque field ids to their data (the first of each id)."""

    raw: bytes
    spdm_version: int
    nonce: bytes                    # the requester's nonce (the request's): the binding
    slot: int
    responder_nonce: bytes          # the GPU's own nonce (the response's)
    measurements: dict[int, bytes]
    opaque: dict[int, bytes] = field(repr=False)
    signature: bytes = field(repr=False)

    @property
    def signed(self) -> bytes:
        """What the signature covers: request || response without the signature."""
        return self.raw[:-SIGNATURE_BYTES]

    @property
    def driver_version(self) -> str | None:
        raw = self.opaque.get(OPAQUE_DRIVER_VERSION)
        return None if raw is None else raw.rstrip(b"\0").decode("ascii")

    @property
    def vbios_version(self) -> str | None:
        raw = self.opaque.get(OPAQUE_VBIOS_VERSION)
        return None if raw is None else format_vbios_version(raw)

    @property
    def fwid(self) -> bytes | None:
        return self.opaque.get(OPAQUE_FWID)


def format_vbios_version(raw: bytes) -> str:
    """NVIDIA's VBIOS version string (``nvidia-smi``'s, lower case) from the report's 8
    bytes: bytes 3, 2, 1, 0, 4 in hex, dot-separated (``96.00.9f.00.01``)."""
    if len(raw) != 8:
        raise _fail("gpu.report.opaque", f"the VBIOS version field is {len(raw)} bytes, not 8")
    return ".".join(f"{raw[i]:02x}" for i in (3, 2, 1, 0, 4))


def _u(data: bytes, pos: int, n: int) -> int:
    return int.from_bytes(data[pos:pos + n], "little")


def parse_gpu_report(data: bytes) -> GpuReport:
    """Parse a report (request || response); every length is checked against what is
    there before anything is sliced, and the report must end exactly at the signature."""
    data = bytes(data)
    if len(data) > MAX_REPORT_BYTES:
        raise _fail("gpu.report.size", f"the report is {len(data)} bytes; at most {MAX_REPORT_BYTES} are accepted")
    if len(data) < REQUEST_BYTES + _MIN_RESPONSE:
        raise _fail("gpu.report.size", f"the report is {len(data)} bytes; a GET_MEASUREMENTS request and signed "
                                       f"response take at least {REQUEST_BYTES + _MIN_RESPONSE}")
    req = data[:REQUEST_BYTES]
    version, code, param1, param2 = req[0], req[1], req[2], req[3]
    if version not in SPDM_VERSIONS or code != GET_MEASUREMENTS:
        raise _fail("gpu.report.request", f"the request is SPDM version {version:#x}, code {code:#x}; a "
                                          f"GET_MEASUREMENTS (0xe0) request of SPDM {[hex(v) for v in SPDM_VERSIONS]} "
                                          "is expected")
    if not param1 & 1:
        raise _fail("gpu.report.request", "the request did not ask for a signature (Param1 bit 0 is clear)")
    resp = data[REQUEST_BYTES:]
    if resp[0] != version or resp[1] != MEASUREMENTS:
        raise _fail("gpu.report.response", f"the response is SPDM version {resp[0]:#x}, code {resp[1]:#x}; a "
                                           f"MEASUREMENTS (0x60) response of version {version:#x} is expected")
    nblocks, rec_len = resp[4], _u(resp, 5, 3)
    if rec_len > len(resp) - _MIN_RESPONSE:
        raise _fail("gpu.report.measurement_record", f"MeasurementRecordLength {rec_len} runs past the report's "
                                                     f"{len(resp)}-byte response")
    if nblocks == 0 and param2 == 0xFF:
        raise _fail("gpu.report.measurement_record", "the response carries no measurement block")
    rec = resp[8:8 + rec_len]
    measurements: dict[int, bytes] = {}
    pos = 0
    for n in range(nblocks):
        if pos + 4 > len(rec):
            raise _fail("gpu.report.measurement_record", f"block {n + 1} of {nblocks}: its header runs past the "
                                                         f"{rec_len}-byte record")
        index, spec, size = rec[pos], rec[pos + 1], _u(rec, pos + 2, 2)
        if spec != DMTF_SPEC:
            raise _fail("gpu.report.measurement_record", f"block index {index}: MeasurementSpecification {spec} is "
                                                         "not DMTF (1)")
        if pos + 4 + size > len(rec) or size < 3:
            raise _fail("gpu.report.measurement_record", f"block index {index}: MeasurementSize {size} runs past "
                                                         f"the {rec_len}-byte record")
        vsize = _u(rec, pos + 5, 2)
        if vsize != size - 3:
            raise _fail("gpu.report.measurement_record", f"block index {index}: the DMTF value size {vsize} does not "
                                                         f"match MeasurementSize {size}")
        if index in measurements or index == 0:
            raise _fail("gpu.report.measurement_record", f"block index {index} is repeated or 0")
        measurements[index] = rec[pos + 7:pos + 4 + size]
        pos += 4 + size
    if pos != rec_len:
        raise _fail("gpu.report.measurement_record", f"{nblocks} blocks take {pos} bytes; MeasurementRecordLength "
                                                     f"says {rec_len}")
    p = 8 + rec_len
    responder_nonce = resp[p:p + NONCE_BYTES]
    opaque_len = _u(resp, p + NONCE_BYTES, 2)
    p += NONCE_BYTES + 2
    if p + opaque_len + SIGNATURE_BYTES != len(resp):
        raise _fail("gpu.report.size", f"OpaqueLength {opaque_len} and a {SIGNATURE_BYTES}-byte signature do not "
                                       f"end where the report does ({len(resp) - p - opaque_len} bytes follow the "
                                       "opaque data): truncated, or bytes appended")
    op = resp[p:p + opaque_len]
    opaque: dict[int, bytes] = {}
    q = 0
    while q < len(op):
        if q + 4 > len(op):
            raise _fail("gpu.report.opaque", f"a field header at opaque offset {q} runs past the {opaque_len} bytes")
        ftype, fsize = _u(op, q, 2), _u(op, q + 2, 2)
        if q + 4 + fsize > len(op):
            raise _fail("gpu.report.opaque", f"opaque field {ftype} of {fsize} bytes runs past the opaque data")
        if ftype in opaque and ftype in (OPAQUE_DRIVER_VERSION, OPAQUE_VBIOS_VERSION, OPAQUE_FWID):
            raise _fail("gpu.report.opaque", f"opaque field {ftype} appears twice")
        opaque.setdefault(ftype, op[q + 4:q + 4 + fsize])
        q += 4 + fsize
    drv = opaque.get(OPAQUE_DRIVER_VERSION)
    if drv is not None:
        text = drv.rstrip(b"\0")
        if not text or not all(0x20 < c < 0x7F for c in text):
            raise _fail("gpu.report.opaque", "the driver version field is not a printable ASCII string")
    vb = opaque.get(OPAQUE_VBIOS_VERSION)
    if vb is not None:
        format_vbios_version(vb)
    fw = opaque.get(OPAQUE_FWID)
    if fw is not None and len(fw) != 48:
        raise _fail("gpu.report.opaque", f"the FWID field is {len(fw)} bytes, not 48")
    return GpuReport(raw=data, spdm_version=version, nonce=req[4:4 + NONCE_BYTES], slot=req[36],
                     responder_nonce=responder_nonce, measurements=measurements, opaque=opaque,
                     signature=resp[-SIGNATURE_BYTES:])


# -- the certificates ------------------------------------------------------------------

def load_gpu_chain(data: bytes, what: str = "the GPU certificate chain") -> list[x509.Certificate]:
    """The chain (leaf first) from PEM (what NVML returns) or one DER certificate."""
    if len(data) > MAX_CHAIN_BYTES:
        raise _fail("gpu.certs.file", f"{what} is {len(data)} bytes; at most {MAX_CHAIN_BYTES} are accepted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            certs = (x509.load_pem_x509_certificates(data) if b"-----BEGIN" in data
                     else [x509.load_der_x509_certificate(data)])
            for c in certs:       # parsed lazily: read every field used now, so bad input is refused here
                c.subject, c.issuer, c.extensions, c.public_key(), c.not_valid_before_utc, c.not_valid_after_utc
                c.signature_algorithm_oid, c.tbs_certificate_bytes
        except Exception as e:  # noqa: BLE001 - whatever the parser raises on bad input is a refusal
            raise _fail("gpu.certs.file", f"{what} is not well-formed X.509 (PEM or DER): {type(e).__name__}: "
                                          f"{str(e)[:200]}") from None
    if not 1 <= len(certs) <= MAX_CHAIN_CERTS:
        raise _fail("gpu.certs.file", f"{what} holds {len(certs)} certificates; 1..{MAX_CHAIN_CERTS} are accepted")
    return certs


def _spki_sha256(cert: x509.Certificate) -> str:
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _name(cert: x509.Certificate) -> str:
    return cert.subject.rfc4514_string()


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _key_usage(cert: x509.Certificate) -> x509.KeyUsage | None:
    try:
        return cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)     # issuer name, then the signature
        return True
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False


def verify_gpu_chain(chain: list[x509.Certificate], at: _dt.datetime,
                     root_pin: str = PINNED_NVIDIA_ROOT_SPKI_SHA256,
                     root: x509.Certificate | None = None) -> list[x509.Certificate]:
    """Check ``chain`` (leaf first) up to the pinned root and return it with the root
    last. The chain may end in the root (what the driver returns) or in a certificate
    the root signed; a self-signed end must carry the pinned key."""
    if root is None:
        root = x509.load_pem_x509_certificate(NVIDIA_DEVICE_ROOT_PEM)
    chain = list(chain)
    last = chain[-1]
    if last.issuer == last.subject:
        if not hmac.compare_digest(_spki_sha256(last), root_pin):
            raise _fail("gpu.certs.root", f"the chain ends in {_name(last)}, a root that does not carry NVIDIA's "
                                          "pinned device identity key")
        if not _signed_by(last, last):
            raise _fail("gpu.certs.root", f"the root {_name(last)} is not validly self-signed")
    else:
        if not hmac.compare_digest(_spki_sha256(root), root_pin):
            raise _fail("gpu.certs.root", "the root given does not carry the pinned key")
        chain.append(root)
    if len(chain) < 2:
        raise _fail("gpu.certs.chain", "the chain is the root alone: the GPU's attestation certificate is missing")
    for i in range(len(chain) - 1):
        cert, issuer = chain[i], chain[i + 1]
        ku = _key_usage(issuer)
        if not _is_ca(issuer) or (ku is not None and not ku.key_cert_sign):
            raise _fail("gpu.certs.chain", f"{_name(issuer)} signs {_name(cert)} but is not a CA (BasicConstraints, "
                                           "KeyUsage keyCertSign)")
        if not _signed_by(cert, issuer):
            raise _fail("gpu.certs.chain", f"{_name(cert)} is not signed by the next certificate, {_name(issuer)} "
                                           "(a certificate swapped, missing or out of order)")
    for cert in chain:
        if not (cert.not_valid_before_utc <= at <= cert.not_valid_after_utc):
            raise _fail("gpu.certs.validity", f"{_name(cert)} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
                                              f"{cert.not_valid_after_utc:%Y-%m-%d}, not at {at:%Y-%m-%d %H:%M} UTC")
    leaf_ku = _key_usage(chain[0])
    if leaf_ku is not None and not leaf_ku.digital_signature:
        raise _fail("gpu.certs.leaf", f"the attestation certificate {_name(chain[0])} may not sign (KeyUsage)")
    if _is_ca(chain[0]):
        raise _fail("gpu.certs.leaf", f"the chain starts with {_name(chain[0])}, a CA: not the GPU's attestation "
                                      "(leaf) certificate")
    key = chain[0].public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise _fail("gpu.certs.leaf", f"the attestation certificate {_name(chain[0])} does not hold a P-384 key")
    return chain


def _leaf_fwid(leaf: x509.Certificate) -> bytes | None:
    for ext in leaf.extensions:
        if ext.oid.dotted_string in _OID_TCG_DICE_FWID:
            raw = getattr(ext.value, "value", b"")
            return raw[-48:] if len(raw) >= 48 else b""
    return None


# -- the evidence ccddp carries --------------------------------------------------------

MAGIC_GPU = b"CCDDPGPU"
_GPU_VERSION = 1
MAX_GPU_EVIDENCE_BYTES = len(MAGIC_GPU) + 2 + 4 + MAX_REPORT_BYTES + 4 + MAX_CHAIN_BYTES


def encode_gpu_evidence(report: bytes, chain: bytes, cc_mode: str) -> bytes:
    """``b"CCDDPGPU" | version u8 (1) | CC state u8 (0 off, 1 on, 2 devtools, 255 not
    said) | report length u32 BE | report | chain length u32 BE | chain (PEM)``. The CC
    state is the driver's word, not covered by the GPU's signature."""
    if len(report) > MAX_REPORT_BYTES or len(chain) > MAX_CHAIN_BYTES or cc_mode not in _CC_CODES:
        raise _fail("gpu.evidence.format", f"cannot encode a {len(report)}-byte report, a {len(chain)}-byte chain, "
                                           f"CC mode {cc_mode!r}")
    return (MAGIC_GPU + bytes([_GPU_VERSION, _CC_CODES[cc_mode]]) + struct.pack(">I", len(report)) + report
            + struct.pack(">I", len(chain)) + chain)


def decode_gpu_evidence(blob: bytes) -> tuple[bytes, bytes, str]:
    """``(report, chain, CC mode)``, or :class:`AttestationError` (claim
    ``gpu.evidence.format``) for anything truncated, oversized or unknown."""
    blob = bytes(blob)

    def bad(message: str) -> AttestationError:
        return _fail("gpu.evidence.format", message)

    if len(blob) > MAX_GPU_EVIDENCE_BYTES:
        raise bad(f"GPU evidence is {len(blob)} bytes; at most {MAX_GPU_EVIDENCE_BYTES} are accepted")
    head = len(MAGIC_GPU) + 2 + 4
    if not blob.startswith(MAGIC_GPU) or len(blob) < head or blob[len(MAGIC_GPU)] != _GPU_VERSION:
        raise bad("not ccddp GPU evidence (magic CCDDPGPU, version 1), or its header is truncated")
    codes = {v: k for k, v in _CC_CODES.items()}
    cc = codes.get(blob[len(MAGIC_GPU) + 1])
    if cc is None:
        raise bad(f"unknown CC state code {blob[len(MAGIC_GPU) + 1]}")
    (rlen,) = struct.unpack_from(">I", blob, len(MAGIC_GPU) + 2)
    if rlen > MAX_REPORT_BYTES or len(blob) < head + rlen + 4:
        raise bad(f"report length {rlen} (at most {MAX_REPORT_BYTES}) or the evidence is truncated")
    (clen,) = struct.unpack_from(">I", blob, head + rlen)
    if clen > MAX_CHAIN_BYTES or len(blob) != head + rlen + 4 + clen:
        raise bad(f"chain length {clen} does not match the evidence's size {len(blob)}")
    return blob[head:head + rlen], blob[head + rlen + 4:], cc


def looks_like_gpu_evidence(blob: bytes) -> bool:
    return bytes(blob[:len(MAGIC_GPU)]) == MAGIC_GPU


# -- verification ----------------------------------------------------------------------

def verify_gpu(report_bytes: bytes, chain: bytes | list[x509.Certificate], policy, *,
               expected_nonce: bytes | None, cc_mode: str = CC_UNKNOWN, at: _dt.datetime | None = None,
               into: list[Verdict] | None = None, root_pin: str = PINNED_NVIDIA_ROOT_SPKI_SHA256,
               root: x509.Certificate | None = None) -> list[Verdict]:
    """Verify a GPU report end to end; return the claims that passed, in order, or raise
    :class:`AttestationError` naming the first that failed.

    ``chain``: the driver's certificate chain (PEM bytes or certificates, leaf first).
    ``expected_nonce`` (32 bytes): the binding the request's nonce must equal; ``None``
    skips that claim (the verdict says so). ``cc_mode``: the provider's word on the CC
    mode (``on``/``off``/``devtools``/``unknown``). ``policy``: a
    :class:`ccddp.crypto.attest.policy.GpuPolicy`, or None for no policy claims. ``at``:
    when the certificates must be valid (default now). ``root_pin``/``root``: tests only.
    """
    at = at or _dt.datetime.now(_dt.timezone.utc)
    passed: list[Verdict] = into if into is not None else []

    def ok(claim: str, detail: str) -> None:
        passed.append(Verdict(claim, True, detail))

    r = parse_gpu_report(report_bytes)
    ok("gpu.report.format", f"SPDM {r.spdm_version >> 4}.{r.spdm_version & 15} GET_MEASUREMENTS, "
                            f"{len(r.measurements)} blocks, {len(r.raw)} bytes")
    certs = load_gpu_chain(chain) if isinstance(chain, (bytes, bytearray, memoryview)) else list(chain)
    if not certs:
        raise _fail("gpu.certs.file", "no certificate chain was given")
    full = verify_gpu_chain(certs, at, root_pin=root_pin, root=root)
    ok("gpu.certs.chain", f"{len(full)} certificates to {_name(full[-1])} (pinned), valid at {at:%Y-%m-%d}")

    sig = r.signature
    try:
        full[0].public_key().verify(
            utils.encode_dss_signature(int.from_bytes(sig[:48], "big"), int.from_bytes(sig[48:], "big")),
            r.signed, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        raise _fail("gpu.report.signature", "the report's ECDSA P-384 signature does not verify under the GPU's "
                                            "attestation certificate") from None
    ok("gpu.report.signature", "ECDSA P-384 / SHA-384 over request || response, under the leaf")

    leaf_fwid, fwid = _leaf_fwid(full[0]), r.fwid
    if fwid is not None:
        if leaf_fwid is None or not hmac.compare_digest(leaf_fwid, fwid):
            raise _fail("gpu.certs.fwid", "the attestation certificate's FWID is not the report's: the certificate "
                                          "is for other firmware")
        ok("gpu.certs.fwid", f"the leaf's FWID equals the report's ({fwid.hex()[:16]}...)")
    else:
        ok("gpu.certs.fwid", "not compared: the report carries no FWID field")

    if expected_nonce is None:
        ok("gpu.nonce", f"not compared (no binding given): {r.nonce.hex()}")
    else:
        if len(expected_nonce) != NONCE_BYTES:
            raise _fail("gpu.nonce", f"the expected nonce is {len(expected_nonce)} bytes, not {NONCE_BYTES}")
        if not hmac.compare_digest(r.nonce, bytes(expected_nonce)):
            raise _fail("gpu.nonce", "the request's nonce is not this run's binding: the report was made for another "
                                     "key exchange (replayed from another rank, session or run)")
        ok("gpu.nonce", "equals the binding")

    if policy is not None:
        for claim, detail in policy.check(r, cc_mode):
            ok(claim, detail)
    return passed


def summary_lines(r: GpuReport) -> list[tuple[str, str]]:
    """Printable ``(label, value)`` pairs of a parsed report."""
    return [("driver", r.driver_version or "(not in the report)"),
            ("vbios", r.vbios_version or "(not in the report)"),
            ("measurements", f"{len(r.measurements)} blocks"),
            ("nonce", r.nonce.hex())]
