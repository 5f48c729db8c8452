"""``ccddp launch`` with the attestation policy given only by the environment
(``CCDDP_ATTESTATION_POLICY``, no ``--attestation-policy``): checked before torchrun
starts, the same way as the option (a wrong policy, or a ``[gpu]``-only one that no rank
could pass, is one line and exit 2), and a good one reaches the ranks as an absolute path.

torchrun is intercepted (``supervised``), so nothing starts here."""

from __future__ import annotations

from pathlib import Path

import pytest

import ccddp.bench.launch as launch
from ccddp.cli import main

FIX = Path(__file__).parent / "fixtures" / "attestation"
TDX_POLICY = FIX / "tdx" / "policy_spr.toml"
GPU_ONLY = '''format = "ccddp-attestation-policy/1"
[gpu]
driver_versions = ["550.90.07"]
vbios_versions = ["96.00.9f.00.01"]
'''


class _Started(Exception):
    pass


@pytest.fixture
def launched(monkeypatch, tmp_path):
    seen: dict = {}

    def fake_supervised(cmd, env):
        seen.update(env)
        raise _Started

    monkeypatch.setattr(launch, "supervised", fake_supervised)
    for v in ("CCDDP_ATTESTATION_POLICY", "CCDDP_ATTESTATION_CERTS", "CCDDP_GROUP_SECRET", "CCDDP_GROUP_SECRET_FILE",
              "CCDDP_IDENTITY"):
        monkeypatch.delenv(v, raising=False)
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    monkeypatch.chdir(tmp_path)
    return seen, script


@pytest.mark.parametrize("text, words", [
    ('format = "ccddp-attestation-policy/1"\n[snp]\nmeasurements = ["00"]\n', "measurements"),
    ('format = "ccddp-attestation-policy/1"\n[snp]\nallow_debgu = false\n', "allow_debgu"),
    (GPU_ONLY, "policy_file.tee"),
])
def test_a_policy_from_the_environment_is_checked_before_torchrun(launched, monkeypatch, capsys, text, words):
    seen, script = launched
    bad = script.parent / "policy.toml"
    bad.write_text(text)
    monkeypatch.setenv("CCDDP_ATTESTATION_POLICY", str(bad))
    assert main(["launch", "--nproc-per-node", "2", str(script)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ccddp: error:")]
    assert len(lines) == 1 and words in lines[0], err
    assert not seen                                   # torchrun was never reached


def test_a_missing_policy_file_from_the_environment_is_one_line(launched, monkeypatch, capsys):
    seen, script = launched
    monkeypatch.setenv("CCDDP_ATTESTATION_POLICY", str(script.parent / "nowhere.toml"))
    assert main(["launch", str(script)]) == 2
    assert "policy_file.file" in capsys.readouterr().err and not seen


def test_a_good_policy_from_the_environment_reaches_the_ranks_resolved(launched, monkeypatch):
    seen, script = launched
    rel = Path("p.toml")
    (script.parent / rel).write_text(TDX_POLICY.read_text())
    monkeypatch.setenv("CCDDP_ATTESTATION_POLICY", str(rel))
    with pytest.raises(_Started):
        main(["launch", "--nproc-per-node", "2", str(script)])
    assert seen["CCDDP_ATTESTATION_POLICY"] == str((script.parent / rel).resolve())
    # Attested establishment agrees on the keys: no group secret is handed over.
    assert "CCDDP_GROUP_SECRET_FILE" not in seen


def test_the_option_still_wins_over_the_environment(launched, monkeypatch):
    seen, script = launched
    bad = script.parent / "bad.toml"
    bad.write_text("not toml [")
    monkeypatch.setenv("CCDDP_ATTESTATION_POLICY", str(bad))
    with pytest.raises(_Started):
        main(["launch", "--attestation-policy", str(TDX_POLICY), str(script)])
    assert seen["CCDDP_ATTESTATION_POLICY"] == str(TDX_POLICY.resolve())
