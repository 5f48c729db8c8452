""":class:`SnpVerifier`: SEV-SNP attestation at the key-establishment seam.

It implements :class:`ccddp.crypto.establish.AttestationVerifier`:

- ``evidence(identity, binding)``: this machine's report with ``REPORT_DATA`` = the
  32-byte ``binding`` (a hash of this rank's establishment message: its fresh X25519
  key, identity key, nonce, rank, world size and settings) zero-padded to 64 bytes,
  plus the VCEK the host's certificate table carries;
- ``verify(rank, identity_public, evidence, binding)``: the peer's report verifies to
  AMD's pinned root, is inside the user's policy, and its ``REPORT_DATA`` is the binding
  of *the message it came with*. Evidence replayed from another rank, session or run
  carries another binding and is refused (claim ``report_data``).

Example::

    verifier = SnpVerifier(AttestationPolicy.from_file("policy.toml"), TrustStore.from_dir("amd-certs"))
    est = KeyEstablishment(Identity.generate(), verifier)

From the environment (what ``KeyEstablishment.from_env`` reads)::

    CCDDP_ATTESTATION_POLICY=policy.toml   # turns SEV-SNP attestation on
    CCDDP_ATTESTATION_CERTS=amd-certs/     # AMD's ASK/ARK (and any VCEKs), as staged
"""

from __future__ import annotations

import datetime as _dt
from typing import Protocol

from cryptography import x509

from ccddp.crypto.attest.evidence import decode_evidence, encode_evidence
from ccddp.crypto.attest.policy import AttestationPolicy
from ccddp.crypto.attest.provider import SnpProvider
from ccddp.crypto.attest.snp import REPORT_DATA_BYTES, TrustStore, load_certificates, parse_report, verify_snp
from ccddp.errors import AttestationError



class ReportProvider(Protocol):
    """Where a rank's own report comes from (the hardware; a test chain in tests)."""

    def report(self, report_data: bytes) -> tuple[bytes, bytes | None, str]:
        ...


def report_data_for(binding: bytes) -> bytes:
    """The 64-byte REPORT_DATA that carries a 32-byte binding (zero-padded)."""
    if len(binding) > REPORT_DATA_BYTES:
        raise AttestationError(f"a binding of {len(binding)} bytes does not fit REPORT_DATA", claim="report_data")
    return bytes(binding).ljust(REPORT_DATA_BYTES, b"\0")


class SnpVerifier:
    """SEV-SNP evidence for this rank, and verification of every peer's (see the module).

    ``allowlist``: optionally an :class:`~ccddp.crypto.establish.Allowlist` the identity
    key must also be on (attestation says *what* runs; the allowlist says *who*).
    ``at``: the time certificates must be valid at (default: now).
    """

    def __init__(self, policy: AttestationPolicy, trust: TrustStore, provider: ReportProvider | None = None,
                 allowlist=None, at: _dt.datetime | None = None) -> None:
        if policy.snp is None:
            raise AttestationError("the attestation policy has no [snp] table", claim="policy_file.snp")
        self.policy = policy
        self.trust = trust
        self.provider = provider if provider is not None else SnpProvider()
        self.allowlist = allowlist
        self.at = at

    def evidence(self, identity, binding: bytes) -> bytes:
        report, vcek, _source = self.provider.report(report_data_for(binding))
        return encode_evidence(report, vcek)

    def verify(self, rank: int, identity_public: bytes, evidence: bytes, binding: bytes) -> str:
        name = self.allowlist.verify(rank, identity_public, evidence, binding) if self.allowlist else None
        try:
            report, vcek_der = decode_evidence(evidence)
            vcek = load_certificates(vcek_der, f"rank {rank}'s VCEK")[0] if vcek_der else None
            verify_snp(report, self.trust, self.policy.snp, expected_report_data=report_data_for(binding),
                       vcek=vcek, at=self.at)
        except AttestationError as e:
            # The same claim, now saying whose evidence it was.
            raise AttestationError(f"rank {rank}: {e}", claim=e.claim) from None
        if name:
            return name
        r = parse_report(report)
        return f"snp:{r.measurement.hex()[:12]}@{r.chip_id.hex()[:8]}"


