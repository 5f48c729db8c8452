"""``ccddp attest``: this machine's evidence (here: one line saying there is none) and
``ccddp attest verify`` on the genuine fixtures, tampered copies and expired chains."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

import pytest

import ccddp.crypto.attest.provider as provider
from ccddp.cli import main
from ccddp.crypto.attest.evidence import decode_evidence, encode_evidence
from ccddp.crypto.attest.provider import NoEvidenceError, SnpProvider, parse_cert_table
from ccddp.errors import AttestationError
from test_cli import _probe

FIX = Path(__file__).parent / "fixtures" / "attestation"


def test_attest_says_in_one_line_that_this_machine_is_not_a_tee(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(provider, "TSM_ROOT", str(tmp_path / "tsm" / "report"))
    monkeypatch.setattr(provider, "SEV_GUEST", str(tmp_path / "sev-guest"))
    monkeypatch.setattr(provider, "NVIDIA_PROC", str(tmp_path / "no-nvidia-driver"))  # no GPU line either
    assert main(["attest"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "configfs-tsm" in lines[0] and "sev-guest" in lines[0], err
    with pytest.raises(NoEvidenceError):
        SnpProvider().report(bytes(64))


def test_attest_on_this_machine_exits_nonzero_without_torch():
    # The real paths: this CI machine is not a confidential VM.
    if Path(provider.TSM_ROOT).is_dir() or Path(provider.SEV_GUEST).exists():
        pytest.skip("this machine has an attestation interface")
    last, out = _probe(["attest"])
    assert last.split()[:2] == ["NO-TORCH", "1"], out[-2000:]
    assert "not a confidential VM" in out


def test_configfs_tsm_without_the_kernel_behind_it_is_one_line(tmp_path):
    # A directory where configfs-tsm would be, but no kernel filling in the entry.
    root = tmp_path / "report"
    root.mkdir()
    with pytest.raises(NoEvidenceError) as ei:
        SnpProvider(tsm_root=str(root), sev_guest=str(tmp_path / "none")).report(bytes(64))
    assert "configfs-tsm" in str(ei.value) and "provider" in str(ei.value) and "\n" not in str(ei.value)


def _cert_table(entries: list[tuple[str, bytes]]) -> bytes:
    head = 24 * (len(entries) + 1)
    table, body = b"", b""
    for guid, blob in entries:
        table += uuid.UUID(guid).bytes_le + struct.pack("<II", head + len(body), len(blob))
        body += blob
    return table + bytes(24) + body


def test_the_vcek_is_found_in_the_hosts_certificate_table():
    vcek = (FIX / "gosev_milan_vcek.der").read_bytes()
    ask = b"ASK" * 100
    aux = _cert_table([("4ab7b379-bbac-4fe4-a02f-05aef327c782", ask), ("63da758d-e664-4564-adc5-f4b93be8accd", vcek)])
    assert parse_cert_table(aux) == vcek
    assert parse_cert_table(_cert_table([("4ab7b379-bbac-4fe4-a02f-05aef327c782", ask)])) is None
    bad = bytearray(aux)
    struct.pack_into("<I", bad, 24 + 20, 1 << 20)    # the VCEK's length points outside the table
    with pytest.raises(AttestationError) as ei:
        parse_cert_table(bytes(bad))
    assert ei.value.claim == "evidence.certs"


def _verify(tmp_path, capsys, evidence: bytes, *extra: str, policy: str = "policy_virtee.toml"):
    ev = tmp_path / "evidence.snp"
    ev.write_bytes(evidence)
    rc = main(["attest", "verify", str(ev), "--policy", str(FIX / policy), "--certs", str(FIX / "amd"), *extra])
    return rc, capsys.readouterr().out


def test_verify_prints_every_claim_of_a_genuine_report(tmp_path, capsys):
    report = (FIX / "virtee_milan_report.bin").read_bytes()
    evidence = encode_evidence(report, (FIX / "virtee_milan_vcek.der").read_bytes())
    rc, out = _verify(tmp_path, capsys, evidence, "--report-data", report[0x50:0x90].hex())
    assert rc == 0, out
    for claim in ("report.signature", "certs.chain", "vcek.match", "report_data", "policy.debug", "measurement"):
        assert f"ok    {claim}" in out
    assert "FAIL" not in out and out.strip().endswith("claims hold")


@pytest.mark.parametrize("change, claim, extra", [
    (lambda b: b[:0x95] + bytes([b[0x95] ^ 1]) + b[0x96:], "report.signature", ()),
    (lambda b: b, "certs.validity", ("--at", "2031-01-01T00:00")),
    (lambda b: b, "report_data", ("--report-data", "00" * 64)),
    (lambda b: b[:-1], "evidence.format", ()),
])
def test_verify_names_the_refused_claim(tmp_path, capsys, change, claim, extra):
    report, vcek = decode_evidence(encode_evidence((FIX / "virtee_milan_report.bin").read_bytes(),
                                                   (FIX / "virtee_milan_vcek.der").read_bytes()))
    blob = encode_evidence(change(report), vcek) if claim != "evidence.format" else change(report)
    rc, out = _verify(tmp_path, capsys, blob, *extra)
    assert rc == 2, out
    assert f"FAIL  {claim}" in out and f"refused: claim '{claim}' failed" in out


def test_verify_of_a_debug_vm_against_a_strict_policy(tmp_path, capsys):
    strict = tmp_path / "strict.toml"
    strict.write_text((FIX / "policy_gosev.toml").read_text().replace("allow_debug = true", "allow_debug = false"))
    report = (FIX / "gosev_milan_report.bin").read_bytes()
    ev = tmp_path / "e.snp"
    ev.write_bytes(encode_evidence(report, (FIX / "gosev_milan_vcek.der").read_bytes()))
    assert main(["attest", "verify", str(ev), "--policy", str(strict), "--certs", str(FIX / "amd")]) == 2
    assert "FAIL  policy.debug" in capsys.readouterr().out


def test_verify_a_genuine_tdx_quote_with_crls(tmp_path, capsys):
    tdx = FIX / "tdx"
    raw = (tdx / "spr_e4_quote.dat").read_bytes()
    ev = tmp_path / "q.dat"
    ev.write_bytes(raw[:raw.index(b"\nextra")])
    crls = tmp_path / "crls"
    crls.mkdir()
    (crls / "pck.crl").write_bytes((tdx / "pckcrl_platform.der").read_bytes())
    argv = ["attest", "verify", str(ev), "--policy", str(tdx / "policy_spr.toml"), "--certs", str(crls)]
    assert main(argv + ["--at", "2023-06-20T00:00"]) == 0
    out = capsys.readouterr().out
    assert "ok    certs.crl" in out and "ok    quote.signature" in out and "ok    mrtd" in out
    assert main(argv) == 2     # today the sample CRL is long past its next update
    assert "FAIL  certs.crl" in capsys.readouterr().out
    assert main(["attest", "verify", str(ev), "--policy", str(FIX / "policy_virtee.toml")]) == 2
    assert "FAIL  policy_file.tdx" in capsys.readouterr().out
