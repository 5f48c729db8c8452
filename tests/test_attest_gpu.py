"""NVIDIA GPU attestation on a genuine H100 report (tests/fixtures/nvidia, origin in its
README): it verifies offline to NVIDIA's pinned device root, and each tampered variant is
refused with :class:`AttestationError` naming the claim it breaks. The NVML provider runs
against a fake ``pynvml`` module (no GPU is needed, none is used).

The sample's certificates are valid from 2020/2021 to 9999-12-31, so the time check uses
the real clock; one test also checks a fixed time before the root's validity (refused).
The sample's CC mode is not in the signed report (no Hopper report carries it): where a
test needs it, it states it as the provider would (``cc_mode="on"``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
import sys
import types
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID

from ccddp.cli import main
from ccddp.crypto.attest import gpu
from ccddp.crypto.attest import provider as provider_mod
from ccddp.crypto.attest.gpu import (MAX_REPORT_BYTES, NVIDIA_DEVICE_ROOT_PEM, PINNED_NVIDIA_ROOT_SPKI_SHA256,
                                     decode_gpu_evidence, encode_gpu_evidence, load_gpu_chain, parse_gpu_report,
                                     verify_gpu)
from ccddp.crypto.attest.policy import AttestationPolicy, GpuPolicy
from ccddp.crypto.attest.provider import GpuProvider, NoEvidenceError
from ccddp.errors import AttestationError
from _attest_util import ANY_BUT_MRTD, flip, refused

FIX = Path(__file__).parent / "fixtures" / "nvidia"
REPORT = bytes.fromhex((FIX / "hopperAttestationReport.txt").read_text().strip())
CHAIN = (FIX / "hopperCertChain.txt").read_bytes()
NONCE = REPORT[4:36]                       # the request's nonce: what the report was made for
BLOCK = 4 + 3 + 48                         # every Hopper block: header, DMTF header, SHA-384 value
RECORD = 37 + 8                            # the measurement record's offset in the report

POLICY = """format = "ccddp-attestation-policy/1"
[gpu]
driver_versions = ["550.90.07"]
vbios_versions = ["96.00.9F.00.01"]
"""


def _value_offset(index: int) -> int:
    """Where block ``index``'s (1-based) value starts in the report."""
    return RECORD + (index - 1) * BLOCK + 7


def _policy(text: str = POLICY) -> GpuPolicy:
    return AttestationPolicy.from_toml(text).gpu


def _verify(report: bytes = REPORT, chain=CHAIN, *, policy: GpuPolicy | None = None, nonce: bytes | None = NONCE,
            cc: str = "on", **kw):
    return verify_gpu(report, chain, policy or _policy(), expected_nonce=nonce, cc_mode=cc, **kw)


# -- the genuine report verifies -----------------------------------------------------------

def test_genuine_h100_report_verifies_offline_to_the_pinned_root():
    verdicts = _verify()
    claims = [v.claim for v in verdicts]
    assert claims == ["gpu.report.format", "gpu.certs.chain", "gpu.report.signature", "gpu.certs.fwid", "gpu.nonce",
                      "gpu.cc_mode", "gpu.driver_version", "gpu.vbios_version", "gpu.measurement"]
    assert all(v.ok for v in verdicts)
    assert "NVIDIA Device Identity CA" in verdicts[1].detail and "pinned" in verdicts[1].detail
    # The same at a fixed time inside every certificate's validity.
    _verify(at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))


def test_the_parsed_report():
    r = parse_gpu_report(REPORT)
    assert (r.spdm_version, r.driver_version, r.vbios_version) == (0x11, "550.90.07", "96.00.9f.00.01")
    assert sorted(r.measurements) == list(range(1, 65)) and {len(v) for v in r.measurements.values()} == {48}
    assert r.measurements[2] == REPORT[_value_offset(2):_value_offset(2) + 48]
    assert r.nonce.hex() == "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
    assert len(r.fwid) == 48 and r.responder_nonce != r.nonce


def test_the_pinned_root_is_nvidias_published_one():
    root = x509.load_pem_x509_certificate(NVIDIA_DEVICE_ROOT_PEM)
    assert root == x509.load_pem_x509_certificate((FIX / "verifier_device_root.pem").read_bytes())
    assert root == load_gpu_chain(CHAIN)[-1]               # the chain the GPU returned ends in it
    spki = root.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert hashlib.sha256(spki).hexdigest() == PINNED_NVIDIA_ROOT_SPKI_SHA256
    assert hashlib.sha256(root.public_bytes(serialization.Encoding.DER)).hexdigest() == (
        "102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48")


