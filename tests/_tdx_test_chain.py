"""TEST ONLY: a PCK-shaped certificate chain (root -> CA -> PCK, ECDSA P-256) and a TDX v4
quote signer, for what the genuine fixtures cannot show (a revoked PCK). The verifier
trusts it only through ``verify_tdx(..., root_pin=chain.pin)``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID

from ccddp.crypto.attest.tdx import INTEL_TD_QE_ISVPRODID, INTEL_TD_QE_MRSIGNER

MRTD = hashlib.sha384(b"ccddp test TD").digest()


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ccddp TEST ONLY"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(cn, issuer_cn, pub, key, ca: bool):
    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(issuer_cn)).public_key(pub)
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))


def _sig(key, data: bytes) -> bytes:
    r, s = utils.decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


class TdxTestChain:
    __test__ = False  # not a pytest class

    def __init__(self) -> None:
        self.root_key, self.ca_key, self.pck_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
        self.root = _cert("Intel SGX Root CA", "Intel SGX Root CA", self.root_key.public_key(), self.root_key, True)
        self.ca = _cert("Intel SGX PCK Platform CA", "Intel SGX Root CA", self.ca_key.public_key(), self.root_key, True)
        self.pck = _cert("Intel SGX PCK Certificate", "Intel SGX PCK Platform CA", self.pck_key.public_key(),
                         self.ca_key, False)

    @property
    def pin(self) -> str:
        der = self.root.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        return hashlib.sha256(der).hexdigest()

    def crl(self, revoked: list[x509.Certificate]) -> x509.CertificateRevocationList:
        now = dt.datetime.now(dt.timezone.utc)
        b = (x509.CertificateRevocationListBuilder().issuer_name(self.ca.subject)
             .last_update(now - dt.timedelta(hours=1)).next_update(now + dt.timedelta(days=1)))
        for c in revoked:
            b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(c.serial_number)
                                          .revocation_date(now - dt.timedelta(hours=1)).build())
        return b.sign(self.ca_key, hashes.SHA256())

    def quote(self, report_data: bytes, *, mrtd: bytes = MRTD, td_attributes: int = 0x10000000) -> bytes:
        att = ec.generate_private_key(ec.SECP256R1())
        n = att.public_key().public_numbers()
        akey = n.x.to_bytes(32, "big") + n.y.to_bytes(32, "big")
        auth = bytes(range(32))
        header = struct.pack("<HHI", 4, 2, 0x81) + bytes(4) + bytes(16) + bytes(20)
        body = bytearray(584)
        body[0:16] = bytes([4, 1, 7]) + bytes(13)
        struct.pack_into("<Q", body, 120, td_attributes)
        body[136:184] = mrtd
        body[520:584] = report_data
        qe = bytearray(384)
        qe[128:160] = INTEL_TD_QE_MRSIGNER
        struct.pack_into("<H", qe, 256, INTEL_TD_QE_ISVPRODID)
        qe[320:384] = hashlib.sha256(akey + auth).digest() + bytes(32)
        pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.pck, self.ca, self.root))
        inner = struct.pack("<HI", 5, len(pem)) + pem
        cert_data = bytes(qe) + _sig(self.pck_key, bytes(qe)) + struct.pack("<H", len(auth)) + auth + inner
        sig_data = _sig(att, header + bytes(body)) + akey + struct.pack("<HI", 6, len(cert_data)) + cert_data
        return header + bytes(body) + struct.pack("<I", len(sig_data)) + sig_data


class TdxTestProvider:
    """TEST ONLY: quotes from a :class:`TdxTestChain` (the hardware provider's ``read``)."""

    __test__ = False  # not a pytest class

    def __init__(self, chain: TdxTestChain, **quote_kw) -> None:
        self.chain, self.quote_kw = chain, quote_kw

    def read(self, report_data: bytes) -> tuple[str, bytes, None, str]:
        return "tdx", self.chain.quote(report_data, **self.quote_kw), None, "TEST TDX chain (not hardware)"
