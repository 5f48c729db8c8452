"""SEV-SNP verification on genuine, publicly published reports (tests/fixtures/attestation,
origins in its README): each verifies end to end, and each tampered variant is refused
with :class:`AttestationError` naming the claim it breaks.

Tampering happens on in-memory copies; the fixtures stay as published.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from ccddp.crypto.attest import AttestationPolicy, TrustStore, parse_report, verify_snp
from ccddp.crypto.attest.evidence import MAX_EVIDENCE_BYTES, decode_evidence, encode_evidence
from ccddp.crypto.attest.snp import PINNED_ARK_SPKI_SHA256, POLICY_DEBUG, POLICY_MIGRATE_MA, load_certificates
from ccddp.crypto.establish import EstablishmentError
from ccddp.errors import AttestationError, CCDDPError
from _attest_util import flip as _flip, refused as _refused

FIX = Path(__file__).parent / "fixtures" / "attestation"
CASES = ("gosev", "virtee")


def _report(case: str) -> bytes:
    return (FIX / f"{case}_milan_report.bin").read_bytes()


def _vcek(case: str) -> x509.Certificate:
    return load_certificates((FIX / f"{case}_milan_vcek.der").read_bytes(), "vcek")[0]


def _policy(case: str) -> AttestationPolicy:
    return AttestationPolicy.from_file(FIX / f"policy_{case}.toml")


@pytest.fixture(scope="module")
def trust() -> TrustStore:
    return TrustStore.from_dir(FIX / "amd")


def _verify(report: bytes, trust, case: str = "gosev", *, policy=None, expected=None, vcek=None, at=None):
    expected = parse_report(_report(case)).report_data if expected is None else expected
    return verify_snp(report, trust, (policy or _policy(case)).snp, expected_report_data=expected,
                      vcek=vcek if vcek is not None else _vcek(case), at=at)


# -- genuine evidence verifies ----------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_genuine_report_verifies_end_to_end(trust, case):
    verdicts = _verify(_report(case), trust, case)
    claims = [v.claim for v in verdicts]
    assert all(v.ok for v in verdicts)
    for claim in ("report.signature", "certs.chain", "vcek.match", "report_data", "policy.debug", "tcb",
                  "measurement"):
        assert claim in claims
    # The signature is checked before the binding and the policy are trusted.
    assert claims.index("report.signature") < claims.index("report_data") < claims.index("measurement")


def test_errors_are_one_family():
    assert issubclass(AttestationError, EstablishmentError) and issubclass(AttestationError, CCDDPError)


def test_the_pinned_arks_are_the_staged_ones(trust):
    assert sorted(trust.chains) == ["Genoa", "Milan"]
    assert set(PINNED_ARK_SPKI_SHA256) == {"Milan", "Genoa"}


# -- tampered evidence is refused by the claim it breaks ---------------------------------

@pytest.mark.parametrize("case", CASES)
def test_one_bit_of_measurement_breaks_the_signature(trust, case):
    _refused("report.signature", _verify, _flip(_report(case), 0x90 + 17, 3), trust, case)


@pytest.mark.parametrize("offset", [0x2A0, 0x2A0 + 71, 0x2A0 + 72, 0x2A0 + 143])
def test_tampered_signature_is_refused(trust, offset):
    _refused("report.signature", _verify, _flip(_report("gosev"), offset), trust)


def test_tampered_report_data_breaks_the_signature(trust):
    _refused("report.signature", _verify, _flip(_report("virtee"), 0x50), trust, "virtee")


@pytest.mark.parametrize("case", CASES)
def test_report_for_another_binding_is_refused(trust, case):
    other = hashlib.sha256(b"another run's binding").digest().ljust(64, b"\0")
    e = _refused("report_data", _verify, _report(case), trust, case, expected=other)
    assert "replayed" in str(e)


def test_a_measurement_the_policy_does_not_list_is_refused(trust):
    # The genuine virtee report, against the go-sev-guest policy with debug off and its TCB.
    pol = AttestationPolicy.from_toml((FIX / "policy_gosev.toml").read_text().replace("allow_debug = true", ""))
    _refused("measurement", _verify, _report("virtee"), trust, "virtee", policy=pol)


def test_debug_vm_is_refused_by_a_policy_that_forbids_debug(trust):
    # The go-sev-guest VM really was launched with debug on (guest policy 0xb0000).
    assert parse_report(_report("gosev")).debug
    strict = AttestationPolicy.from_toml((FIX / "policy_gosev.toml").read_text().replace("allow_debug = true",
                                                                                            "allow_debug = false"))
    _refused("policy.debug", _verify, _report("gosev"), trust, policy=strict)


def test_tcb_and_svn_minimums(trust):
    text = (FIX / "policy_virtee.toml").read_text()
    _refused("tcb.microcode", _verify, _report("virtee"), trust, "virtee",
             policy=AttestationPolicy.from_toml(text.replace("microcode = 115", "microcode = 116")))
    _refused("tcb.snp", _verify, _report("virtee"), trust, "virtee",
             policy=AttestationPolicy.from_toml(text.replace("snp = 8", "snp = 9")))
    _refused("guest_svn", _verify, _report("virtee"), trust, "virtee",
             policy=AttestationPolicy.from_toml(text + "min_guest_svn = 1\n"))
    _refused("host_data", _verify, _report("virtee"), trust, "virtee",
             policy=AttestationPolicy.from_toml(text + f'host_data = ["{"ab" * 32}"]\n'))


def test_policy_bits_checked_against_the_policy():
    """The policy claims on their own (the signature, checked before them, would refuse a
    flipped bit first): debug and migration agent each refused unless allowed."""
    r = parse_report(_report("virtee"))
    pol = _policy("virtee").snp
    for bit, claim, allow in ((POLICY_DEBUG, "policy.debug", "allow_debug"),
                              (POLICY_MIGRATE_MA, "policy.migration_agent", "allow_migration_agent")):
        raw = bytearray(_report("virtee"))
        struct.pack_into("<Q", raw, 8, r.policy | bit)
        _refused(claim, pol.check, parse_report(bytes(raw)))
        loose = AttestationPolicy.from_toml((FIX / "policy_virtee.toml").read_text()
                                            .replace("[snp]", f"[snp]\n{allow} = true")).snp
        assert claim in [c for c, _ in loose.check(parse_report(bytes(raw)))]


def test_vcek_of_another_chip_is_refused(trust):
    # Both genuine VCEKs chain to AMD; the virtee one is another chip's.
    _refused("vcek.chip_id", _verify, _report("gosev"), trust, vcek=_vcek("virtee"))


def _forged_vcek(like: x509.Certificate) -> x509.Certificate:
    """A VCEK with the genuine one's names and extensions but another key, signed by a key
    that is not AMD's ASK."""
    key = rsa.generate_private_key(65537, 2048)
    b = (x509.CertificateBuilder().subject_name(like.subject).issuer_name(like.issuer)
         .public_key(ec.generate_private_key(ec.SECP384R1()).public_key()).serial_number(1)
         .not_valid_before(like.not_valid_before_utc).not_valid_after(like.not_valid_after_utc))
    for ext in like.extensions:
        b = b.add_extension(ext.value, ext.critical)
    return b.sign(key, hashes.SHA384(), rsa_padding=padding.PSS(padding.MGF1(hashes.SHA384()), 48))