def test_a_chain_without_its_root_is_completed_with_the_pinned_one():
    certs = load_gpu_chain(CHAIN)[:-1]
    assert [v.claim for v in _verify(chain=certs)][:3] == ["gpu.report.format", "gpu.certs.chain",
                                                           "gpu.report.signature"]


def test_golden_measurements_from_the_policy():
    r = parse_gpu_report(REPORT)
    text = POLICY + f'measurements = {{ "2" = ["{r.measurements[2].hex()}"], "3" = ["{r.measurements[3].hex()}", ' \
                    f'"{"00" * 48}"] }}\n'
    assert "2 blocks equal" in _verify(policy=_policy(text))[-1].detail
    wrong = POLICY + f'measurements = {{ "2" = ["{r.measurements[3].hex()}"] }}\n'
    e = refused("gpu.measurement", _verify, policy=_policy(wrong))
    assert "block 2" in str(e)
    missing = POLICY + f'measurements = {{ "65" = ["{"00" * 48}"] }}\n'
    refused("gpu.measurement", _verify, policy=_policy(missing))


# -- tampered evidence is refused by the claim it breaks -----------------------------------

@pytest.mark.parametrize("index, byte, bit", [(2, 0, 0), (3, 17, 5), (64, 47, 7)])
def test_one_bit_of_a_measurement_breaks_the_signature(index, byte, bit):
    refused("gpu.report.signature", _verify, flip(REPORT, _value_offset(index) + byte, bit))


@pytest.mark.parametrize("offset", [-96, -49, -48, -1])
def test_a_tampered_signature_is_refused(offset):
    refused("gpu.report.signature", _verify, flip(REPORT, len(REPORT) + offset))


def test_the_nonce_is_signed_and_must_be_the_binding():
    # A changed nonce in the report: the signature covers the request.
    refused("gpu.report.signature", _verify, flip(REPORT, 4 + 9), nonce=None)
    # The genuine report against another run's binding: replayed evidence.
    e = refused("gpu.nonce", _verify, nonce=hashlib.sha256(b"another run's binding").digest())
    assert "replayed" in str(e)
    refused("gpu.nonce", _verify, nonce=NONCE[:16])
    assert _verify(nonce=None)[4].detail.startswith("not compared")


def test_a_driver_or_vbios_version_the_policy_does_not_list_is_refused():
    refused("gpu.driver_version", _verify, policy=_policy(POLICY.replace("550.90.07", "550.90.08")))
    refused("gpu.vbios_version", _verify, policy=_policy(POLICY.replace("96.00.9F.00.01", "96.00.9F.00.02")))
    # The version in the report is signed: editing it breaks the signature, not the policy.
    pos = REPORT.index(b"550.90.07")
    refused("gpu.report.signature", _verify, REPORT[:pos] + b"555" + REPORT[pos + 3:])


@pytest.mark.parametrize("cc", ["off", "unknown", "devtools"])
def test_cc_mode_must_be_on(cc):
    e = refused("gpu.cc_mode", _verify, cc=cc)
    assert cc in str(e)


def test_devtools_mode_only_where_the_policy_allows_it():
    verdicts = _verify(cc="devtools", policy=_policy(POLICY + "allow_devtools = true\n"))
    assert "devtools" in verdicts[5].detail


def test_certificates_swapped_cut_or_reordered_are_refused():
    certs = load_gpu_chain(CHAIN)
    refused("gpu.certs.chain", _verify, chain=[certs[0], certs[2], certs[3], certs[4]])      # BROM cut out
    refused("gpu.certs.chain", _verify, chain=[certs[0], certs[1], certs[3], certs[4]])      # ICA cut out
    refused("gpu.certs.chain", _verify, chain=[certs[1], certs[0], certs[2], certs[3], certs[4]])  # reordered
    refused("gpu.certs.chain", _verify, chain=[certs[4]])                                   # the root alone
    # A certificate swapped for one with the same names but another key.
    fake_ica = _cert(certs[2].subject, certs[3].subject, ec.generate_private_key(ec.SECP384R1()).public_key(),
                     ec.generate_private_key(ec.SECP384R1()), ca=True)
    refused("gpu.certs.chain", _verify, chain=[certs[0], certs[1], fake_ica, certs[3], certs[4]])
    # The leaf left out: the chain starts with the BROM's CA certificate (genuine, and a
    # valid chain, but a CA is not an attestation key).
    refused("gpu.certs.leaf", _verify, chain=certs[1:])


