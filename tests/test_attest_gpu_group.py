"""GPU attestation inside key establishment: with a ``[gpu]`` table each rank sends its
GPU's evidence beside its CPU's, the GPU report's nonce being the rank's binding (the
hash of its ephemeral key and settings, the same 32 bytes REPORT_DATA carries).

No GPU can sign a report for a fresh binding here, so the ranks' GPU reports are the
genuine H100 sample's bytes with the binding as nonce, signed again by a TEST chain that
the verifiers are told to pin (``gpu_root_pin``, never from a file or the environment);
the CPU side is the SNP test chain of test_attest_group.py. The verifier code is the one
the genuine sample passes (test_attest_gpu.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID

from _snp_test_chain import MEASUREMENT, TestChain, TestProvider
from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
from ccddp.crypto.attest.evidence import encode_combined, split_combined
from ccddp.crypto.attest.gpu import decode_gpu_evidence, parse_gpu_report
from ccddp.crypto.attest.options import attestation_environment
from ccddp.crypto.establish import Identity, parse_message
from ccddp.errors import AttestationError
from _attest_util import refused
from test_establish import establish

FIX = Path(__file__).parent / "fixtures" / "nvidia"
SAMPLE = bytes.fromhex((FIX / "hopperAttestationReport.txt").read_text().strip())

POLICY_TEXT = f'''format = "ccddp-attestation-policy/1"
[snp]
measurements = ["{MEASUREMENT.hex()}"]
min_tcb = {{ bootloader = 3, snp = 8, microcode = 115 }}
[gpu]
driver_versions = ["550.90.07"]
vbios_versions = ["96.00.9f.00.01"]
'''


class GpuTestChain:
    """TEST ONLY: a root with NVIDIA's root name and a fresh key, and a leaf carrying the
    sample's FWID; :meth:`report` signs the sample's bytes with a given nonce."""

    def __init__(self) -> None:
        root_key = ec.generate_private_key(ec.SECP384R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "NVIDIA Device Identity CA"),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "NVIDIA")])
        start, end = dt.datetime(2021, 12, 1, tzinfo=dt.timezone.utc), dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)
        self.root = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(root_key.public_key())
                     .serial_number(1).not_valid_before(start).not_valid_after(end)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(root_key, hashes.SHA384()))
        self.leaf_key = ec.generate_private_key(ec.SECP384R1())
        fwid = parse_gpu_report(SAMPLE).fwid
        leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "TEST FMC")]))
                .issuer_name(name).public_key(self.leaf_key.public_key()).serial_number(2)
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier("2.23.133.5.4.1"), bytes(16) + fwid),
                               critical=False)
                .sign(root_key, hashes.SHA384()))
        self.chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (leaf, self.root))
        der = self.root.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
        self.pin = hashlib.sha256(der).hexdigest()

    def report(self, nonce: bytes) -> bytes:
        body = SAMPLE[:4] + nonce + SAMPLE[36:-96]
        r, s = utils.decode_dss_signature(self.leaf_key.sign(body, ec.ECDSA(hashes.SHA384())))
        return body + r.to_bytes(48, "big") + s.to_bytes(48, "big")


class GpuTestProvider:
    """TEST ONLY: the GPU provider's interface over a :class:`GpuTestChain`."""

    def __init__(self, chain: GpuTestChain, cc: str = "on", replay: bytes | None = None) -> None:
        self.gchain, self.cc, self.replay = chain, cc, replay
        self.issued: list[bytes] = []

    def read(self, nonce: bytes):
        rep = self.replay if self.replay is not None else self.gchain.report(nonce)
        self.issued.append(rep)
        return rep, self.gchain.chain, self.cc, "TEST GPU chain (not hardware)"


@pytest.fixture(scope="module")
def chain() -> TestChain:
    return TestChain()


@pytest.fixture(scope="module")
def gchain() -> GpuTestChain:
    return GpuTestChain()


def _verifier(chain, gchain, gpu_provider=None, policy=POLICY_TEXT, **kw) -> TeeVerifier:
    return TeeVerifier(AttestationPolicy.from_toml(policy), TrustStore([chain.ask, chain.ark], pins=chain.pins),
                       provider=TestProvider(chain), gpu_provider=gpu_provider or GpuTestProvider(gchain),
                       gpu_root_pin=kw.pop("pin", gchain.pin), **kw)


def _ids(n):
    return [Identity.generate(f"rank{i}") for i in range(n)]


def _refused_everywhere(results, claim, rank):
    for r, res in enumerate(results):
        assert isinstance(res, AttestationError), f"rank {r}: {res!r}"
        assert res.claim == claim, (r, res.claim, str(res))
        assert f"rank {rank}" in str(res), (r, str(res))


def test_group_forms_and_every_gpu_report_carries_its_ranks_binding(chain, gchain):
    results, board = establish(_ids(3), None, verifiers=[_verifier(chain, gchain) for _ in range(3)])
    assert all(not isinstance(r, Exception) for r in results), results
    for blob in board.rounds[0].values():
        m = parse_message(blob)
        cpu, gpu_ev = split_combined(m.evidence)
        report, pem, cc = decode_gpu_evidence(gpu_ev)
        assert parse_gpu_report(report).nonce == m.binding and cc == "on" and pem == gchain.chain


def test_a_gpu_report_made_for_another_nonce_is_refused_everywhere(chain, gchain):
    stale = GpuTestProvider(gchain, replay=gchain.report(hashlib.sha256(b"an earlier run").digest()))
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, gchain), _verifier(chain, gchain, stale)])
    _refused_everywhere(results, "gpu.nonce", 1)


