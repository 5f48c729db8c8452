"""TEST ONLY: an SEV-SNP-shaped certificate chain and report signer made on the spot.

Genuine reports cannot be made for a binding of our choosing (only AMD firmware holds a
VCEK key), so the group-level tests and the self-test's attestation rows sign SNP-format
reports with a chain generated here (ARK -> ASK -> VCEK, AMD's algorithms and extensions)
and trust it by passing its ARK key as the pin (``TrustStore(..., pins=chain.pins)``);
AMD's pins are never changed. The hardware verifier itself is tested on the genuine
fixtures in tests/fixtures/attestation.

Why it may live in the package: it is trusted only where code passes its pins to a
``TrustStore`` by hand (the tests, ``ccddp selftest``'s attestation rows). Nothing reads
it from the environment or a file: the verifier that ``CCDDP_ATTESTATION_POLICY`` turns on
(``KeyEstablishment.from_env``) always reads the hardware and pins AMD's roots, and the
backend, the engine and DDP never import ``ccddp.testing`` (like the adversary here).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils
from cryptography.x509.oid import NameOID

from ccddp.crypto.attest.snp import REPORT_BYTES, SIGNED_BYTES

PRODUCT = "Milan"
CHIP_ID = bytes(range(64))
TCB = {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115}
MEASUREMENT = hashlib.sha384(b"ccddp test launch image").digest()
POLICY_OK = 0x30000            # SMT allowed, reserved bit 17 set; debug and migration agent off
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Engineering"),
                      x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ccddp TEST ONLY"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _der_int(v: int) -> bytes:
    return b"\x02\x01" + bytes([v]) if v < 0x80 else b"\x02\x02\x00" + bytes([v])


def _cert(subject: str, issuer: str, pub, signer, ext: list | None = None, days: int = 30):
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer)).public_key(pub)
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
         .not_valid_after(now + dt.timedelta(days=days)))
    for oid, raw in ext or []:
        b = b.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), raw), critical=False)
    return b.sign(signer, hashes.SHA384(), rsa_padding=_PSS)


class TestChain:
    """ARK/ASK (RSA-4096, RSA-PSS) and a VCEK (P-384) in AMD's shape, and a report signer."""

    __test__ = False  # not a pytest class

    def __init__(self, chip_id: bytes = CHIP_ID, tcb: dict | None = None) -> None:
        self.chip_id, self.tcb = chip_id, dict(tcb or TCB)
        self.ark_key = ark_key = rsa.generate_private_key(65537, 4096)
        ask_key = rsa.generate_private_key(65537, 4096)
        self.vcek_key = ec.generate_private_key(ec.SECP384R1())
        self.ark = _cert(f"ARK-{PRODUCT}", f"ARK-{PRODUCT}", ark_key.public_key(), ark_key)
        self.ask = _cert(f"SEV-{PRODUCT}", f"ARK-{PRODUCT}", ask_key.public_key(), ark_key)
        ext = [("1.3.6.1.4.1.3704.1.2", b"\x16\x08Milan-B0"), ("1.3.6.1.4.1.3704.1.4", chip_id)]
        ext += [(f"1.3.6.1.4.1.3704.1.3.{n}", _der_int(self.tcb[k]))
                for n, k in ((1, "bootloader"), (2, "tee"), (3, "snp"), (8, "microcode"))]
        self.vcek = _cert("SEV-VCEK", f"SEV-{PRODUCT}", self.vcek_key.public_key(), ask_key, ext)

    def crl(self, revoked: list, *, days: int = 7):
        """A CRL issued by this ARK (RSA-PSS, as AMD's), revoking ``revoked``."""
        now = dt.datetime.now(dt.timezone.utc)
        b = (x509.CertificateRevocationListBuilder().issuer_name(self.ark.subject)
             .last_update(now - dt.timedelta(days=1)).next_update(now + dt.timedelta(days=days)))
        for c in revoked:
            b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(c.serial_number)
                                          .revocation_date(now - dt.timedelta(hours=1)).build())
        return b.sign(self.ark_key, hashes.SHA384(), rsa_padding=_PSS)

    def export(self) -> dict:
        """What a spawned rank needs (keys do not pickle): certificates and the VCEK key."""
        pem = serialization.Encoding.PEM
        return {"chip_id": self.chip_id, "tcb": self.tcb, "ark": self.ark.public_bytes(pem),
                "ask": self.ask.public_bytes(pem), "vcek": self.vcek.public_bytes(pem),
                "vcek_key": self.vcek_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption())}

    @classmethod
    def load(cls, d: dict) -> "TestChain":
        self = cls.__new__(cls)
        self.chip_id, self.tcb = d["chip_id"], dict(d["tcb"])
        self.ark, self.ask, self.vcek = (x509.load_pem_x509_certificate(d[k]) for k in ("ark", "ask", "vcek"))
        self.vcek_key = serialization.load_pem_private_key(d["vcek_key"], password=None)
        return self

    @property
    def pins(self) -> dict[str, str]:
        der = self.ark.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
        return {PRODUCT: hashlib.sha256(der).hexdigest()}

    def pem(self) -> bytes:
        """ASK then ARK, as AMD's cert_chain file."""
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.ask, self.ark))

    @property
    def vcek_der(self) -> bytes:
        return self.vcek.public_bytes(serialization.Encoding.DER)

    def report(self, report_data: bytes, *, measurement: bytes = MEASUREMENT, policy: int = POLICY_OK,
               vmpl: int = 0, guest_svn: int = 0, version: int = 2) -> bytes:
        """A v2/v3-layout report carrying ``report_data``, signed by this chain's VCEK."""
        b = bytearray(REPORT_BYTES)
        tcb = bytes([self.tcb["bootloader"], self.tcb["tee"], 0, 0, 0, 0, self.tcb["snp"], self.tcb["microcode"]])
        struct.pack_into("<IIQ", b, 0, version, guest_svn, policy)
        struct.pack_into("<II", b, 0x30, vmpl, 1)            # VMPL, signature algo ECDSA P-384
        b[0x38:0x40] = tcb                                    # CURRENT_TCB
        struct.pack_into("<Q", b, 0x40, 1)                    # PLATFORM_INFO: SMT enabled
        b[0x50:0x90] = report_data
        b[0x90:0xC0] = measurement
        b[0x180:0x188] = tcb                                  # REPORTED_TCB
        b[0x1A0:0x1E0] = self.chip_id
        b[0x1E0:0x1E8] = tcb                                  # COMMITTED_TCB
        b[0x1F0:0x1F8] = tcb                                  # LAUNCH_TCB
        r, s = utils.decode_dss_signature(self.vcek_key.sign(bytes(b[:SIGNED_BYTES]), ec.ECDSA(hashes.SHA384())))
        b[SIGNED_BYTES:SIGNED_BYTES + 72] = r.to_bytes(72, "little")
        b[SIGNED_BYTES + 72:SIGNED_BYTES + 144] = s.to_bytes(72, "little")
        return bytes(b)


class TestProvider:
    """TEST ONLY: a report provider that signs with a :class:`TestChain` (the hardware
    provider's interface: ``report(report_data) -> (report, VCEK DER, source)``).
    ``replay`` makes it return that fixed evidence instead, whatever it is asked for."""

    __test__ = False  # not a pytest class

    def __init__(self, chain: TestChain, replay: tuple[bytes, bytes] | None = None, **report_kw) -> None:
        self.chain, self.replay, self.report_kw = chain, replay, report_kw
        self.issued: list[bytes] = []

    def read(self, report_data: bytes) -> tuple[str, bytes, bytes | None, str]:
        return ("snp", *self.report(report_data))

    def report(self, report_data: bytes) -> tuple[bytes, bytes | None, str]:
        if self.replay is not None:
            return self.replay[0], self.replay[1], "test replay"
        rep = self.chain.report(report_data, **self.report_kw)
        self.issued.append(rep)
        return rep, self.chain.vcek_der, "TEST chain (not hardware)"