def test_a_chain_to_another_root_is_refused():
    certs = load_gpu_chain(CHAIN)
    # NVIDIA's names, another key: the pin refuses it.
    fake_root_key = ec.generate_private_key(ec.SECP384R1())
    fake_root = _cert(certs[4].subject, certs[4].subject, fake_root_key.public_key(), fake_root_key, ca=True)
    refused("gpu.certs.root", _verify, chain=certs[:4] + [fake_root])


def test_a_self_made_chain_and_report_are_refused_only_by_the_pin():
    chain, report, root = _self_made(NONCE)
    refused("gpu.certs.root", _verify, report, chain)
    pin = _spki(root)
    # With its own root pinned (what a test may do, never a file or the environment) it
    # verifies: so it is the pin, and nothing else, that refuses NVIDIA's look-alike.
    assert _verify(report, chain, root_pin=pin)[-1].ok
    refused("gpu.report.signature", _verify, flip(report, _value_offset(5)), chain, root_pin=pin)


def test_the_leaf_must_carry_the_reports_fwid():
    chain, report, root = _self_made(NONCE, leaf_fwid=bytes(48))
    refused("gpu.certs.fwid", _verify, report, chain, root_pin=_spki(root))
    chain, report, root = _self_made(NONCE, leaf_fwid=None)
    refused("gpu.certs.fwid", _verify, report, chain, root_pin=_spki(root))


def test_certificates_outside_their_validity_are_refused():
    e = refused("gpu.certs.validity", _verify, at=dt.datetime(2021, 1, 1, tzinfo=dt.timezone.utc))
    assert "NVIDIA" in str(e)


def test_a_wrong_curve_leaf_is_refused():
    chain, report, root = _self_made(NONCE, curve=ec.SECP256R1())
    refused("gpu.certs.leaf", _verify, report, chain, root_pin=_spki(root))


