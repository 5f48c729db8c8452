"""SEV-SNP attestation inside key establishment: each rank's evidence binds to its own
handshake message, so a group forms only from evidence made for this run.

Genuine reports cannot be made for a fresh binding, so the ranks here sign SNP-format
reports with a TEST chain (tests/_snp_test_chain.py) that the verifier is told to trust
through ``TrustStore(..., pins=chain.pins)``; the verifier code is the one the genuine
fixtures pass (test_attest_snp.py).
"""

from __future__ import annotations

import threading

import pytest

from _snp_test_chain import MEASUREMENT, TestChain, TestProvider
from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
from ccddp.crypto.attest.evidence import decode_evidence
from ccddp.crypto.attest.provider import NoEvidenceError
from ccddp.crypto.attest.snp import POLICY_DEBUG, parse_report
from ccddp.crypto.establish import Allowlist, EstablishmentError, Identity, KeyEstablishment, parse_message
from ccddp.errors import AttestationError, ConfigError
from thread_ranks import run_thread_ranks as run_ranks
from test_establish import establish

POLICY_TEXT = f'''format = "ccddp-attestation-policy/1"
[snp]
measurements = ["{MEASUREMENT.hex()}"]
min_tcb = {{ bootloader = 3, snp = 8, microcode = 115 }}
'''


@pytest.fixture(scope="module")
def chain() -> TestChain:
    return TestChain()


def _trust(chain: TestChain) -> TrustStore:
    return TrustStore([chain.ask, chain.ark], pins=chain.pins)


def _verifier(chain, provider=None, policy=POLICY_TEXT) -> TeeVerifier:
    return TeeVerifier(AttestationPolicy.from_toml(policy), _trust(chain), provider=provider or TestProvider(chain))


def _ids(n):
    return [Identity.generate(f"rank{i}") for i in range(n)]


def _assert_refused_everywhere(results, claim, rank):
    for r, res in enumerate(results):
        assert isinstance(res, AttestationError), f"rank {r}: {res!r}"
        assert res.claim == claim, (r, res.claim, str(res))
        assert f"rank {rank}" in str(res), (r, str(res))


@pytest.mark.parametrize("n", [2, 4])
def test_attested_group_forms_and_every_report_binds_its_own_message(chain, n):
    verifiers = [_verifier(chain) for _ in range(n)]
    results, board = establish(_ids(n), None, verifiers=verifiers)
    assert all(not isinstance(r, Exception) for r in results), results
    assert len({r.session_id for r in results}) == 1
    assert all(p.startswith("snp:" + MEASUREMENT.hex()[:12]) for p in results[0].peers)
    for j, blob in enumerate(board.rounds[0].values()):
        m = parse_message(blob)
        report, vcek = decode_evidence(m.evidence)
        assert parse_report(report).report_data == m.binding.ljust(64, b"\0")
        assert vcek == chain.vcek_der


class _Relay:
    """Rank 1's provider in a relay attack: it waits for rank 0's report of this very run
    and presents it as its own (a compromised rank without a TEE of its own)."""

    def __init__(self, victim: TestProvider) -> None:
        self.victim = victim

    def read(self, report_data):
        return ("snp", *self.report(report_data))

    def report(self, report_data):
        for _ in range(200):
            if self.victim.issued:
                return self.victim.issued[0], self.victim.chain.vcek_der, "relay"
            threading.Event().wait(0.05)
        raise AssertionError("rank 0 issued no report")


def test_another_ranks_evidence_of_this_run_is_refused_on_every_rank(chain):
    p0 = TestProvider(chain)
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain, p0), _verifier(chain, _Relay(p0))])
    _assert_refused_everywhere(results, "report_data", 1)


def test_evidence_of_an_earlier_run_is_refused_on_every_rank(chain):
    first = TestProvider(chain)
    ok, _ = establish(_ids(2), None, verifiers=[_verifier(chain), _verifier(chain, first)])
    assert not any(isinstance(r, Exception) for r in ok)
    replay = TestProvider(chain, replay=(first.issued[0], chain.vcek_der))
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain), _verifier(chain, replay)])
    _assert_refused_everywhere(results, "report_data", 1)


