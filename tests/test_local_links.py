"""A trust domain's plaintext links and the proof behind them (issue 37, findings 1, 2, 7).

- The links are AF_UNIX sockets named from the session, never addresses from the store;
  a peer is on them only after answering under the session's key: one that does not hold
  it, or cannot be reached, is not proven.
- The map comes from proofs: a claimed domain whose ranks did not prove each other is
  refused on every rank (explicit map) or split, sealed (``"node"``), whatever host names
  or node ranks say.
- The link set behaves as gloo's P2P does for the engine (matching by peer and tag in
  posting order, bounded waits, a closed peer fails pending receives at once).
- The sealed gloo sets' setup ends within the timeout when the host's store leaves both
  ends of a connection waiting for the other.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ccddp.backend.local_links import LocalEndpoint, LocalLinkSet, socket_name
from ccddp.comm.domains import DomainMap, candidates, from_proofs
from ccddp.errors import ConfigError, PeerTimeoutError
# Processes: a rank that cannot prove its domain needs a process (a kernel view) of its own.
from dist_util import RankFailure, child_env, run_ranks

SECRET = "4c7e19b2d8a05f36e1c94b7a2d6f803e5b1c9a7d2e4f6083b5a7c9e1d3f50b28"
KEY = bytes(range(32))


def _pair(session: bytes | None = None, key_of_1: bytes = KEY, timeout_s: float = 5.0):
    session = session or os.urandom(16)
    a = LocalEndpoint.listen(session, KEY, 0, timeout_s)
    b = LocalEndpoint.listen(session, key_of_1, 1, timeout_s)
    return a, b


def _linked(timeout_s: float = 5.0) -> tuple[LocalLinkSet, LocalLinkSet]:
    a, b = _pair(timeout_s=timeout_s)
    assert a.prove([1]) == {1} and b.prove([0]) == {0}
    return LocalLinkSet(a, [0, 1]), LocalLinkSet(b, [0, 1])


# -- the proof --------------------------------------------------------------------------

def test_members_of_the_session_prove_each_other_over_abstract_unix_sockets():
    a, b = _pair()
    try:
        assert a.prove([1]) == {1} and b.prove([0]) == {0}
        links = (a.outbound[1], b.outbound[0], *a.wait_inbound([1]).values(), *b.wait_inbound([0]).values())
        assert all(s.family == socket.AF_UNIX for s in links)
        # Named from the session alone: nothing the store holds, no file to squat.
        assert a.outbound[1].getpeername() == socket_name(a.session_id, 1) and socket_name(a.session_id, 1)[0] == 0
    finally:
        a.close()
        b.close()


def test_a_listener_without_the_session_key_is_not_proven_and_cannot_prove_itself():
    a, b = _pair(key_of_1=bytes(32))            # same session id and name, another key
    try:
        assert a.prove([1]) == set()
        assert b.prove([0]) == set()
        a.timeout_s = 0.3                          # the wait for rank 1's own link
        with pytest.raises(PeerTimeoutError, match=r"ranks \[1\]"):
            a.wait_inbound([1])
    finally:
        a.close()
        b.close()


def test_a_rank_not_on_this_machine_is_not_proven_at_once():
    a = LocalEndpoint.listen(os.urandom(16), KEY, 0, 30.0)
    try:
        start = time.monotonic()
        assert a.prove([1, 2, 3]) == set()      # no such listeners: refused, no waiting
        assert time.monotonic() - start < 1.0
    finally:
        a.close()


def test_a_recorded_answer_does_not_prove_a_second_connection():
    """Fresh nonces on both sides: replaying the initiator's last message of one handshake
    into another is refused by the listener."""
    import hashlib
    import hmac as hm

    from ccddp.backend import local_links as ll

    session = os.urandom(16)
    b = LocalEndpoint.listen(session, KEY, 1, 2.0)
    try:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        first.connect(socket_name(session, 1))
        n_i = os.urandom(32)
        first.sendall(ll._HELLO.pack(ll._MAGIC, 0, 1, n_i))
        answer = ll._recv_exact(first, 64)
        proof = hm.new(KEY, b"I" + ll._MAGIC + (0).to_bytes(4, "big") + (1).to_bytes(4, "big") + n_i + answer[:32],
                       hashlib.sha256).digest()
        first.sendall(proof)
        assert ll._recv_exact(first, 1) == ll._ACCEPTED
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second.connect(socket_name(session, 1))
        second.sendall(ll._HELLO.pack(ll._MAGIC, 0, 1, n_i))     # the same hello ...
        ll._recv_exact(second, 64)                               # ... gets a fresh nonce
        second.sendall(proof)                                    # the old proof
        second.settimeout(2.0)
        assert second.recv(1) == b""                             # dropped, not accepted
    finally:
        b.close()


# -- the map from proofs -----------------------------------------------------------------

def test_an_explicit_map_whose_ranks_did_not_prove_each_other_is_refused_naming_them():
    proven = [{1}, {0}, set(), set()]           # 0 and 1 proved each other; 2 and 3 did not
    with pytest.raises(ConfigError, match=r"ranks 2 and 3 claim one trust domain"):
        from_proofs([[0, 1], [2, 3]], 4, proven, ["0"] * 4)
    m, warnings = from_proofs([[0, 1], [2], [3]], 4, proven, ["0"] * 4)
    assert m == DomainMap.of([[0, 1], [2], [3]], 4) and not warnings


def test_node_domains_come_from_proofs_not_from_names():
    # Every rank reports the same node (the host rewrote the names): only proofs join.
    m, warnings = from_proofs("node", 4, [{1}, {0}, {3}, {2}], ["0"] * 4)
    assert m == DomainMap.of([[0, 1], [2, 3]], 4) and not warnings
    # Proven but on two torchrun nodes: the host-reported node rank only splits.
    m, _ = from_proofs("node", 4, [{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1, 2}], ["0", "0", "1", "1"])
    assert m == DomainMap.of([[0, 1], [2, 3]], 4)
    # A one-sided proof is no proof; proofs that are not a clique split, with a warning.
    m, warnings = from_proofs("node", 3, [{1}, set(), set()], ["0"] * 3)
    assert m.trivial and warnings
    m, warnings = from_proofs("node", 3, [{1, 2}, {0}, {0}], ["0"] * 3)
    assert m.trivial and any("only some" in w for w in warnings)


def test_what_each_rank_must_prove():
    assert candidates("rank", 0, 4) == []
    assert candidates("node", 2, 4) == [0, 1, 3]
    assert candidates([[0, 2], [1, 3]], 3, 4) == [1]


# -- the link set ------------------------------------------------------------------------

def test_messages_match_by_tag_in_posting_order_whenever_they_arrive():
    x, y = _linked()
    try:
        # Sent before the receives are posted, on two tags, interleaved.
        sends = [x.send([torch.full((4,), float(i), dtype=torch.float32)], 1, tag=7 + i % 2) for i in range(6)]
        for w in sends:
            w.wait(timedelta(seconds=5))
        time.sleep(0.05)
        got = [torch.empty(4) for _ in range(6)]
        order = [1, 3, 5, 0, 2, 4]               # tag 8's three, then tag 7's
        works = [y.recv([got[i]], 0, tag=7 + i % 2) for i in order]
        for w in works:
            w.wait(timedelta(seconds=5))
        assert [int(got[i][0]) for i in order] == order
        # Posted before the message: lands in place; the other direction is independent.
        big = torch.empty(1 << 20, dtype=torch.uint8)
        w = x.recv([big], 1, tag=3)
        y.send([torch.arange(1 << 20).to(torch.uint8)], 0, tag=3).wait(timedelta(seconds=5))
        w.wait(timedelta(seconds=5))
        assert torch.equal(big, torch.arange(1 << 20).to(torch.uint8))
    finally:
        x.close()
        y.close()


def test_allgather_and_the_engine_ring_run_on_the_link_set():
    from ccddp.comm import CommSettings, SecureGroup
    from ccddp.comm.collectives import run_all_reduce
    from ccddp.comm.reduce import Reduction
    from ccddp.comm.transport import Transport

    x, y = _linked()
    results = {}

    def rank(links, r):
        try:
            g = SecureGroup(CommSettings(impl="ring", segment_bytes=4096, timeout_s=10), None, pg=links,
                            transport=Transport(links, 10), ranks=[0, 1])
            t = torch.arange(50_000, dtype=torch.float32) * (r + 1)
            run_all_reduce(g, t, Reduction.SUM)
            results[r] = t
        except BaseException as e:      # reported below
            results[r] = e

    threads = [threading.Thread(target=rank, args=(links, r)) for r, links in enumerate((x, y))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    x.close()
    y.close()
    want = torch.arange(50_000, dtype=torch.float32) * 3
    assert all(isinstance(results.get(r), torch.Tensor) and torch.equal(results[r], want) for r in (0, 1)), results


def test_waits_are_bounded_and_a_closed_peer_fails_pending_receives_at_once():
    x, y = _linked()
    try:
        w = y.recv([torch.empty(8)], 0, tag=1)
        with pytest.raises(RuntimeError, match="Timed out"):
            w.wait(timedelta(seconds=0.2))
        x.close()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="closed"):
            w.wait(timedelta(seconds=10))
        assert time.monotonic() - start < 5
        with pytest.raises(RuntimeError, match="closed"):
            y.recv([torch.empty(8)], 0, tag=2).wait(timedelta(seconds=10))
    finally:
        y.close()


def test_a_message_of_another_size_fails_its_receive():
    x, y = _linked()
    try:
        w = y.recv([torch.empty(8)], 0, tag=1)
        x.send([torch.empty(3)], 1, tag=1).wait(timedelta(seconds=5))
        with pytest.raises(RuntimeError, match="12 bytes arrived for a receive of 32"):
            w.wait(timedelta(seconds=5))
    finally:
        x.close()
        y.close()


# -- on real ranks ------------------------------------------------------------------------

def _unreachable_rank(rank, n, setting):
    """A group whose rank 1 listens (and looks for its peers) under other names: as a rank
    on another machine would be, while every host-reported fact (host name, node rank,
    addresses) says the ranks share one."""
    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    from ccddp.backend import Options
    from ccddp.backend import local_links
    from ccddp.comm import CommSettings

    if rank == 1:
        real = local_links.socket_name
        local_links.socket_name = lambda session, r: real(session[::-1], r)
    settings = CommSettings(timeout_s=20, trust_domains=setting)
    pg = dist.new_group(backend="ccddp", timeout=timedelta(seconds=20), pg_options=Options(settings=settings))
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t, group=pg)
    return {"domains": pg.domains.as_lists(), "sum_ok": bool(torch.equal(t, torch.full((1000,), 3.0))),
            "hierarchical": pg.domain_links is not None}


def test_a_claimed_domain_that_cannot_prove_itself_is_refused_on_every_rank():
    results = run_ranks(_unreachable_rank, 2, [[0, 1]], return_failures=True, timeout=120)
    for r in results:
        assert isinstance(r, RankFailure) and r.type_name == "ConfigError", r
        assert "ranks 0 and 1 claim one trust domain" in r.message, r.message


def test_node_ranks_that_cannot_prove_it_stay_sealed_from_each_other(capfd):
    results = run_ranks(_unreachable_rank, 2, "node", timeout=120)
    assert all(r == {"domains": [[0], [1]], "sum_ok": True, "hierarchical": False} for r in results), results
    assert "proved it with none" in capfd.readouterr().err


# -- the sealed sets' setup, bounded ------------------------------------------------------

class _AddressRewritingStore(dist.Store):
    """The host's store: every IPv4 loopback address a gloo rank published reads back as
    255.255.255.254, so each end of a connection finds the other's address the greater
    and waits to be connected to."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner

    def get(self, key):
        value = bytearray(self.inner.get(key))
        at = value.find(b"\x7f\x00\x00\x01")
        if at >= 0:
            value[at:at + 4] = b"\xff\xff\xff\xfe"
        return bytes(value)

    def set(self, key, value):
        return self.inner.set(key, value)

    def add(self, key, n):
        return self.inner.add(key, n)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)


