""":class:`TeeVerifier`: SEV-SNP and TDX attestation at the key-establishment seam.

It implements :class:`ccddp.crypto.establish.AttestationVerifier`:

- ``evidence(identity, binding)``: this machine's SEV-SNP report (or TDX quote) with its
  user data (``REPORT_DATA`` / ``REPORTDATA``) = the 32-byte ``binding`` (a hash of this
  rank's establishment message: its fresh X25519 key, identity key, nonce, rank, world
  size and settings) zero-padded to 64 bytes; an SNP report comes with the VCEK the
  host's certificate table carries;
- ``verify(rank, identity_public, evidence, binding)``: the peer's evidence verifies to
  the vendor's pinned root (AMD's ARK, Intel's SGX Root CA), is inside the user's policy
  (its ``[snp]`` or ``[tdx]`` table: a TEE the policy has no table for is refused), and
  its user data is the binding of *the message it came with*. Evidence replayed from
  another rank, session or run carries another binding and is refused (claim
  ``report_data``).

With a ``[gpu]`` table in the policy, each rank also sends its NVIDIA GPU's evidence (the
GPU at NVML index ``LOCAL_RANK``, default 0): an SPDM report whose nonce is the same
32-byte ``binding``, its certificate chain and the driver's CC mode. A peer's must verify
to NVIDIA's pinned root, carry the binding of its message (claim ``gpu.nonce``) and
satisfy the ``[gpu]`` table (``gpu.*`` claims). GPU evidence is checked beside CPU
evidence, never instead of it: a policy with only ``[gpu]`` is refused.

Example::

    verifier = TeeVerifier(AttestationPolicy.from_file("policy.toml"), TrustStore.from_dir("amd-certs"))
    est = KeyEstablishment(Identity.generate(), verifier)

From the environment (what ``KeyEstablishment.from_env`` reads)::

    CCDDP_ATTESTATION_POLICY=policy.toml   # turns attestation on
    CCDDP_ATTESTATION_CERTS=certs/         # AMD's ASK/ARK (and any VCEKs); Intel CRLs (*.crl)
"""

from __future__ import annotations

import datetime as _dt
from typing import Protocol

from cryptography import x509

from ccddp.crypto.attest.evidence import (decode_any, encode_combined, encode_evidence, encode_tdx_evidence,
                                          split_combined)
from ccddp.crypto.attest.gpu import (PINNED_NVIDIA_ROOT_SPKI_SHA256, decode_gpu_evidence, encode_gpu_evidence,
                                     verify_gpu)
from ccddp.crypto.attest.policy import AttestationPolicy
from ccddp.crypto.attest.provider import GpuProvider, SnpProvider
from ccddp.crypto.attest.snp import REPORT_DATA_BYTES, TrustStore, load_certificates, parse_report, verify_snp
from ccddp.crypto.attest.tdx import PINNED_INTEL_ROOT_SPKI_SHA256, parse_quote, verify_tdx
from ccddp.errors import AttestationError


class EvidenceProvider(Protocol):
    """Where a rank's own evidence comes from (the hardware; a test chain in tests):
    ``(kind "snp" | "tdx", report or quote, SNP VCEK DER or None, source)``."""

    def read(self, report_data: bytes) -> tuple[str, bytes, bytes | None, str]:
        ...


def report_data_for(binding: bytes) -> bytes:
    """The 64-byte user data that carries a 32-byte binding (zero-padded)."""
    if len(binding) > REPORT_DATA_BYTES:
        raise AttestationError(f"a binding of {len(binding)} bytes does not fit REPORT_DATA", claim="report_data")
    return bytes(binding).ljust(REPORT_DATA_BYTES, b"\0")


class GpuEvidenceVerifier(Protocol):
    """How a peer's GPU evidence is judged: :func:`ccddp.crypto.attest.gpu.verify_gpu`
    offline by default; a plug-in may instead ask a verifier service the user names
    (and must then raise :class:`AttestationError` naming the claim that failed)."""

    def __call__(self, report: bytes, chain: bytes, cc_mode: str, nonce: bytes, policy) -> object:
        ...


class GpuEvidenceProvider(Protocol):
    """Where a rank's GPU evidence comes from (NVML; a test chain in tests):
    ``read(nonce) -> (report, certificate chain PEM, CC mode, source)``."""

    def read(self, nonce: bytes) -> tuple[bytes, bytes, str, str]:
        ...


def _local_gpu_provider() -> GpuProvider:
    import os

    try:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        index = 0
    return GpuProvider(index=index)