@pytest.mark.parametrize("kw, claim", [
    ({"measurement": bytes(48)}, "measurement"),
    ({"policy": 0x30000 | POLICY_DEBUG}, "policy.debug"),
    ({"vmpl": 1}, "vmpl"),
])
def test_a_policy_miss_is_refused_on_every_rank(chain, kw, claim):
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain), _verifier(chain, TestProvider(chain, **kw))])
    _assert_refused_everywhere(results, claim, 1)


def test_a_chain_the_verifier_does_not_trust_is_refused(chain):
    other = TestChain()   # same names, another ARK: not pinned by the verifiers
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain), _verifier(chain, TestProvider(other))])
    _assert_refused_everywhere(results, "certs.vcek", 1)


def test_a_peer_without_evidence_is_refused(chain):
    ids = _ids(2)
    allow = Allowlist({i.name: i.public_bytes for i in ids})
    results, _ = establish(ids, None, verifiers=[_verifier(chain), allow])
    # Rank 0 refuses rank 1's empty evidence; rank 1 (allowlist only) hears why.
    assert isinstance(results[0], AttestationError) and results[0].claim == "evidence.format"
    assert isinstance(results[1], EstablishmentError) and "evidence" in str(results[1])


def test_attestation_is_selected_from_the_environment(tmp_path, monkeypatch, chain):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TEXT)
    monkeypatch.delenv("CCDDP_IDENTITY", raising=False)
    monkeypatch.delenv("CCDDP_ALLOWLIST", raising=False)
    monkeypatch.setenv("CCDDP_ATTESTATION_POLICY", str(policy))
    monkeypatch.delenv("CCDDP_ATTESTATION_CERTS", raising=False)
    with pytest.raises(ConfigError, match="CCDDP_ATTESTATION_CERTS"):
        KeyEstablishment.from_env()
    monkeypatch.setenv("CCDDP_ATTESTATION_CERTS", str(__import__("pathlib").Path(__file__).parent
                                                      / "fixtures" / "attestation" / "amd"))
    est = KeyEstablishment.from_env()
    assert isinstance(est.verifier, TeeVerifier) and est.verifier.allowlist is None
    assert est.verifier.trust is not None and sorted(est.verifier.trust.chains) == ["Genoa", "Milan"]
    # The hardware provider: on a machine that is not a TEE the rank cannot take part,
    # and says why, rather than sending evidence it made up.
    import ccddp.crypto.attest.provider as provider

    monkeypatch.setattr(provider, "TSM_ROOT", str(tmp_path / "no-tsm"))
    monkeypatch.setattr(provider, "SEV_GUEST", str(tmp_path / "no-sev-guest"))
    est = KeyEstablishment.from_env()
    with pytest.raises(NoEvidenceError, match="not a confidential VM"):
        est.message(0, 1, b"", bytes(32), bytes(16))


def test_revoked_ask_is_refused_and_a_stale_or_foreign_crl_too(chain, tmp_path):
    from ccddp.crypto.attest import verify_snp

    rd = bytes(range(64))
    report = chain.report(rd)
    pol = AttestationPolicy.from_toml(POLICY_TEXT).snp

    def check(crls, at=None):
        trust = TrustStore([chain.ask, chain.ark], pins=chain.pins, crls=crls)
        return verify_snp(report, trust, pol, expected_report_data=rd, vcek=chain.vcek, at=at)

    assert "certs.crl" in [v.claim for v in check([chain.crl([])])]
    with pytest.raises(AttestationError) as ei:
        check([chain.crl([chain.ask])])
    assert ei.value.claim == "certs.crl" and "revoked" in str(ei.value)
    import datetime as dt

    with pytest.raises(AttestationError) as ei:
        check([chain.crl([])], at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=8))
    assert ei.value.claim == "certs.crl" and "expired" in str(ei.value)
    with pytest.raises(AttestationError) as ei:
        check([TestChain().crl([])])      # same issuer name, another ARK's signature
    assert ei.value.claim == "certs.crl"
    # From a directory, as staged: the cert_chain PEM and the CRL file.
    (tmp_path / "cert_chain.pem").write_bytes(chain.pem())
    from cryptography.hazmat.primitives import serialization

    (tmp_path / "Milan.crl").write_bytes(chain.crl([chain.ask]).public_bytes(serialization.Encoding.DER))
    with pytest.raises(AttestationError) as ei:
        verify_snp(report, TrustStore.from_dir(tmp_path, pins=chain.pins), pol, expected_report_data=rd,
                   vcek=chain.vcek)
    assert ei.value.claim == "certs.crl"