@pytest.mark.parametrize("cut, claim", [
    (1, "gpu.report.size"), (96, "gpu.report.size"), (len(REPORT) - 37, "gpu.report.size"),
    (len(REPORT) - 1, "gpu.report.size"),
    # Cut inside the measurement record: its declared length runs past the end.
    (len(REPORT) // 2, "gpu.report.measurement_record"),
])
def test_a_truncated_report_is_refused_before_anything_is_read(cut, claim):
    e = refused(claim, _verify, REPORT[:-cut])
    assert "byte" in str(e)


@pytest.mark.parametrize("extra", [1, 96, MAX_REPORT_BYTES])
def test_an_oversized_report_is_refused(extra):
    refused("gpu.report.size", _verify, REPORT + bytes(extra))


@pytest.mark.parametrize("offset, value, claim", [
    (1, 0x81, "gpu.report.request"),             # not GET_MEASUREMENTS
    (0, 0x10, "gpu.report.request"),             # SPDM 1.0
    (2, 0x00, "gpu.report.request"),             # no signature asked for
    (37 + 1, 0xE0, "gpu.report.response"),       # not MEASUREMENTS
    (37 + 0, 0x12, "gpu.report.response"),       # the response's version is not the request's
    (37 + 7, 0xFF, "gpu.report.measurement_record"),   # MeasurementRecordLength past the end
    (37 + 4, 65, "gpu.report.measurement_record"),     # one block more than the record holds
    (37 + 4, 63, "gpu.report.measurement_record"),     # one block fewer than the record holds
    (RECORD + 1, 2, "gpu.report.measurement_record"),  # block 1 not DMTF
    (RECORD + BLOCK, 1, "gpu.report.measurement_record"),  # block 2 numbered 1 again
    (RECORD + 2, 0xFF, "gpu.report.measurement_record"),   # block 1's size past the record
])
def test_malformed_fields_are_refused_naming_the_field(offset, value, claim):
    b = bytearray(REPORT)
    b[offset] = value
    refused(claim, _verify, bytes(b))


def test_malformed_opaque_data_is_refused():
    r = parse_gpu_report(REPORT)
    op_len_at = RECORD + len(r.measurements) * BLOCK + 32
    (olen,) = struct.unpack_from("<H", REPORT, op_len_at)
    b = bytearray(REPORT)
    struct.pack_into("<H", b, op_len_at, olen + 1)            # opaque data past the signature's start
    refused("gpu.report.size", _verify, bytes(b))
    b = bytearray(REPORT)
    struct.pack_into("<H", b, op_len_at + 2 + 2, 0xFFFF)      # the first field's size past the opaque data
    refused("gpu.report.opaque", _verify, bytes(b))
    b = bytearray(REPORT)
    vb = REPORT.index(bytes.fromhex("0600080000"))             # VBIOS field: type 6, size 8
    struct.pack_into("<H", b, vb + 2, 7)
    b[vb + 4 + 7:vb + 4 + 8] = b""                            # one byte shorter, lengths kept consistent
    struct.pack_into("<H", b, op_len_at, olen - 1)
    refused("gpu.report.opaque", _verify, bytes(b))


def test_malformed_certificate_files_are_refused():
    refused("gpu.certs.file", load_gpu_chain, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    refused("gpu.certs.file", load_gpu_chain, b"\x30\x03garbage")
    refused("gpu.certs.file", load_gpu_chain, CHAIN * 4)           # more than 16 KiB
    refused("gpu.certs.file", load_gpu_chain, CHAIN + CHAIN)       # 10 certificates


# -- ccddp's GPU evidence ------------------------------------------------------------------

def test_evidence_round_trip_and_bounds():
    blob = encode_gpu_evidence(REPORT, CHAIN, "on")
    assert decode_gpu_evidence(blob) == (REPORT, CHAIN, "on")
    assert decode_gpu_evidence(encode_gpu_evidence(REPORT, CHAIN, "unknown"))[2] == "unknown"
    for bad in (blob[:-1], blob + b"\0", blob[:12], b"CCDDPSNP" + blob[8:], blob[:8] + b"\x02" + blob[9:],
                blob[:9] + b"\x07" + blob[10:], blob + bytes(1 << 15)):
        refused("gpu.evidence.format", decode_gpu_evidence, bad)
    refused("gpu.evidence.format", encode_gpu_evidence, REPORT, CHAIN, "maybe")


# -- the policy file -----------------------------------------------------------------------

@pytest.mark.parametrize("extra, claim", [
    ("driver_verions = []\n", "policy_file.gpu.driver_verions"),
    ("allow_devtools = 1\n", "policy_file.gpu.allow_devtools"),
    ('measurements = { "0" = ["00"] }\n', "policy_file.gpu.measurements.0"),
    ('measurements = { "x" = ["00"] }\n', "policy_file.gpu.measurements.x"),
    ('measurements = { "2" = [] }\n', "policy_file.gpu.measurements.2"),
    ('measurements = { "2" = ["00", "0000"] }\n', "policy_file.gpu.measurements.2"),
    ('measurements = { "2" = ["zz"] }\n', "policy_file.gpu.measurements.2"),
    ("measurements = 3\n", "policy_file.gpu.measurements"),
])
def test_policy_fields_are_checked(extra, claim):
    refused(claim, AttestationPolicy.from_toml, POLICY + extra)


def test_policy_requires_the_versions():
    refused("policy_file.gpu.driver_versions", AttestationPolicy.from_toml,
            POLICY.replace('driver_versions = ["550.90.07"]\n', ""))
    refused("policy_file.gpu.vbios_versions", AttestationPolicy.from_toml, POLICY.replace('"96.00.9F.00.01"', ""))
    refused("policy_file.gpu", AttestationPolicy.from_toml, 'format = "ccddp-attestation-policy/1"\ngpu = 1\n')
    pol = AttestationPolicy.from_toml(POLICY)
    assert pol.snp is None and pol.tdx is None and pol.gpu.vbios_versions == {"96.00.9f.00.01"}


# -- the NVML provider, against a fake pynvml ----------------------------------------------

class _Struct(types.SimpleNamespace):
    pass


def _fake_nvml(*, cc_feature: int = 1, devtools: int = 0, count: int = 1, report: bytes = REPORT,
               chain: bytes = CHAIN, init_error: Exception | None = None) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    calls = m.calls = []

    def init():
        calls.append("init")
        if init_error:
            raise init_error
    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    m.nvmlSystemGetConfComputeState = lambda: _Struct(environment=2, ccFeature=cc_feature, devToolsMode=devtools)

    def get_report(handle, nonce):
        calls.append(("report", bytes(nonce)))
        buf = report + bytes(MAX_REPORT_BYTES - len(report))
        return _Struct(attestationReportSize=len(report), attestationReport=list(buf))
    m.nvmlDeviceGetConfComputeGpuAttestationReport = get_report
    m.nvmlDeviceGetConfComputeGpuCertificate = lambda h: _Struct(attestationCertChainSize=len(chain),
                                                                 attestationCertChain=list(chain + bytes(64)))
    return m


def test_provider_says_cc_mode_off_in_one_line(monkeypatch):
    fake = _fake_nvml(cc_feature=0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(NoEvidenceError) as ei:
        GpuProvider().read(NONCE)
    msg = str(ei.value)
    assert "\n" not in msg and "CC" in msg and "off" in msg and "H100" in msg
    assert not any(isinstance(c, tuple) for c in fake.calls)     # no report was asked for
    assert fake.calls[-1] == "shutdown"
    assert GpuProvider().state() == ("off", "GPU 0 (NVIDIA H100 80GB HBM3)")


def test_provider_says_pynvml_is_missing_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)              # import pynvml -> ImportError
    with pytest.raises(NoEvidenceError) as ei:
        GpuProvider().read(NONCE)
    assert "pynvml is not installed" in str(ei.value) and "\n" not in str(ei.value)
    assert ei.value.claim == "provider"


@pytest.mark.parametrize("fake, words", [
    (dict(count=0), "sees 0 GPUs"),
    (dict(init_error=RuntimeError("Driver Not Loaded")), "Driver Not Loaded"),
])
def test_provider_says_what_else_is_missing(monkeypatch, fake, words):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(**fake))
    with pytest.raises(NoEvidenceError) as ei:
        GpuProvider().read(NONCE)
    assert words in str(ei.value) and "\n" not in str(ei.value)


def test_provider_returns_the_gpus_report_for_the_nonce(monkeypatch):
    fake = _fake_nvml(devtools=1)
    report, chain, cc, source = GpuProvider(nvml=fake).read(NONCE)
    assert (report, chain, cc) == (REPORT, CHAIN, "devtools") and "H100" in source
    assert ("report", NONCE) in fake.calls and fake.calls[-1] == "shutdown"
    # A report for another nonce (a stale or wrong one) is caught by the provider.
    with pytest.raises(AttestationError) as ei:
        GpuProvider(nvml=fake).read(bytes(32))
    assert ei.value.claim == "provider"


# -- the CLI -------------------------------------------------------------------------------

def _cli_verify(tmp_path, capsys, blob: bytes, *extra: str, policy: str = POLICY):
    ev, pol = tmp_path / "gpu.ev", tmp_path / "policy.toml"
    ev.write_bytes(blob)
    pol.write_text(policy)
    rc = main(["attest", "verify", str(ev), "--policy", str(pol), *extra])
    return rc, capsys.readouterr().out


def test_cli_verifies_saved_gpu_evidence(tmp_path, capsys):
    rc, out = _cli_verify(tmp_path, capsys, encode_gpu_evidence(REPORT, CHAIN, "on"), "--nonce", NONCE.hex())
    assert rc == 0, out
    for claim in ("gpu.certs.chain", "gpu.report.signature", "gpu.nonce", "gpu.cc_mode", "gpu.driver_version"):
        assert f"ok    {claim}" in out
    assert out.strip().endswith("9 claims hold")


@pytest.mark.parametrize("blob, extra, claim", [
    (encode_gpu_evidence(REPORT, CHAIN, "on"), ("--nonce", "00" * 32), "gpu.nonce"),
    (encode_gpu_evidence(REPORT, CHAIN, "off"), (), "gpu.cc_mode"),
    (encode_gpu_evidence(flip(REPORT, _value_offset(7)), CHAIN, "on"), (), "gpu.report.signature"),
    (encode_gpu_evidence(REPORT, CHAIN, "on")[:-1], (), "gpu.evidence.format"),
    (REPORT.hex().encode(), ("--gpu-chain", str(FIX / "hopperCertChain.txt")), "gpu.cc_mode"),  # a bare report
    (REPORT[:-1], ("--gpu-chain", str(FIX / "hopperCertChain.txt")), "gpu.report.size"),
])
def test_cli_names_the_refused_gpu_claim(tmp_path, capsys, blob, extra, claim):
    rc, out = _cli_verify(tmp_path, capsys, blob, *extra)
    assert rc == 2, out
    assert f"FAIL  {claim}" in out and f"refused: claim '{claim}' failed" in out


def test_cli_refuses_gpu_evidence_against_a_policy_without_gpu(tmp_path, capsys):
    rc, out = _cli_verify(tmp_path, capsys, encode_gpu_evidence(REPORT, CHAIN, "on"),
                          policy=POLICY.replace("[gpu]", "[tdx]\nmrtds = [\"" + "00" * 48 + "\"]\n" + ANY_BUT_MRTD + "[gpu]"))
    assert rc == 0, out             # with [gpu] too it verifies
    text = 'format = "ccddp-attestation-policy/1"\n[tdx]\nmrtds = ["' + "00" * 48 + '"]\n' + ANY_BUT_MRTD
    rc, out = _cli_verify(tmp_path, capsys, encode_gpu_evidence(REPORT, CHAIN, "on"), policy=text)
    assert rc == 2 and "FAIL  policy_file.gpu" in out


def _no_cpu_tee(monkeypatch, tmp_path):
    monkeypatch.setattr(provider_mod, "TSM_ROOT", str(tmp_path / "tsm" / "report"))
    monkeypatch.setattr(provider_mod, "SEV_GUEST", str(tmp_path / "sev-guest"))


def test_attest_on_a_gpu_machine_without_a_cpu_tee(tmp_path, monkeypatch, capsys):
    # The lent H100's case: a GPU with CC mode off, no CPU TEE: exit 1 (the CPU part's
    # contract), the GPU's line after the CPU's.
    _no_cpu_tee(monkeypatch, tmp_path)
    gpus = tmp_path / "gpus"
    (gpus / "0000:00:01.0").mkdir(parents=True)
    monkeypatch.setattr(provider_mod, "NVIDIA_PROC", str(gpus))
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(cc_feature=0))
    assert main(["attest"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 2, err
    assert "sev-guest" in lines[0] and lines[1].startswith("ccddp attest: gpu:") and "CC" in lines[1]


def test_attest_on_a_gpu_machine_without_a_cpu_tee_in_cc_mode(tmp_path, monkeypatch, capsys):
    _no_cpu_tee(monkeypatch, tmp_path)
    gpus = tmp_path / "gpus"
    (gpus / "0000:00:01.0").mkdir(parents=True)
    monkeypatch.setattr(provider_mod, "NVIDIA_PROC", str(gpus))
    fake = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # The fake GPU answers with the sample, made for the sample's nonce: pass it as report data.
    assert main(["attest", "--report-data", NONCE.hex(), "--gpu-out", str(tmp_path / "g.ev")]) == 1
    err = capsys.readouterr().err
    assert "CC mode on" in err and "verified to NVIDIA's pinned root" in err and "550.90.07" in err
    assert decode_gpu_evidence((tmp_path / "g.ev").read_bytes()) == (REPORT, CHAIN, "on")


def test_attest_without_a_gpu_driver_keeps_its_one_line(tmp_path, monkeypatch, capsys):
    _no_cpu_tee(monkeypatch, tmp_path)
    monkeypatch.setattr(provider_mod, "NVIDIA_PROC", str(tmp_path / "no-such-dir"))
    assert main(["attest"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1


# -- helpers: a self-made chain and report (NVIDIA's look-alike) ---------------------------

def _cert(subject, issuer, public_key, signer, *, ca: bool, fwid: bytes | None = None) -> x509.Certificate:
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
         .serial_number(x509.random_serial_number())
         .not_valid_before(dt.datetime(2021, 12, 1, tzinfo=dt.timezone.utc))
         .not_valid_after(dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone.utc)))
    if ca:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    if fwid is not None:
        b = b.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier("2.23.133.5.4.1"),
                                                       b"\x30\x10" + bytes(14) + fwid), critical=False)
    return b.sign(signer, hashes.SHA384())