class TeeVerifier:
    """SEV-SNP or TDX evidence for this rank, and verification of every peer's (see the
    module).

    ``trust``: AMD's staged chains (needed when the policy has ``[snp]``). ``tdx_crls``:
    Intel CRLs to check PCK chains against. ``allowlist``: optionally an
    :class:`~ccddp.crypto.establish.Allowlist` the identity key must also be on
    (attestation says *what* runs; the allowlist says *who*). ``at``: the time
    certificates must be valid at (default: now). ``tdx_root_pin``: Intel's root key (a
    test passes its own chain's, never from a file or the environment). ``gpu_provider``:
    this rank's GPU evidence (default: NVML, GPU ``LOCAL_RANK``), read only when the
    policy has ``[gpu]``. ``gpu_root_pin``: NVIDIA's root key (tests only, like
    ``tdx_root_pin``). ``gpu_verifier``: replaces the offline GPU check (a
    :class:`GpuEvidenceVerifier`, e.g. one that asks a verifier service you run).
    """

    def __init__(self, policy: AttestationPolicy, trust: TrustStore | None = None,
                 provider: EvidenceProvider | None = None, allowlist=None, at: _dt.datetime | None = None,
                 tdx_crls: list[x509.CertificateRevocationList] | None = None,
                 tdx_root_pin: str = PINNED_INTEL_ROOT_SPKI_SHA256, gpu_provider: GpuEvidenceProvider | None = None,
                 gpu_root_pin: str = PINNED_NVIDIA_ROOT_SPKI_SHA256,
                 gpu_verifier: GpuEvidenceVerifier | None = None) -> None:
        if policy.snp is None and policy.tdx is None:
            raise AttestationError("attestation policy refused, claim 'policy_file.tee': the policy has only a [gpu] "
                                   "table; GPU evidence is checked beside a CPU TEE's ([snp] or [tdx]), never alone, "
                                   "so it would accept no rank", claim="policy_file.tee")
        if policy.snp is not None and trust is None:
            raise AttestationError("an [snp] policy needs AMD's staged certificates (a TrustStore)",
                                   claim="certs.ask")
        self.policy = policy
        self.trust = trust
        self.provider = provider if provider is not None else SnpProvider()
        self.allowlist = allowlist
        self.at = at
        self.tdx_crls = list(tdx_crls or [])
        self.tdx_root_pin = tdx_root_pin
        self.gpu_provider = gpu_provider
        self.gpu_root_pin = gpu_root_pin
        self.gpu_verifier = gpu_verifier

    def evidence(self, identity, binding: bytes) -> bytes:
        kind, blob, vcek, _source = self.provider.read(report_data_for(binding))
        cpu = encode_tdx_evidence(blob) if kind == "tdx" else encode_evidence(blob, vcek)
        if self.policy.gpu is None:
            return cpu
        # The GPU's nonce is the binding itself (32 bytes, the SPDM nonce's size).
        gpu_provider = self.gpu_provider if self.gpu_provider is not None else _local_gpu_provider()
        report, chain, cc, _gsource = gpu_provider.read(bytes(binding))
        return encode_combined(cpu, encode_gpu_evidence(report, chain, cc))

    def verify(self, rank: int, identity_public: bytes, evidence: bytes, binding: bytes) -> str:
        name = self.allowlist.verify(rank, identity_public, evidence, binding) if self.allowlist else None
        try:
            evidence, gpu_evidence = split_combined(evidence)
            kind, blob, vcek_der = decode_any(evidence)
            table = self.policy.snp if kind == "snp" else self.policy.tdx
            if table is None:
                raise AttestationError(f"the peer presents {kind.upper()} evidence and the policy has no [{kind}] "
                                       "table", claim="evidence.tee")
            if kind == "snp":
                vcek = load_certificates(vcek_der, f"rank {rank}'s VCEK")[0] if vcek_der else None
                verify_snp(blob, self.trust, table, expected_report_data=report_data_for(binding), vcek=vcek,
                           at=self.at)
            else:
                verify_tdx(blob, table, expected_report_data=report_data_for(binding), at=self.at,
                           crls=self.tdx_crls, root_pin=self.tdx_root_pin)
            if self.policy.gpu is not None:
                if gpu_evidence is None:
                    raise AttestationError("GPU attestation refused, claim 'gpu.evidence': the peer sent no GPU "
                                           "evidence and the policy has a [gpu] table", claim="gpu.evidence")
                report, chain, cc = decode_gpu_evidence(gpu_evidence)
                if self.gpu_verifier is not None:
                    self.gpu_verifier(report, chain, cc, bytes(binding), self.policy.gpu)
                else:
                    verify_gpu(report, chain, self.policy.gpu, expected_nonce=bytes(binding), cc_mode=cc,
                               at=self.at, root_pin=self.gpu_root_pin)
        except AttestationError as e:
            # The same claim, now saying whose evidence it was.
            raise AttestationError(f"rank {rank}: {e}", claim=e.claim) from None
        if name:
            return name
        if kind == "snp":
            r = parse_report(blob)
            return f"snp:{r.measurement.hex()[:12]}@{r.chip_id.hex()[:8]}"
        return f"tdx:{parse_quote(blob).mrtd.hex()[:12]}"