# -- TDX, and groups that mix TEEs -------------------------------------------------------

def _tdx_verifier(tchain, policy_text, snp_chain=None, provider=None):
    from _tdx_test_chain import TdxTestProvider

    trust = _trust(snp_chain) if snp_chain is not None else None
    return TeeVerifier(AttestationPolicy.from_toml(policy_text), trust, provider=provider or TdxTestProvider(tchain),
                       tdx_root_pin=tchain.pin)


TDX_POLICY = f'''format = "ccddp-attestation-policy/1"
[tdx]
mrtds = ["{__import__("_tdx_test_chain").MRTD.hex()}"]
rtmr0 = "any"
rtmr1 = "any"
rtmr2 = "any"
min_tee_tcb_svn = "any"
'''


@pytest.fixture(scope="module")
def tchain():
    from _tdx_test_chain import TdxTestChain

    return TdxTestChain()


def test_tdx_group_forms_and_a_tdx_policy_miss_is_refused(tchain):
    from _tdx_test_chain import TdxTestProvider

    results, board = establish(_ids(2), None, verifiers=[_tdx_verifier(tchain, TDX_POLICY) for _ in range(2)])
    assert not any(isinstance(r, Exception) for r in results), results
    assert all(p.startswith("tdx:") for p in results[0].peers)
    debug = _tdx_verifier(tchain, TDX_POLICY, provider=TdxTestProvider(tchain, td_attributes=1))
    results, _ = establish(_ids(2), None, verifiers=[_tdx_verifier(tchain, TDX_POLICY), debug])
    _assert_refused_everywhere(results, "policy.debug", 1)


def test_mixed_snp_and_tdx_group_under_one_policy(chain, tchain):
    both = POLICY_TEXT + TDX_POLICY.split("\n", 1)[1]
    v_snp = _tdx_verifier(tchain, both, snp_chain=chain, provider=TestProvider(chain))
    v_tdx = _tdx_verifier(tchain, both, snp_chain=chain)
    results, _ = establish(_ids(2), None, verifiers=[v_snp, v_tdx])
    assert not any(isinstance(r, Exception) for r in results), results
    assert results[0].peers[0].startswith("snp:") and results[0].peers[1].startswith("tdx:")
    # A policy with no [tdx] table refuses the TDX peer, whatever its quote says.
    results, _ = establish(_ids(2), None, verifiers=[_verifier(chain), _tdx_verifier(tchain, both, snp_chain=chain)])
    assert isinstance(results[0], AttestationError) and results[0].claim == "evidence.tee", results[0]


# -- on real ranks ------------------------------------------------------------------------