def _spki(cert: x509.Certificate) -> str:
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _self_made(nonce: bytes, *, leaf_fwid: bytes | None | str = "same", curve=None):
    """A chain with NVIDIA's root name and a fresh key, and the genuine report's bytes with
    ``nonce`` in its request, signed again by the chain's leaf."""
    root_key = ec.generate_private_key(ec.SECP384R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "NVIDIA Device Identity CA"),
                           x509.NameAttribute(NameOID.ORGANIZATION_NAME, "NVIDIA")])
    root = _cert(root_name, root_name, root_key.public_key(), root_key, ca=True)
    leaf_key = ec.generate_private_key(curve or ec.SECP384R1())
    fwid = parse_gpu_report(REPORT).fwid if leaf_fwid == "same" else leaf_fwid
    leaf = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "GH100 A01 GSP FMC LF")]), root_name,
                 leaf_key.public_key(), root_key, ca=False, fwid=fwid)
    body = REPORT[:4] + nonce + REPORT[36:-96]
    if isinstance(leaf_key.curve, ec.SECP384R1):
        r, s = utils.decode_dss_signature(leaf_key.sign(body, ec.ECDSA(hashes.SHA384())))
        sig = r.to_bytes(48, "big") + s.to_bytes(48, "big")
    else:
        sig = bytes(96)
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (leaf, root))
    return chain, body + sig, root