def test_swapped_vcek_certificate_is_refused(trust):
    _refused("certs.vcek", _verify, _report("gosev"), trust, vcek=_forged_vcek(_vcek("gosev")))


def _certs(name: str) -> list[x509.Certificate]:
    return load_certificates((FIX / "amd" / name).read_bytes(), name)


def test_swapped_ask_is_refused():
    ask, ark = _certs("ask_ark_milan.pem")
    key = rsa.generate_private_key(65537, 2048)
    fake_ask = (x509.CertificateBuilder().subject_name(ask.subject).issuer_name(ask.issuer)
                .public_key(key.public_key()).serial_number(1).not_valid_before(ask.not_valid_before_utc)
                .not_valid_after(ask.not_valid_after_utc)
                .sign(key, hashes.SHA384(), rsa_padding=padding.PSS(padding.MGF1(hashes.SHA384()), 48)))
    _refused("certs.ask", TrustStore, [fake_ask, ark])


def test_unpinned_ark_is_refused():
    key = rsa.generate_private_key(65537, 2048)
    ask, ark = _certs("ask_ark_milan.pem")
    fake_ark = (x509.CertificateBuilder().subject_name(ark.subject).issuer_name(ark.subject)
                .public_key(key.public_key()).serial_number(1).not_valid_before(ark.not_valid_before_utc)
                .not_valid_after(ark.not_valid_after_utc)
                .sign(key, hashes.SHA384(), rsa_padding=padding.PSS(padding.MGF1(hashes.SHA384()), 48)))
    _refused("certs.ark", TrustStore, [ask, fake_ark])


