"""Authenticated key establishment (X25519 signed with Ed25519, checked against an
allowlist) over an exchange the adversary controls.

Most cases run the protocol on threads with an in-memory exchange the test tampers
with; one multi-rank launch checks it inside SecureGroup on real gloo ranks, from the
environment variables a user would set, and through ``ccddp keygen``.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _security_util import spawn, values
from ccddp.cli import main as cli_main
from ccddp.crypto.establish import (Allowlist, EstablishmentError, Identity, KeyEstablishment, fingerprint,
                                    parse_message)
from ccddp.errors import ConfigError

CONTEXT = b"settings-fingerprint"


class Board:
    """An all-gather of bytes among threads; ``tamper(round, rank, view)`` plays the host."""

    def __init__(self, n: int, tamper=None) -> None:
        self.n, self.tamper = n, tamper
        self.barrier = threading.Barrier(n, timeout=20)
        self.rounds: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.seen: dict[int, list] = defaultdict(list)

    def exchange_for(self, rank: int):
        calls = [0]

        def exchange(blob: bytes) -> list[bytes]:
            r = calls[0]
            calls[0] += 1
            self.rounds[r][rank] = blob
            self.barrier.wait()
            view = [self.rounds[r][j] for j in range(self.n)]
            if self.tamper is not None:
                view = self.tamper(r, rank, view)
            self.seen[rank].append(view)
            return view

        return exchange


def establish(identities, allow, n=None, tamper=None, contexts=None, verifiers=None, ranks=None):
    """Run the protocol on ``n`` threads; returns per rank the keys or the exception.
    ``ranks``: the job's rank of each slot (a subgroup's global ranks)."""
    n = n or len(identities)
    board = Board(n, tamper)
    results: list = [None] * n

    def rank_main(r: int) -> None:
        try:
            est = KeyEstablishment(identities[r], (verifiers or [allow] * n)[r])
            results[r] = est.run(r, n, board.exchange_for(r), (contexts or [CONTEXT] * n)[r], ranks=ranks)
        except Exception as e:  # collected and asserted on below
            results[r] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "establishment hung"
    return results, board


@pytest.fixture(scope="module")
def ids():
    return [Identity.generate(f"rank{i}") for i in range(4)]


@pytest.fixture(scope="module")
def allow(ids):
    return Allowlist({i.name: i.public_bytes for i in ids})


def assert_all_fail(results, *needles):
    for r, res in enumerate(results):
        assert isinstance(res, EstablishmentError), f"rank {r} did not fail: {res!r}"
        assert "\n" not in str(res)
        assert any(n in str(res) for n in needles), f"rank {r}: {res}"


# -- the honest case ----------------------------------------------------------------------

def test_honest_ranks_agree_on_pairwise_keys(ids, allow):
    results, _ = establish(ids, allow)
    for res in results:
        assert not isinstance(res, Exception), res
    sessions = {res.session_id for res in results}
    assert len(sessions) == 1 and len(next(iter(sessions))) == 16
    assert len({res.group_secret.value for res in results}) == 1
    keys = set()
    for a in range(4):
        assert results[a].peers == ["rank0", "rank1", "rank2", "rank3"]
        for b in range(4):
            if a != b:
                k = results[a].link_key(a, b)
                assert k == results[b].link_key(a, b)          # both ends of a->b
                assert k != results[a].link_key(b, a)          # each direction its own key
                assert k != results[a].link_key(a, b, epoch=1)
                keys.add(k)
    assert len(keys) == 12
    with pytest.raises(ConfigError):
        results[0].link_key(1, 2)   # not an end of that link: holds no key


def test_every_run_gets_fresh_session_and_keys(ids, allow):
    first, _ = establish(ids[:2], allow)
    second, _ = establish(ids[:2], allow)
    assert first[0].session_id != second[0].session_id
    assert first[0].link_key(0, 1) != second[0].link_key(0, 1)
    assert first[0].group_secret.value != second[0].group_secret.value


# -- an untrusted exchange ------------------------------------------------------------------

def test_identity_not_on_allowlist_fails_every_rank(ids, allow):
    stranger = Identity.generate("stranger")
    results, _ = establish([ids[0], ids[1], stranger], allow)
    assert_all_fail(results, "not on the allowlist")
    assert all("rank 2" in str(r) for r in results)
    assert all(fingerprint(stranger.public_bytes) in str(r) for r in results)


def _swap_x25519(blob: bytes) -> bytes:
    # The X25519 key sits after magic(12), rank(4), world(4), context(32).
    fake = bytes(32 - 1) + b"\x09"
    return blob[:52] + fake + blob[84:]


def test_swapped_public_key_fails_every_rank(ids, allow):
    def mitm(rnd, rank, view):
        return [(_swap_x25519(b) if (rnd == 0 and j == 1) else b) for j, b in enumerate(view)]

    results, _ = establish(ids[:3], allow, tamper=mitm)
    assert_all_fail(results, "signature", "came back altered")
    # Rank 1 sees its own message altered; the others see a bad signature on it.
    assert "altered" in str(results[1])
    assert "swapped" in str(results[0]) and "rank 1" in str(results[0])


def test_resigned_by_the_attacker_fails_every_rank(ids, allow):
    attacker = Identity.generate("attacker")
    forged = KeyEstablishment(attacker, allow).message(1, 3, CONTEXT, bytes(31) + b"\x09", os.urandom(16))

    def mitm(rnd, rank, view):
        return [(forged if (rnd == 0 and j == 1 and rank != 1) else b) for j, b in enumerate(view)]

    results, _ = establish(ids[:3], allow, tamper=mitm)
    assert_all_fail(results, "not on the allowlist", "key establishment failed on rank")


def test_split_view_on_one_rank_fails_every_rank(ids, allow):
    def only_rank2(rnd, rank, view):
        if rnd == 0 and rank == 2:
            return [(_swap_x25519(b) if j == 0 else b) for j, b in enumerate(view)]
        return view

    results, _ = establish(ids[:3], allow, tamper=only_rank2)
    assert_all_fail(results, "signature", "rank 2 reports")
    assert "rank 2 reports" in str(results[0]) and "rank 2 reports" in str(results[1])


def test_replayed_old_message_is_caught_by_key_confirmation(ids, allow):
    """A genuine, validly signed message of an earlier run passes every signature and
    allowlist check, but its X25519 secret is gone: the transcripts differ and the
    key-confirmation round fails on every rank."""
    _, old_board = establish(ids[:3], allow)
    old = old_board.rounds[0][1]

    def replay(rnd, rank, view):
        if rnd == 0 and rank == 2:
            return [(old if j == 1 else b) for j, b in enumerate(view)]
        return view

    results, _ = establish(ids[:3], allow, tamper=replay)
    assert_all_fail(results, "derived different keys")


def test_messages_moved_between_slots_fail(ids, allow):
    def swap(rnd, rank, view):
        if rnd == 0:
            view = list(view)
            view[1], view[2] = view[2], view[1]
        return view

    results, _ = establish(ids[:3], allow, tamper=swap)
    assert_all_fail(results, "signed for rank", "came back altered")


@pytest.mark.parametrize("offset,needle", [(1 + 16 + 3, "derived different keys"),            # 0's tag for 1
                                           (1 + 3 * 16 + 48 + 5, "group secret")])            # 1's wrapped secret
def test_tampered_confirmation_or_group_secret_fails(ids, allow, offset, needle):
    def flip_round2(rnd, rank, view):
        if rnd == 1 and rank == 1:
            b = bytearray(view[0])
            b[offset] ^= 1
            return [bytes(b)] + list(view[1:])
        return view

    results, _ = establish(ids[:3], allow, tamper=flip_round2)
    assert isinstance(results[1], EstablishmentError) and needle in str(results[1]), results[1]
    # Only rank 1 can see it; its verdict stops the others too (no one is left waiting).
    assert_all_fail(results, needle)
    assert "as rank 1 reports" in str(results[0]) and "as rank 1 reports" in str(results[2])


def _fail_rank1_in_round2(rnd, rank, view):
    """Rank 0's key-confirmation tag for rank 1, altered on its way to rank 1 only: rank 1
    fails in round 2, every other rank verifies round 2."""
    if rnd == 1 and rank == 1:
        b = bytearray(view[0])
        b[1 + 16 + 3] ^= 1
        return [bytes(b)] + list(view[1:])
    return view


@pytest.mark.parametrize("forgery", ["plain ok", "old run's verdict", "round-2 reply", "no verdicts",
                                     "one verdict short"])
def test_a_forged_ok_verdict_of_a_failed_rank_stops_every_rank(ids, allow, forgery):
    """Rank 1 fails in round 2 and says so in its verdict; the host rewrites that verdict
    into an "ok" before ranks 0 and 2 see it: a plain b"ok", rank 1's "ok" of an earlier
    run, rank 1's own round-2 reply of this run (valid MACs under the same pair keys, of
    another round), or it drops verdicts. A rank goes on only on each peer's proof that it
    verified, so every rank still fails."""
    _, old_board = establish(ids[:3], allow)
    old_ok = old_board.rounds[2][1]
    round2_of_rank1 = {}

    def forge(rnd, rank, view):
        view = _fail_rank1_in_round2(rnd, rank, view)
        if rnd == 1 and rank != 1:
            round2_of_rank1[rank] = view[1]
        if rnd == 2 and rank != 1:
            assert view[1][:1] in (b"\x01", b"f")     # rank 1 did fail, and says so
            if forgery == "no verdicts":
                return []
            if forgery == "one verdict short":
                return view[:2]
            fake = {"plain ok": b"ok", "old run's verdict": old_ok, "round-2 reply": round2_of_rank1[rank]}[forgery]
            return [fake if j == 1 else b for j, b in enumerate(view)]
        return view

    results, _ = establish(ids[:3], allow, tamper=forge)
    assert_all_fail(results, "derived different keys", "does not authenticate", "verdicts for 3 ranks")
    assert "derived different keys" in str(results[1])
    for r in (0, 2):
        assert "rank 1" in str(results[r]) or "verdicts for" in str(results[r]), results[r]


def test_an_honest_verdict_does_not_verify_for_another_rank_or_run(ids, allow):
    """The verdict's MACs are per pair and per transcript: rank 2's "ok" put in rank 1's
    slot, or rank 1's "ok" of an earlier run, does not pass."""
    _, old_board = establish(ids[:3], allow)
    old_ok = old_board.rounds[2][1]
    for fake_of in (lambda view: view[2], lambda view: old_ok):
        def swap(rnd, rank, view, fake_of=fake_of):
            if rnd == 2 and rank == 0:
                return [fake_of(view) if j == 1 else b for j, b in enumerate(view)]
            return view

        results, _ = establish(ids[:3], allow, tamper=swap)
        assert isinstance(results[0], EstablishmentError), results[0]
        assert "rank 1's verdict does not authenticate" in str(results[0])
        assert not isinstance(results[1], Exception) and not isinstance(results[2], Exception)