def test_gpu_module_exports():
    assert gpu.CC_ON == "on" and gpu.MAX_REPORT_BYTES == 0x2000


def test_attest_in_a_cpu_tee_prints_the_gpu_part_and_keeps_exit_0(tmp_path, monkeypatch, capsys):
    # The CPU part from a genuine saved SNP report (as if the hardware returned it); the
    # GPU part from the fake NVML: in CC mode, then with CC off (still exit 0: the CPU
    # part decides the status).
    snp = Path(__file__).parent / "fixtures" / "attestation"
    cpu = ("snp", (snp / "virtee_milan_report.bin").read_bytes(), (snp / "virtee_milan_vcek.der").read_bytes(), "test")
    monkeypatch.setattr(provider_mod.SnpProvider, "read", lambda self, data: cpu)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    assert main(["attest", "--report-data", NONCE.hex()]) == 0
    out = capsys.readouterr().out
    assert "tee            SEV-SNP" in out and "gpu            NVML, GPU 0 (NVIDIA H100 80GB HBM3): CC mode on" in out
    assert "gpu vbios      96.00.9f.00.01" in out and "not attested by this version" not in out
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(cc_feature=0))
    assert main(["attest"]) == 0
    out = capsys.readouterr().out
    assert "gpu            none: no GPU evidence:" in out and "mode off" in out
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert main(["attest"]) == 0
    assert "pynvml is not installed" in capsys.readouterr().out