def test_chain_of_another_product_does_not_verify_a_milan_vcek():
    genoa_only = TrustStore(_certs("ask_ark_genoa.pem"))
    _refused("certs.ask", _verify, _report("gosev"), genoa_only)


def test_missing_ask_is_refused():
    _refused("certs.ask", TrustStore, [_certs("ask_ark_milan.pem")[1]])


@pytest.mark.parametrize("when", [dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
                                  dt.datetime(2022, 9, 1, tzinfo=dt.timezone.utc)])
def test_chain_outside_its_validity_is_refused(trust, when):
    # The gosev VCEK is valid 2022-09-24 .. 2029-09-24.
    _refused("certs.validity", _verify, _report("gosev"), trust, at=when)
    assert _verify(_report("gosev"), trust, at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc))


# -- malformed evidence ---------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 0x2A0, 1183, 1185, 4096])
def test_report_of_wrong_size_is_refused(trust, size):
    rep = (_report("gosev") * 4)[:size]
    _refused("report.size", _verify, rep, trust)


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_unknown_report_version_is_refused(trust, version):
    raw = bytearray(_report("gosev"))
    struct.pack_into("<I", raw, 0, version)
    _refused("report.version", _verify, bytes(raw), trust)


def test_wrong_signature_algorithm_or_signing_key_is_refused(trust):
    raw = bytearray(_report("gosev"))
    struct.pack_into("<I", raw, 0x34, 2)
    _refused("report.signature_algo", _verify, bytes(raw), trust)
    raw = bytearray(_report("gosev"))
    struct.pack_into("<I", raw, 0x48, 1 << 2)     # VLEK
    _refused("report.signing_key", _verify, bytes(raw), trust)


def test_evidence_container_bounds():
    rep, vcek = _report("gosev"), (FIX / "gosev_milan_vcek.der").read_bytes()
    blob = encode_evidence(rep, vcek)
    assert decode_evidence(blob) == (rep, vcek)
    assert decode_evidence(rep) == (rep, None)
    for bad in (blob[:-1], blob + b"\0", blob[:20], b"", b"CCDDPSNP", rep[:-1], b"\0" * (MAX_EVIDENCE_BYTES + 1),
                _flip(blob, 8), _flip(blob, 12, 1)):
        _refused("evidence.format", decode_evidence, bad)


def test_garbage_certificate_file_is_refused(tmp_path):
    (tmp_path / "x.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    _refused("certs.file", TrustStore.from_dir, tmp_path)
    _refused("certs.file", TrustStore.from_dir, tmp_path / "missing")


# -- the policy file ------------------------------------------------------------------------

BASE = (FIX / "policy_virtee.toml").read_text()


@pytest.mark.parametrize("text, field", [
    (BASE + "allow_debgu = false\n", "policy_file.snp.allow_debgu"),
    (BASE.replace("[snp]", "mode = 1\n[snp]"), "policy_file.mode"),
    (BASE.replace("tee = 0", "tea = 0"), "policy_file.snp.min_tcb.tea"),
    (BASE.replace('format = "ccddp-attestation-policy/1"', ""), "policy_file.format"),
    (BASE + "allow_debug = 1\n", "policy_file.snp.allow_debug"),
    (BASE + "max_vmpl = 4\n", "policy_file.snp.max_vmpl"),
    (BASE.replace("measurements = [\"7a", "measurements = [\"zz"), "policy_file.snp.measurements"),
    (BASE.replace('"7a1e5c266c01', '"'), "policy_file.snp.measurements"),
    ('format = "ccddp-attestation-policy/1"\n[snp]\nmeasurements = []\n', "policy_file.snp.measurements"),
    ('format = "ccddp-attestation-policy/1"\n', "policy_file.tee"),
    ('format = "ccddp-attestation-policy/1"\nsnp = 3\n', "policy_file.snp"),
    ("this is = = not toml", "policy_file.toml"),
    # What the host could choose has no default: a rolled-back TCB is accepted only when said.
    ("\n".join(ln for ln in BASE.splitlines() if not ln.startswith("min_tcb")), "policy_file.snp.min_tcb"),
])
def test_policy_file_refuses_unknown_or_malformed_fields(text, field):
    _refused(field, AttestationPolicy.from_toml, text)


def test_policy_file_missing_or_oversized(tmp_path):
    _refused("policy_file.file", AttestationPolicy.from_file, tmp_path / "none.toml")
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 << 20))
    _refused("policy_file.file", AttestationPolicy.from_file, big)
