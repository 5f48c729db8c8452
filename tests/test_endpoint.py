"""Session and Endpoint, the two steps under every engine collective: ``establish`` agrees
on a session (keys, a fresh session id), ``Endpoint`` holds what the engine runs on.
A plaintext session holds no key material and its endpoint no channels; two ranks that
establish and build endpoints run a sealed all-reduce equal to the plain sum; every
establishment is a new session."""

from __future__ import annotations

import pytest

from thread_ranks import run_thread_ranks

SECRET = bytes.fromhex("80a1ef968996f68127072dc1ef099048d83d39e3cbc8858a8292625323edcfc0")


def _plaintext_rank(rank, n):
    from ccddp.comm import CommSettings, Endpoint, Transport, establish
    from ccddp.crypto import GroupSecret
    from ccddp.errors import ConfigError

    settings = CommSettings(impl="ring", timeout_s=20)
    transport = Transport.open(None, 20)
    # A plaintext setting takes no key material, even where some is passed.
    session = establish(transport, settings, GroupSecret(SECRET))
    endpoint = Endpoint(session, transport)
    out = {"secret": session.secret, "keys": session.keys, "tag_key": session.tag_key, "sealed": session.sealed,
           "engine": endpoint.engine, "sid": session.session_id}
    try:
        endpoint.channels.tx(1 - rank)
        out["channels"] = "given"
    except ConfigError as e:
        out["channels"] = str(e)
    endpoint.close()
    return out


def test_a_plaintext_session_has_no_key_material_and_its_endpoint_no_channels():
    res = run_thread_ranks(_plaintext_rank, 2)
    for r in res:
        assert r["secret"] is None and r["keys"] is None and r["tag_key"] == b"" and not r["sealed"]
        assert r["engine"] is None
        assert "plaintext" in r["channels"] and "no link keys" in r["channels"]
    assert res[0]["sid"] == res[1]["sid"]   # the ranks still agreed on one session


def _sealed_rank(rank, n):
    import torch

    from ccddp.comm import CommSettings, Endpoint, Transport, establish
    from ccddp.comm.collectives import run_all_reduce
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto import GroupSecret

    settings = CommSettings(impl="secure", segment_bytes=1024, timeout_s=20)
    transport = Transport.open(None, 20)
    sessions, sums = [], []
    for _ in range(2):
        session = establish(transport, settings, GroupSecret(SECRET))
        endpoint = Endpoint(session, transport)
        # The ring (exchange=False) and a two-rank group's one exchange, each sealed.
        for exchange in (False, True):
            x = torch.arange(3000, dtype=torch.float32) * (rank + 1)
            run_all_reduce(endpoint, x, Reduction.SUM, exchange=exchange)
            sums.append(x)
        sealed = endpoint.counters.snapshot()["bytes_sealed"]
        endpoint.close()
        sessions.append((session.session_id, session.tag_key, sealed, session.sealed))
    return sessions, sums


def test_two_ranks_establish_and_run_a_sealed_all_reduce_equal_to_the_plain_sum():
    import torch

    res = run_thread_ranks(_sealed_rank, 2)
    want = torch.arange(3000, dtype=torch.float32) * 3
    for sessions, sums in res:
        assert all(torch.equal(s, want) for s in sums)
        assert all(sealed > 0 and is_sealed for _, _, sealed, is_sealed in sessions)
        (sid_a, tag_a, _, _), (sid_b, tag_b, _, _) = sessions
        assert sid_a != sid_b and tag_a != tag_b          # every establishment is a new session
    assert [s[0] for s in res[0][0]] == [s[0] for s in res[1][0]]   # the same sessions on both ranks


def _no_key_rank(rank, n):
    from ccddp.comm import CommSettings, Transport, establish
    from ccddp.errors import ConfigError

    with pytest.raises(ConfigError, match="needs key material"):
        establish(Transport.open(None, 20), CommSettings(impl="secure", timeout_s=20), None)
    return True


def test_a_sealed_setting_without_key_material_is_refused_before_any_message():
    assert run_thread_ranks(_no_key_rank, 2) == [True, True]


def test_an_endpoint_needs_the_links_its_session_was_established_on():
    from datetime import timedelta

    import torch.distributed as dist

    from ccddp.comm import CommSettings, Endpoint, Transport, establish
    from ccddp.errors import ConfigError

    one = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=5))
    session = establish(Transport(one, 5), CommSettings(impl="ring", timeout_s=5), None, ranks=[0])
    assert repr(session).count("tag_key") == 0 and "secret" not in repr(session)

    class TwoRanks:
        def rank(self):
            return 1

        def size(self):
            return 2

    other = Transport.__new__(Transport)
    other.pg = TwoRanks()
    with pytest.raises(ConfigError, match="the links its session was established on"):
        Endpoint(session, other)