def test_random_corruption_is_refused_typed_never_a_crash():
    import random

    rng = random.Random(41)
    for _ in range(800):
        b = bytearray(REPORT)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cut = rng.choice([len(b), len(b), rng.randrange(len(b) + 1)])
        if bytes(b[:cut]) == REPORT:
            continue                      # the random bytes were the ones already there
        try:
            _verify(bytes(b[:cut]))
        except AttestationError as e:
            assert e.claim.startswith("gpu."), e.claim
        else:
            # Only a change the signature does not cover can pass: none exists here.
            raise AssertionError("a corrupted report verified")


def test_cli_gpu_options_are_checked(tmp_path, capsys):
    blob = encode_gpu_evidence(REPORT, CHAIN, "on")
    for extra, words in ((("--report-data", "00"), "--nonce"), (("--nonce", "zz"), "hex"),
                         (("--nonce", "00" * 31), "32"),
                         (("--gpu-chain", str(FIX / "hopperCertChain.txt")), "carries its own chain")):
        ev, pol = tmp_path / "gpu.ev", tmp_path / "policy.toml"
        ev.write_bytes(blob)
        pol.write_text(POLICY)
        assert main(["attest", "verify", str(ev), "--policy", str(pol), *extra]) == 2
        assert words in capsys.readouterr().err
