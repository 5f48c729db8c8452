"""``--attestation-policy`` / ``--attestation-certs`` of ``ccddp launch`` and ``ccddp
train``: ccddp's leading launch options in any order, the files checked before anything
starts (one line, exit 2, no torch), and the ranks' environment they become.

The launch end to end: the ranks' hardware provider and AMD's pinned root cannot be
pointed at the test chain (ccddp.testing.snp_chain) without a test hook in the product,
so a group that *forms* under ``ccddp launch`` is not tested here (test_attest_group.py
forms attested groups with the test chain through ``Options(establishment=...)``). What
is tested is that the options reach the ranks and fail closed: on this machine, which is
not a confidential VM, every rank refuses to join instead of falling back to a group
secret.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccddp.cli import main
from ccddp.cli.cmd_launch import OwnOptions, own_options
from ccddp.crypto.attest.options import attestation_environment
from ccddp.errors import AttestationError, ConfigError
from test_cli import _probe

FIX = Path(__file__).parent / "fixtures" / "attestation"
POLICY = FIX / "policy_virtee.toml"          # an [snp] policy
TDX_POLICY = FIX / "tdx" / "policy_spr.toml"  # a [tdx] policy
CERTS = FIX / "amd"
ENV_POLICY, ENV_CERTS = "CCDDP_ATTESTATION_POLICY", "CCDDP_ATTESTATION_CERTS"


# -- the leading options -------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--trust-domains", "node", "--attestation-policy", "p.toml", "--attestation-certs", "c", "x.py", "-a"],
    ["--attestation-certs=c", "--attestation-policy=p.toml", "--trust-domains=node", "x.py", "-a"],
    ["--attestation-policy", "p.toml", "--trust-domains", "node", "--attestation-certs=c", "x.py", "-a"],
])
def test_launch_takes_its_own_options_in_any_order(argv):
    own, rest = own_options(argv)
    assert own == OwnOptions(trust_domains="node", attestation_policy="p.toml", attestation_certs="c")
    assert rest == ["x.py", "-a"]


def test_own_options_end_at_the_first_torchrun_argument():
    own, rest = own_options(["--attestation-policy", "p.toml", "--nproc-per-node", "2", "x.py",
                             "--attestation-certs", "c"])
    assert own == OwnOptions(attestation_policy="p.toml")
    assert rest == ["--nproc-per-node", "2", "x.py", "--attestation-certs", "c"]   # the script's
    # An abbreviation is not ours: torchrun's parser gets it (and refuses it).
    assert own_options(["--attestation-pol", "p.toml", "x.py"])[0] == OwnOptions()


@pytest.mark.parametrize("argv, match", [
    (["--attestation-policy"], "--attestation-policy needs a value"),
    (["--attestation-certs=", "x.py"], "--attestation-certs needs a path"),
    (["--attestation-policy", "a", "--attestation-policy", "b", "x.py"], "given twice"),
    (["--trust-domains", "node", "--trust-domains=rank", "x.py"], "given twice"),
])
def test_own_option_mistakes_are_refused(argv, match):
    with pytest.raises(ConfigError, match=match):
        own_options(argv)


# -- the checks ----------------------------------------------------------------------------

def test_checked_options_become_the_ranks_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink(POLICY, tmp_path / "p.toml")
    env = attestation_environment("p.toml", str(CERTS), environ={})
    # Absolute: a rank started elsewhere reads the same files.
    assert env == {ENV_POLICY: str((tmp_path / "p.toml").resolve()), ENV_CERTS: str(CERTS.resolve())}
    assert attestation_environment(None, None, environ={ENV_CERTS: "/nowhere"}) == {}
    # The certificates may come from the caller's environment; that directory is checked.
    assert attestation_environment(str(POLICY), None, environ={ENV_CERTS: str(CERTS)})[ENV_CERTS] == str(CERTS.resolve())
    with pytest.raises(ConfigError, match="no such directory"):
        attestation_environment(str(POLICY), None, environ={ENV_CERTS: str(tmp_path / "gone")})
    # A TDX-only policy needs no AMD certificates.
    assert attestation_environment(str(TDX_POLICY), None, environ={}) == {ENV_POLICY: str(TDX_POLICY.resolve())}


def test_policy_and_certificate_mistakes_are_typed_and_name_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(POLICY.read_text().replace("[snp]", "[snp]\nallow_debgu = false"))
    with pytest.raises(AttestationError) as ei:
        attestation_environment(str(bad), str(CERTS), environ={})
    assert "allow_debgu" in str(ei.value)
    with pytest.raises(AttestationError) as ei:
        attestation_environment(str(tmp_path / "none.toml"), str(CERTS), environ={})
    assert ei.value.claim == "policy_file.file"
    with pytest.raises(ConfigError, match="AMD's ASK/ARK"):
        attestation_environment(str(POLICY), None, environ={})
    with pytest.raises(ConfigError, match="no such directory"):
        attestation_environment(str(POLICY), str(tmp_path / "certs"), environ={})
    with pytest.raises(ConfigError, match="needs --attestation-policy"):
        attestation_environment(None, str(CERTS), environ={})
    # A certificate file the ranks could not read is refused here already.
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ark.pem").write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    with pytest.raises(AttestationError):
        attestation_environment(str(POLICY), str(tmp_path / "certs"), environ={})


@pytest.mark.parametrize("command", [
    ["launch", "--trust-domains", "node", "--attestation-policy", "{bad}", "--attestation-certs", "{certs}",
     "--nproc-per-node", "2", "x.py"],
    ["launch", "--attestation-policy", "{policy}", "--attestation-certs", "{missing}", "x.py"],
    ["train", "--workload", "graphsage", "--attestation-policy", "{bad}", "--attestation-certs", "{certs}"],
    ["train", "--workload", "graphsage", "--attestation-policy", "{policy}", "--attestation-certs", "{missing}"],
])
@pytest.mark.multiprocess   # a fresh interpreter (_probe), which the automatic marking cannot see
def test_a_wrong_policy_or_certs_dir_is_one_line_exit_2_before_torch(tmp_path, command):
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "ccddp-attestation-policy/1"\n[snp]\nmeasurements = ["00"]\n')
    names = {"bad": str(bad), "certs": str(CERTS), "policy": str(POLICY), "missing": str(tmp_path / "none")}
    last, out = _probe([a.format(**names) for a in command])
    assert last.split()[:2] == ["NO-TORCH", "2"], out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("ccddp: error:")]
    assert len(errors) == 1, out[-3000:]
    assert ("measurements" in errors[0]) if "{bad}" in command else ("no such directory" in errors[0]), errors


@pytest.mark.unit   # main(["train", ...]) starts nothing here: its torchrun is intercepted
def test_train_hands_the_checked_files_to_the_ranks(tmp_path, monkeypatch):
    """``ccddp train``'s ranks get the two variables (the torchrun call is intercepted
    after every check passed)."""
    import ccddp.bench.launch as launch
    import ccddp.cli.cmd_train as cmd_train

    seen = {}

    class Started(Exception):
        pass

    def fake_torchrun(module, args, nproc, **kw):
        seen.update(kw["env"])
        raise Started

    monkeypatch.setattr(launch, "torchrun", fake_torchrun)
    monkeypatch.setattr(cmd_train, "check_request", lambda args: None)    # the model's memory: not this test
    monkeypatch.delenv(ENV_POLICY, raising=False)
    with pytest.raises(Started):
        main(["train", "--workload", "graphsage", "--size", "tiny", "--steps", "1", "--attestation-policy", str(POLICY),
              "--attestation-certs", str(CERTS)])
    assert seen[ENV_POLICY] == str(POLICY.resolve()) and seen[ENV_CERTS] == str(CERTS.resolve())


def test_multi_node_train_with_attestation_needs_no_group_secret(monkeypatch):
    from ccddp.cli import build_parser
    from ccddp.cli.cmd_train import check_arguments

    for v in ("CCDDP_GROUP_SECRET", "CCDDP_GROUP_SECRET_FILE"):
        monkeypatch.delenv(v, raising=False)
    argv = ["train", "--workload", "graphsage", "--cc", "on", "--nnodes", "2", "--master-addr", "10.0.0.1",
            "--master-port", "29500"]
    with pytest.raises(ConfigError, match="group secret"):
        check_arguments(build_parser(argv).parse_args(argv))
    argv += ["--attestation-policy", str(POLICY), "--attestation-certs", str(CERTS)]
    check_arguments(build_parser(argv).parse_args(argv))


# -- through ccddp launch, on ranks ------------------------------------------------------------

def test_launch_with_a_policy_fails_closed_on_a_machine_without_evidence(tmp_path):
    """Every rank reads the policy and refuses to join without its own evidence (this CI
    machine is no confidential VM): nothing trains under a group secret instead."""
    import ccddp.crypto.attest.provider as provider

    if Path(provider.TSM_ROOT).is_dir() or Path(provider.SEV_GUEST).exists():
        pytest.skip("this machine has an attestation interface")
    from dist_util import child_env

    env = child_env(dict(OMP_NUM_THREADS="1"))
    for v in ("CCDDP_GROUP_SECRET", "CCDDP_GROUP_SECRET_FILE", "CCDDP_IDENTITY", ENV_POLICY, ENV_CERTS):
        env.pop(v, None)
    example = str(Path(__file__).parents[1] / "examples" / "ddp_tutorial.py")
    p = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--attestation-policy", str(POLICY),
                        "--attestation-certs", str(CERTS), "--nproc-per-node", "2", example, "--steps", "1"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:]
    assert "not a confidential VM" in p.stderr, p.stderr[-3000:]
    assert "params checksum" not in p.stdout
    # torchrun's report of the failed ranks, without the launcher's own Python stack.
    assert "Root Cause (first observed failure)" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]


def test_the_environment_never_selects_the_test_chain(tmp_path):
    """What the options set up on a rank (``KeyEstablishment.from_env``) reads the hardware
    and pins AMD's roots (a test chain's root would be refused): the test chain in
    ccddp.testing is not even imported."""
    code = f"""
import os, sys
os.environ.update({{"{ENV_POLICY}": {str(POLICY)!r}, "{ENV_CERTS}": {str(CERTS)!r}}})
from ccddp.crypto.establish import KeyEstablishment
from ccddp.crypto.attest.provider import SnpProvider
v = KeyEstablishment.from_env().verifier
# AMD's staged roots were accepted: only AMD's pinned keys let them in.
print(type(v.provider) is SnpProvider, sorted(v.trust.chains) == ["Genoa", "Milan"],
      any(m.startswith("ccddp.testing") for m in sys.modules))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCDDP_")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.stdout.split() == ["True", "True", "False"], p.stdout + p.stderr[-2000:]