def test_another_ranks_gpu_report_of_this_run_is_refused(chain, gchain):
    p0 = GpuTestProvider(gchain)

    class Relay:
        def read(self, nonce):      # rank 1 presents rank 0's GPU report of this very run
            import time
            for _ in range(500):
                if p0.issued:
                    return p0.issued[0], gchain.chain, "on", "relay"
                time.sleep(0.01)
            raise AssertionError("rank 0 issued no GPU report")

    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, gchain, p0), _verifier(chain, gchain, Relay())])
    _refused_everywhere(results, "gpu.nonce", 1)


@pytest.mark.parametrize("cc", ["off", "devtools", "unknown"])
def test_a_rank_whose_gpu_is_not_in_cc_mode_is_refused(chain, gchain, cc):
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, gchain),
                                                     _verifier(chain, gchain, GpuTestProvider(gchain, cc=cc))])
    _refused_everywhere(results, "gpu.cc_mode", 1)


def test_a_driver_the_policy_does_not_list_is_refused(chain, gchain):
    strict = POLICY_TEXT.replace('"550.90.07"', '"570.00.00"')
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, gchain, policy=strict) for _ in range(2)])
    for res in results:
        assert isinstance(res, AttestationError) and res.claim == "gpu.driver_version", res


def test_nvidias_pin_refuses_the_test_chain(chain, gchain):
    from ccddp.crypto.attest.gpu import PINNED_NVIDIA_ROOT_SPKI_SHA256

    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, gchain, pin=PINNED_NVIDIA_ROOT_SPKI_SHA256)
                                                     for _ in range(2)])
    for res in results:
        assert isinstance(res, AttestationError) and res.claim == "gpu.certs.root", res


def test_cpu_evidence_without_the_gpus_is_refused_when_the_policy_has_gpu(chain, gchain):
    v = _verifier(chain, gchain)
    binding = hashlib.sha256(b"b").digest()
    cpu, gpu_ev = split_combined(v.evidence(None, binding))
    assert gpu_ev is not None
    refused("gpu.evidence", v.verify, 1, b"", cpu, binding)
    assert v.verify(1, b"", encode_combined(cpu, gpu_ev), binding).startswith("snp:")
    # Without [gpu], no GPU is asked for and a GPU part is not needed.
    cpu_only = POLICY_TEXT[:POLICY_TEXT.index("[gpu]")]
    v2 = TeeVerifier(AttestationPolicy.from_toml(cpu_only), TrustStore([chain.ask, chain.ark], pins=chain.pins),
                     provider=TestProvider(chain), gpu_provider=GpuTestProvider(gchain, replay=b"never read"))
    assert split_combined(v2.evidence(None, binding))[1] is None


def test_truncated_combined_evidence_is_refused(chain, gchain):
    v = _verifier(chain, gchain)
    binding = hashlib.sha256(b"b").digest()
    blob = v.evidence(None, binding)
    for bad in (blob[:-1], blob[:20], blob + b"\0", blob[:9] + b"\xff\xff\xff\xff" + blob[13:]):
        refused("evidence.format", v.verify, 1, b"", bad, binding)


def test_a_policy_with_only_gpu_is_refused_before_anything_starts(tmp_path):
    text = 'format = "ccddp-attestation-policy/1"\n' + POLICY_TEXT[POLICY_TEXT.index("[gpu]"):]
    policy = AttestationPolicy.from_toml(text)
    refused("policy_file.tee", TeeVerifier, policy)
    path = tmp_path / "gpu-only.toml"
    path.write_text(text)
    refused("policy_file.tee", attestation_environment, str(path), None, {})


def test_a_gpu_verifier_plug_in_replaces_the_offline_check(chain, gchain):
    seen = []

    def service(report, pem, cc, nonce, policy):      # e.g. a call to a verifier service the user runs
        seen.append((parse_gpu_report(report).nonce == nonce, cc, policy.driver_versions))
        if len(seen) > 1:
            raise AttestationError("GPU attestation refused, claim 'gpu.service': the service said no",
                                   claim="gpu.service")

    # The plug-in is asked instead of the offline check: NVIDIA's default pin (which would
    # refuse the test chain) is not consulted.
    from ccddp.crypto.attest.gpu import PINNED_NVIDIA_ROOT_SPKI_SHA256

    v = _verifier(chain, gchain, pin=PINNED_NVIDIA_ROOT_SPKI_SHA256, gpu_verifier=service)
    binding = hashlib.sha256(b"b").digest()
    blob = v.evidence(None, binding)
    assert v.verify(1, b"", blob, binding).startswith("snp:")
    assert seen == [(True, "on", frozenset({"550.90.07"}))]
    refused("gpu.service", v.verify, 1, b"", blob, binding)


def test_the_default_gpu_provider_is_nvml_at_local_rank(chain, monkeypatch):
    from ccddp.crypto.attest.provider import GpuProvider
    from ccddp.crypto.attest.verifier import _local_gpu_provider

    monkeypatch.setenv("LOCAL_RANK", "3")
    p = _local_gpu_provider()
    assert isinstance(p, GpuProvider) and p.index == 3
    monkeypatch.delenv("LOCAL_RANK")
    assert _local_gpu_provider().index == 0
    # A rank whose machine cannot give GPU evidence refuses to make evidence at all.
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    v = TeeVerifier(AttestationPolicy.from_toml(POLICY_TEXT), TrustStore([chain.ask, chain.ark], pins=chain.pins),
                    provider=TestProvider(chain))
    with pytest.raises(AttestationError) as ei:
        v.evidence(None, bytes(32))
    assert ei.value.claim == "provider" and "pynvml" in str(ei.value)