def test_other_settings_fail_every_rank(ids, allow):
    results, _ = establish(ids[:3], allow, contexts=[CONTEXT, CONTEXT, b"other"])
    assert_all_fail(results, "other collective settings", "rank 2 reports", "rank 1 reports", "rank 0 reports")


def test_identity_bound_to_other_rank_fails(ids):
    bound = Allowlist({i.name: i.public_bytes for i in ids[:2]}, {"rank0": [0], "rank1": [0]})
    results, _ = establish(ids[:2], bound)
    assert_all_fail(results, "allowed only for rank")


def test_identities_bound_to_ranks_are_checked_against_the_job_rank_in_a_subgroup(ids):
    """``keygen --bind-ranks``: rank 2's key is rank 2's in every group, whatever slot it
    has there. The subgroup of job ranks [2, 3] establishes (slot 0 is rank 2); the
    same keys in the subgroup [3, 2] -- each key in the slot of the other rank -- fail."""
    bound = Allowlist({i.name: i.public_bytes for i in ids}, {f"rank{r}": [r] for r in range(4)})
    results, _ = establish(ids[2:4], bound, ranks=[2, 3])
    assert all(not isinstance(r, Exception) for r in results), results
    assert results[0].peers == results[1].peers == ["rank2", "rank3"]
    results, _ = establish(ids[2:4], bound, ranks=[3, 2])
    assert_all_fail(results, "allowed only for rank")
    assert "allowed only for rank(s) [2], but rank 3 presented it" in " ".join(map(str, results))