def _withheld_connections() -> None:
    """Two ranks (threads) build the group's sealed sets over the rewriting store; each
    prints what it got and when, then the process exits (raising the first rank's error,
    as a rank's script would)."""
    import json

    from ccddp.backend.links import internal_links

    store = _AddressRewritingStore(dist.HashStore())
    outcome = {}

    def rank(r):
        start = time.monotonic()
        try:
            internal_links(store, r, 2, timedelta(seconds=2))
            outcome[r] = {"kind": "connected"}
        except BaseException as e:        # reported below
            outcome[r] = {"kind": type(e).__name__, "why": str(e)}
        outcome[r]["took"] = time.monotonic() - start

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    print(json.dumps(outcome), flush=True)
    if outcome.get(0, {}).get("kind") == "PeerTimeoutError":
        raise PeerTimeoutError(outcome[0]["why"])


def test_link_setup_ends_within_the_timeout_when_the_host_leaves_both_ends_waiting():
    """Each rank gets a PeerTimeoutError naming it within the timeout (2 s, + the margin),
    and the process then exits with that error, cleanly, although gloo's own setup is
    still running when the rank gives up on it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = child_env()
    r = subprocess.run([sys.executable, "-c", "import test_local_links as t; t._withheld_connections()"],
                       cwd=here, env=env, capture_output=True, text=True, timeout=120)
    outcome = {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    assert set(outcome) == {0, 1}, f"a rank was still connecting after 30 s: {outcome}"
    for rank, got in outcome.items():
        assert got["kind"] == "PeerTimeoutError" and got["took"] < 2 + 3, (rank, got)
        assert f"rank {rank}: cannot connect" in got["why"]
    assert r.returncode == 1 and "PeerTimeoutError" in r.stderr and "terminate called" not in r.stderr, \
        (r.returncode, r.stderr[-2000:])