def _attested_rank(rank, n, exported, policy_text):
    """Every rank: an attested SecureGroup and an all-reduce; then rank 1 replays rank 0's
    evidence of that group, then presents a measurement the policy does not list."""
    import torch
    import torch.distributed as dist

    from _snp_test_chain import TestChain, TestProvider
    from ccddp.bench.reference import all_reduce
    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
    from ccddp.crypto.establish import Identity, KeyEstablishment

    chain = TestChain.load(exported)
    policy = AttestationPolicy.from_toml(policy_text)
    trust = TrustStore([chain.ask, chain.ark], pins=chain.pins)
    s = CommSettings(segment_bytes=1024, timeout_s=15)

    def group(provider):
        est = KeyEstablishment(Identity.generate(f"rank{rank}"), TeeVerifier(policy, trust, provider=provider))
        return SecureGroup(s, establishment=est, transport=Transport.open(None, s.timeout_s))

    def attempt(provider):
        try:
            group(provider)
            return "accepted"
        except Exception as e:  # noqa: BLE001 - the test asserts on type and claim
            return (type(e).__name__, getattr(e, "claim", None), str(e))

    out = {}
    mine = TestProvider(chain)
    g = group(mine)
    x = torch.arange(3000, dtype=torch.float32) + rank
    all_reduce(x, g)
    out["sum_ok"] = torch.equal(x, torch.arange(3000, dtype=torch.float32) * n + n * (n - 1) / 2)
    out["peers"] = g.keys.peers
    # The test harness (not the product) hands rank 0's evidence to rank 1.
    issued = [None] * n
    dist.all_gather_object(issued, mine.issued[0])
    out["replay"] = attempt(TestProvider(chain, replay=(issued[0], chain.vcek_der)) if rank == 1 else mine)
    out["policy_miss"] = attempt(TestProvider(chain, measurement=bytes(48)) if rank == 1 else mine)
    g2 = group(mine)   # the process group still works after the refusals
    z = torch.ones(100)
    out["after_ok"] = torch.equal(all_reduce(z, g2), torch.full((100,), float(n)))
    return out


def test_attested_group_on_real_ranks(chain):
    res = run_ranks(_attested_rank, 2, chain.export(), POLICY_TEXT, timeout=180)
    for r, out in enumerate(res):
        assert out["sum_ok"] and out["after_ok"], (r, out)
        assert len(out["peers"]) == 2 and all(p.startswith("snp:") for p in out["peers"])
        for case, claim in (("replay", "report_data"), ("policy_miss", "measurement")):
            kind, got, text = out[case]
            assert (kind, got) == ("AttestationError", claim), (r, case, out[case])
            assert "rank 1" in text


def _ddp_rank(rank, n, exported, policy_text):
    """DDP on a ccddp group with attestation (the test chain), and on one keyed by a
    pre-shared secret: the same model, data and steps must give the same parameters."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from _snp_test_chain import TestChain, TestProvider
    from ccddp.backend import Options
    from ccddp.comm import CommSettings
    from ccddp.crypto import GroupSecret
    from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
    from ccddp.crypto.establish import Identity, KeyEstablishment

    chain = TestChain.load(exported)
    verifier = TeeVerifier(AttestationPolicy.from_toml(policy_text), TrustStore([chain.ask, chain.ark], pins=chain.pins),
                           provider=TestProvider(chain))
    settings = CommSettings(timeout_s=30)
    attested = Options(settings=settings, establishment=KeyEstablishment(Identity.generate(f"rank{rank}"), verifier))
    keyed = Options(settings=settings, secret=GroupSecret(bytes(range(32))))

    def train(options):
        pg = dist.new_group(backend="ccddp", timeout=timedelta(seconds=30), pg_options=options)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        init = torch.Generator().manual_seed(0)        # the rank's own generator: ranks may be threads
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=init) * 0.1)
        ddp = DDP(model, process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(3):
            opt.zero_grad()
            x = torch.randn(16, 32, generator=g)
            ddp(x).square().mean().backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]), pg

    with_att, pg = train(attested)
    peers = pg.endpoint.keys.peers
    without, _ = train(keyed)
    return {"equal": bool(torch.equal(with_att, without)), "peers": peers, "norm": float(with_att.norm())}


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_with_attestation_trains_like_without(chain, n):
    res = run_ranks(_ddp_rank, n, chain.export(), POLICY_TEXT, timeout=300)
    for r, out in enumerate(res):
        assert out["equal"], (r, out)
        assert len(out["peers"]) == n and all(p.startswith("snp:") for p in out["peers"]), out
    assert len({out["norm"] for out in res}) == 1     # every rank holds the same model