def _subgroup_session(rank, n, identities, bound):
    from ccddp.comm import CommSettings, Transport
    from ccddp.comm.session import establish as establish_session
    import torch.distributed as dist

    transport = Transport(dist.group.WORLD, 10.0)
    session = establish_session(transport, CommSettings(), KeyEstablishment(identities[rank], bound), ranks=[2, 3])
    return session.keys.peers


def test_a_session_of_a_subgroup_checks_identities_against_its_job_ranks(ids):
    """The session's setup hands the group's job ranks to the establishment: two ranks
    standing for job ranks 2 and 3 (``ranks=[2, 3]``, as torch's record of a subgroup
    says) establish with keys bound to ranks 2 and 3."""
    from thread_ranks import run_thread_ranks

    bound = Allowlist({i.name: i.public_bytes for i in ids}, {f"rank{r}": [r] for r in range(4)})
    assert run_thread_ranks(_subgroup_session, 2, ids[2:4], bound, timeout=60) == [["rank2", "rank3"]] * 2


class QuoteVerifier:
    """A stand-in attestation verifier: evidence is an HMAC "quote" over the binding, as
    a hardware quote carries the binding in its user-data field."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    def evidence(self, identity, binding):
        import hashlib
        import hmac

        return hmac.new(self.secret, identity.public_bytes + binding, hashlib.sha256).digest()

    def verify(self, rank, identity_public, evidence, binding):
        import hashlib
        import hmac

        good = hmac.new(self.secret, identity_public + binding, hashlib.sha256).digest()
        if not hmac.compare_digest(good, evidence):
            raise EstablishmentError(f"rank {rank}: quote does not vouch for this key exchange")
        return f"attested-{rank}"


def test_attestation_verifier_plugs_in(ids):
    v = QuoteVerifier(b"root of trust")
    results, _ = establish(ids[:2], None, verifiers=[v, v])
    assert [r.peers for r in results] == [["attested-0", "attested-1"]] * 2
    # A verifier that does not trust rank 1's quote stops the whole group.
    results, _ = establish(ids[:2], None, verifiers=[v, QuoteVerifier(b"another root")])
    assert_all_fail(results, "quote does not vouch")
    with pytest.raises(ConfigError):
        KeyEstablishment(ids[0], object())  # not a verifier


# -- files ------------------------------------------------------------------------------------

def test_identity_and_allowlist_files(tmp_path, ids):
    ids[0].save(tmp_path / "id.pem")
    assert stat.S_IMODE(os.stat(tmp_path / "id.pem").st_mode) == 0o600
    assert Identity.from_file(tmp_path / "id.pem").public_bytes == ids[0].public_bytes
    allow = Allowlist({"a": ids[0].public_bytes}, {"a": [0]})
    (tmp_path / "allow.json").write_text(allow.to_json())
    again = Allowlist.from_file(tmp_path / "allow.json")
    assert again.verify(0, ids[0].public_bytes, b"", b"") == "a"
    for bad in ("{", json.dumps({"format": "other", "identities": []}),
                json.dumps({"format": "ccddp-allowlist/1", "identities": [{"public_key": "zz"}]}),
                json.dumps({"format": "ccddp-allowlist/1", "identities": [{"public_key": "00" * 31}]})):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(ConfigError):
            Allowlist.from_file(tmp_path / "bad.json")
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ConfigError):
        Identity.from_file(tmp_path / "bad.pem")
    with pytest.raises(ConfigError):
        Identity.from_file(tmp_path / "missing.pem")


def test_keygen_writes_keys_and_allowlist(tmp_path, capsys):
    out = tmp_path / "keys"
    assert cli_main(["keygen", "--out", str(out), "--count", "3"]) == 0
    allow = Allowlist.from_file(out / "allowlist.json")
    assert len(allow) == 3
    for i in range(3):
        ident = Identity.from_file(out / f"rank{i}.pem")
        assert allow.verify(i, ident.public_bytes, b"", b"") == f"rank{i}"
    assert "CCDDP_IDENTITY" in capsys.readouterr().out
    # Never silently replaces a key; extends the allowlist with a new name.
    assert cli_main(["keygen", "--out", str(out), "--count", "1"]) == 2
    assert "exists" in capsys.readouterr().err
    assert cli_main(["keygen", "--out", str(out), "--names", "hostB", "--bind-ranks"]) == 0
    assert len(Allowlist.from_file(out / "allowlist.json")) == 4


def test_from_env_needs_both_variables(tmp_path, monkeypatch, ids):
    monkeypatch.delenv("CCDDP_IDENTITY", raising=False)
    assert KeyEstablishment.from_env() is None
    ids[0].save(tmp_path / "rank0.pem")
    monkeypatch.setenv("CCDDP_IDENTITY", str(tmp_path / "rank{rank}.pem"))
    monkeypatch.delenv("CCDDP_ALLOWLIST", raising=False)
    with pytest.raises(ConfigError, match="CCDDP_ALLOWLIST"):
        KeyEstablishment.from_env()


# -- fuzz: whatever the store hands back, only EstablishmentError --------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_messages_raise_only_establishment_errors(ids, allow, data):
    good = KeyEstablishment(ids[0], allow).message(0, 2, CONTEXT, bytes(31) + b"\x09", bytes(16))
    blob = data.draw(st.one_of(
        st.binary(max_size=400),
        st.builds(lambda i, b: good[:i] + bytes([good[i % len(good)] ^ b]) + good[i + 1:],
                  st.integers(0, len(good) - 1), st.integers(1, 255)),
        st.builds(lambda i: good[:i], st.integers(0, len(good))),
        st.builds(lambda extra: good + extra, st.binary(min_size=1, max_size=64)),
    ))
    try:
        m = parse_message(blob)
    except EstablishmentError:
        return
    # Parsed: then checking it as rank 0's message of a two-rank run must refuse or accept
    # only the untouched original.
    from ccddp.crypto.establish import _verify_signature

    try:
        _verify_signature(m)
        allow.verify(m.rank, m.identity, m.evidence, m.binding)
    except EstablishmentError:
        return
    assert blob == good


# -- on real ranks -----------------------------------------------------------------------------

def _group_rank(rank, n, keydir):
    """Runs on every rank: establishment from the environment inside SecureGroup, a
    secure all-reduce on the result; then an unlisted identity on rank 2, which must fail
    on every rank and leave the process group usable."""
    import torch

    from ccddp.bench.reference import all_gather, all_reduce

    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.establish import Allowlist, Identity, KeyEstablishment

    out = {}
    s = CommSettings(segment_bytes=1024, timeout_s=15)
    g = SecureGroup(s, transport=Transport.open(None, s.timeout_s))   # CCDDP_IDENTITY / CCDDP_ALLOWLIST are set
    x = torch.arange(3000, dtype=torch.float32) + rank
    all_reduce(x, g)
    out["sum_ok"] = torch.equal(x, torch.arange(3000, dtype=torch.float32) * n + n * (n - 1) / 2)
    out["peers"] = g.keys.peers
    gk = SecureGroup(s.with_(allgather="group-key"), transport=Transport.open(None, s.timeout_s))
    y = torch.empty(n * 500)
    all_gather(y, torch.full((500,), float(rank)), gk)
    out["gather_ok"] = torch.equal(y, torch.arange(n).repeat_interleave(500).float())
    out["sessions_differ"] = g.session_id != gk.session_id
    allow = Allowlist.from_file(os.path.join(keydir, "allowlist.json"))
    me = Identity.generate("impostor") if rank == 2 else Identity.from_file(os.path.join(keydir, f"rank{rank}.pem"))
    try:
        SecureGroup(s, establishment=KeyEstablishment(me, allow), transport=Transport.open(None, s.timeout_s))
        out["impostor"] = "accepted"
    except Exception as e:  # noqa: BLE001 - the test asserts on the type
        out["impostor"] = f"{type(e).__name__}: {e}"
    g2 = SecureGroup(s, transport=Transport.open(None, s.timeout_s))   # the group still works after the refusal
    z = torch.ones(100)
    out["after_ok"] = torch.equal(all_reduce(z, g2), torch.full((100,), float(n)))
    return out


def test_secure_group_establishes_from_env_on_real_ranks(tmp_path):
    keys = tmp_path / "keys"
    assert cli_main(["keygen", "--out", str(keys), "--count", "3"]) == 0
    env = {"CCDDP_IDENTITY": str(keys / "rank{rank}.pem"), "CCDDP_ALLOWLIST": str(keys / "allowlist.json"),
           "CCDDP_GROUP_SECRET": ""}
    res = values(spawn(_group_rank, 3, str(keys), env=env, timeout=120))
    for r, out in enumerate(res):
        assert out["sum_ok"] and out["gather_ok"] and out["after_ok"] and out["sessions_differ"], (r, out)
        assert out["peers"] == ["rank0", "rank1", "rank2"]
        assert out["impostor"].startswith("EstablishmentError"), (r, out["impostor"])
        assert "rank 2" in out["impostor"] and "not on the allowlist" in out["impostor"]
