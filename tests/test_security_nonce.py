"""Nonce uniqueness: no (key, nonce) pair is ever sealed twice, across key rotation (a
small ``rotate_after``), every collective and schedule, several groups in one process,
and process restarts with the same long-term keys (pre-shared secret, and identity keys
for the authenticated exchange).

Each rank records every (key id, nonce) its channels take (``SecureGroup(recorder=...)``);
a nonce's link id says whether the rank sealed or opened it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from _security_util import spawn, values
from ccddp.cli import main as cli_main
from ccddp.crypto.channel import LinkChannel

SECRET_HEX = "7b84d0790e86aaab0310cd714f4417e5d3e7de00d1ed9adbdf2b7ca98b8c7ed4"
GROUP_LINK_BASE = 0xFFFF0000


def sealed_by(rank: int, nonce: bytes) -> bool:
    link = int.from_bytes(nonce[:4], "big")
    if link & GROUP_LINK_BASE == GROUP_LINK_BASE:     # group-key channel: the owner seals
        return link & 0xFFFF == rank
    return link >> 16 == rank


def _record_rank(rank, n, keydir):
    import torch

    from ccddp.bench.reference import all_gather, all_reduce, broadcast, reduce_scatter

    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto.establish import Allowlist, Identity, KeyEstablishment
    from ccddp.crypto.keys import GroupSecret

    log: list[tuple[str, str, str]] = []

    def recorder_for(session):
        return lambda key_id, nonce: log.append((session, key_id.hex(), nonce.hex()))

    base = CommSettings(segment_bytes=1024, rotate_after=3, timeout_s=20)
    variants = [base, base.with_(allgather="group-key"), base.with_(impl="secure-naive"),
                base.with_(algorithm="tree"), base.with_(tag="message")]
    est = KeyEstablishment(Identity.from_file(f"{keydir}/rank{rank}.pem"),
                           Allowlist.from_file(f"{keydir}/allowlist.json"))
    for mode in ("psk", "establish"):
        for i, s in enumerate(variants):
            kw = {"secret": GroupSecret.from_hex(SECRET_HEX)} if mode == "psk" else {"establishment": est}
            g = SecureGroup(s, recorder=recorder_for(f"{mode}/{i}"), transport=Transport.open(None, s.timeout_s), **kw)
            for numel in (1, 3000):
                x = torch.ones(numel)
                all_reduce(x, g)
                assert bool((x == n).all())
                out = torch.empty(numel * n)
                all_gather(out, torch.full((numel,), float(rank)), g)
                rs = torch.empty(numel)
                reduce_scatter(rs, torch.ones(numel * n), g)
                broadcast(torch.ones(numel), numel % n, g)
            g.close()
    return log


@pytest.fixture(scope="module")
def keydir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    assert cli_main(["keygen", "--out", str(d), "--count", "3"]) == 0
    return str(d)


def duplicates(records) -> list:
    return [k for k, c in Counter(records).items() if c > 1]


def test_no_key_nonce_pair_sealed_twice_across_rotation_and_restarts(keydir):
    n = 3
    runs = [values(spawn(_record_rank, n, keydir, timeout=150)) for _ in range(2)]   # two process lifetimes
    seals, opens = [], set()
    per_link: dict = {}
    for run, per_rank in enumerate(runs):
        for rank, log in enumerate(per_rank):
            for session, key_id, nonce in log:
                if sealed_by(rank, bytes.fromhex(nonce)):
                    seals.append((key_id, nonce))
                    per_link.setdefault((run, session, nonce[:8]), []).append((int(nonce[8:], 16), key_id))
                else:
                    opens.add((key_id, nonce))
    assert len(seals) > 2000
    assert duplicates(seals) == [], "a (key, nonce) pair was used twice"
    # Every frame opened was sealed, under the same key and nonce: the recorder sees both ends.
    assert opens <= set(seals) and len(opens) > 1000
    # Within one session a link's counter never repeats and its key changes every 3
    # messages (rotate_after=3): one key per epoch, none reused.
    for where, taken in per_link.items():
        counters = [c for c, _ in taken]
        assert sorted(counters) == list(range(len(counters))), where
        keys = {c // 3: k for c, k in taken}
        assert len(set(keys.values())) == len(keys) == (max(counters) // 3 + 1), where
    assert max(len(t) for t in per_link.values()) > 30
    # Counter values recur across sessions (they restart at 0); only the keys differ.
    nonces = Counter(nonce for _, nonce in seals)
    assert max(nonces.values()) > 1


def test_the_check_can_fail():
    """Two channels with the same key and link id (what a reused session would give)
    produce exactly the duplicates the test above looks for."""
    seen = []
    for _ in range(2):
        ch = LinkChannel(bytes(32), 1, "0->1", rotate_after=3, recorder=lambda k, n: seen.append((k, n)))
        for _ in range(5):
            ch.seal(b"x" * 8, bytearray(24), b"")
    assert len(duplicates(seen)) == 5
