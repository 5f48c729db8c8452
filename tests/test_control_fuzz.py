"""Fuzz every parser of received control bytes: whatever the host hands a rank, the only
exceptions are ccddp's typed errors (``CCDDPError`` subclasses) -- never RecursionError,
struct.error, UnicodeDecodeError, IndexError, KeyError, ValueError or TypeError.

The setup protocols (``agree_session``, ``KeyEstablishment.run``) run on threads with an
all-gather the test rewrites: random bytes and mutations of the real messages (deep
nesting, huge lengths, truncation, a wrong magic, non-UTF-8, NaN/Infinity, duplicate
keys, messages replayed from other slots or rounds, dropped or extra messages). Beyond
"typed errors only", a rank that goes on must have peers that all proved they verified
(each sent an "ok" verdict), and the ranks that go on agree on their keys.

The parsers with no protocol around them are fuzzed directly: the JSON reader every
control-plane parser uses, the establishment message, the control messages
``gather_json`` returns, the sealed descriptor's explanation and the allowlist file.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ccddp.comm import control
from ccddp.comm.descriptors import DESC as _DESC, explain as _explain
from ccddp.crypto.establish import Allowlist, EstablishedKeys, Identity, KeyEstablishment, parse_message
from ccddp.crypto.keys import GroupSecret
from ccddp.crypto.session import Agreement, agree_session
from ccddp.crypto.wirejson import parse_json
from ccddp.errors import CCDDPError, ConfigError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
# The setup protocols: a few milliseconds an example on threads.
FUZZ_PROTOCOL = settings(FUZZ, max_examples=300)
SECRET = GroupSecret(bytes.fromhex("5f0e8c2a9d4b71e3c6a80f15d2b97e4a3c1d6f8b0a2e5c7d9f1b3a5c7e9d0b2f"))
HELLO_HEADER = 12 + 4 + 32          # session hello: magic, rank, contribution; JSON follows
EVIDENCE_LENGTH_AT = 12 + 4 + 4 + 3 * 32 + 16   # establishment message: magic, rank, world, 3 keys, nonce
# Where a mutation lands: anywhere, or often where a header ends or a length field sits.
offset = st.one_of(st.sampled_from([HELLO_HEADER, EVIDENCE_LENGTH_AT, 0, 1]), st.integers(0, 1 << 16))
DEEP = b"[" * 100_000

# JSON that json.loads mishandles or that is not JSON: what the host puts after a header.
EVIL_JSON = [
    DEEP, b"{" + b'"a":{' * 5000, b"[" * 900 + b"]" * 900, b'{"world size": NaN}', b'{"world size": Infinity}',
    b"[-Infinity]", b"[1e999]", b'{"world size": 2, "world size": 2}', b"\xff\xfe{}", b'{"a": "\xc3\x28"}',
    b"1" * 5000, b'"' + b"[" * 5000, b"{}", b"[]", b"null", b'{"world size": [2]}', b"\x00" * 64,
    b'{"world size": 2, "group ranks": [0, 1], "collective settings": {"x": ' + b"[" * 50 + b"]" * 50 + b"}}",
]


# -- an all-gather among threads that the test rewrites ---------------------------------------

class Board:
    """An all-gather of bytes among threads; ``tamper(round, rank, view)`` plays the host.

    A rank that raises before its last round aborts the barrier, so its peers stop at
    once instead of waiting: they then fail with ``BrokenBarrierError``, and the checks
    below report the rank that left the protocol early -- itself a failure (its peers
    would wait for it until a timeout)."""

    def __init__(self, n: int, tamper) -> None:
        self.n, self.tamper = n, tamper
        self.barrier = threading.Barrier(n, timeout=10)
        self.rounds: dict[int, dict[int, bytes]] = defaultdict(dict)
        self.calls = [0] * n

    def exchange_for(self, rank: int):
        calls = self.calls

        def exchange(blob: bytes) -> list[bytes]:
            r = calls[rank]
            calls[rank] += 1
            self.rounds[r][rank] = bytes(blob)
            self.barrier.wait()
            return self.tamper(r, rank, [self.rounds[r][j] for j in range(self.n)])

        return exchange


def run_group(n: int, run_rank, tamper, rounds: int = 3) -> tuple[list, Board]:
    """Run ``run_rank(rank, exchange)`` on ``n`` threads, a protocol of ``rounds`` rounds."""
    board = Board(n, tamper)
    results: list = [None] * n

    def main(r: int) -> None:
        try:
            results[r] = run_rank(r, board.exchange_for(r))
        except BaseException as e:  # noqa: BLE001 - every outcome is asserted on
            results[r] = e
            if board.calls[r] < rounds:
                results[r] = LeftEarly(e, board.calls[r])
                board.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a rank hung"
    return results, board


class LeftEarly(Exception):
    """A rank raised before it took part in every round of the protocol."""

    def __init__(self, error: BaseException, rounds: int) -> None:
        super().__init__(f"left after {rounds} rounds with {type(error).__name__}: {error}"[:400])
        self.error = error


def assert_typed(results) -> None:
    """Every rank returned or raised a one-line CCDDPError, and took part in every round."""
    for r, res in enumerate(results):
        if isinstance(res, LeftEarly):
            res = res.error
        if isinstance(res, BaseException) and not isinstance(res, threading.BrokenBarrierError):
            assert isinstance(res, CCDDPError), f"rank {r} raised {type(res).__name__}: {res!r}"[:400]
            assert "\n" not in str(res), f"rank {r}: a multi-line error"
    early = {r: str(res) for r, res in enumerate(results) if isinstance(res, LeftEarly)}
    assert not early, f"ranks left the protocol early (their peers would wait on them): {early}"


def assert_went_on_only_when_every_peer_verified(results, board, verdict_round: int) -> None:
    """A rank that returned keys was told by every peer, with proof, that it verified:
    every peer sent an "ok" verdict (first byte 0x00) in the verdict round."""
    if not any(not isinstance(r, BaseException) for r in results):
        return
    sent = board.rounds[verdict_round]
    for j in range(board.n):
        assert sent.get(j, b"\x01")[:1] == b"\x00", \
            f"a rank went on while rank {j} had failed: {[type(r).__name__ for r in results]}, {results[j]!r}"


# -- mutations ---------------------------------------------------------------------------------

byte_mutation = st.one_of(
    st.tuples(st.just("flip"), offset, st.integers(0, 7)),
    st.tuples(st.just("set"), offset, st.integers(0, 255)),
    st.tuples(st.just("cut"), offset),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("huge"), st.sampled_from([1 << 16, (1 << 16) + 1, 1 << 20])),
    st.tuples(st.just("random"), st.binary(max_size=300)),
    st.tuples(st.just("magic"), st.binary(min_size=12, max_size=12)),
    st.tuples(st.just("non-utf8"), offset),
    st.tuples(st.just("json"), offset, st.sampled_from(EVIL_JSON)),
    st.tuples(st.just("length-field"), offset, st.sampled_from([0, 1, 0xFFFF, 1 << 20, 0xFFFFFFFF])),
)


def mutate(blob: bytes, m) -> bytes:
    kind, *a = m
    b = bytearray(blob)
    if kind == "flip" and b:
        b[a[0] % len(b)] ^= 1 << a[1]
    elif kind == "set" and b:
        b[a[0] % len(b)] = a[1]
    elif kind == "cut":
        b = b[:a[0] % (len(b) + 1)]
    elif kind == "extend":
        b += a[0]
    elif kind == "huge":
        b += b"A" * a[0]
    elif kind == "random":
        b = bytearray(a[0])
    elif kind == "magic":
        b[:12] = a[0]
    elif kind == "non-utf8":
        b.insert(a[0] % (len(b) + 1), 0xFF)
    elif kind == "json":       # keep a header of some length, then JSON that is not a context
        b = b[:a[0]] + a[1]
    elif kind == "length-field":
        b[a[0]:a[0] + 4] = struct.pack(">I", a[1])
    return bytes(b)


view_mutation = st.one_of(
    st.tuples(st.just("message"), st.integers(0, 7), byte_mutation),
    st.tuples(st.just("drop"), st.integers(0, 7)),
    st.tuples(st.just("duplicate"), st.integers(0, 7)),
    st.tuples(st.just("swap"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("empty")),
    st.tuples(st.just("replay-slot"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("replay-round"), st.integers(0, 7), st.integers(0, 3)),
)

# (round, viewer, mutation): the host rewrites what ``viewer`` receives in ``round``.
tampering = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), view_mutation), min_size=1, max_size=3)


def host(tampers):
    """A tamper function applying ``tampers``; what it saw is kept for replays."""
    seen: dict[int, list[bytes]] = {}

    def tamper(rnd: int, rank: int, view: list[bytes]) -> list[bytes]:
        seen.setdefault(rnd, list(view))
        view = list(view)
        for t_rnd, viewer, (kind, *a) in tampers:
            if t_rnd != rnd or viewer != rank:
                continue
            n = len(view)
            if kind == "message" and n:
                view[a[0] % n] = mutate(view[a[0] % n], a[1])
            elif kind == "drop" and n:
                del view[a[0] % n]
            elif kind == "duplicate" and n:
                view.append(view[a[0] % n])
            elif kind == "swap" and n:
                i, j = a[0] % n, a[1] % n
                view[i], view[j] = view[j], view[i]
            elif kind == "empty":
                view = []
            elif kind == "replay-slot" and n:
                view[a[0] % n] = view[a[1] % n]
            elif kind == "replay-round" and n and a[1] in seen and seen[a[1]]:
                old = seen[a[1]]
                view[a[0] % n] = old[a[0] % len(old)]
        return view

    return tamper


# -- the JSON reader ---------------------------------------------------------------------------

json_text = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
).map(lambda v: json.dumps(v).encode())


@FUZZ
@given(data=st.one_of(st.binary(max_size=400), json_text, st.sampled_from(EVIL_JSON),
                      st.tuples(json_text, byte_mutation).map(lambda t: mutate(*t))),
       allow_nan=st.booleans())
@example(data=DEEP, allow_nan=False)
def test_the_json_reader_raises_only_its_typed_error(data, allow_nan):
    try:
        value = parse_json(data, what="a message", max_bytes=1 << 16, allow_nan=allow_nan)
    except ConfigError as e:
        assert str(e).startswith("a message "), e
        return
    assert json.loads(data) == value or value != value   # what it accepts is JSON (NaN != NaN)


def test_the_json_reader_refuses_before_parsing():
    for bad, why in [(DEEP, "nested deeper"), (b"[" * 33 + b"]" * 33, "nested deeper"), (b"1" * 2_000_000, "bytes"),
                     (b"[NaN]", "NaN"), (b"[1e999]", "overflows"), (b'{"a": 1, "a": 2}', "twice"),
                     (b'"\xff"', "UTF-8"), (b"[1,", "not JSON")]:
        with pytest.raises(ConfigError, match=why):
            parse_json(bad, what="m", max_bytes=1 << 20)
    # Brackets inside strings are not nesting; 32 levels are.
    assert parse_json(b'["' + b"[" * 100 + b'\\"["]', what="m", max_bytes=1 << 16) == ["[" * 100 + '"[']
    assert parse_json(b"[" * 32 + b"]" * 32, what="m", max_bytes=1 << 16) is not None
    assert parse_json(b"[NaN]", what="m", max_bytes=1 << 16, allow_nan=True)[0] != 0


# -- the pre-shared-secret setup ----------------------------------------------------------------

CONTEXT = {"world size": 3, "group ranks": [0, 1, 2], "collective settings": '{"impl": "secure"}'}


def _session_rank(secret):
    def run(rank: int, exchange) -> Agreement:
        return agree_session(secret, rank, 3, exchange, context=CONTEXT)

    return run


@pytest.mark.parametrize("payload", [DEEP, b"{" + b'"a":{' * 5000, b'{"world size": NaN}', b"1" * 5000,
                                     b"\xff" + b"{}", b'{"world size": 3, "world size": 3}', b"A" * (1 << 20)],
                         ids=["deep-array", "deep-object", "nan", "long-int", "non-utf8", "duplicate-key", "huge"])
@pytest.mark.parametrize("secret", [SECRET, None], ids=["secret", "plaintext"])
def test_a_malformed_hello_fails_every_rank_with_a_config_error(payload, secret):
    """A valid hello header (magic, rank, contribution) and then what is not a context:
    every rank raises ConfigError (with a secret: the rank that saw it reports it to the
    others); none raises RecursionError or ValueError, none hangs."""
    def tamper(rnd, rank, view):
        if rnd == 0 and rank != 1:
            view = list(view)
            view[1] = view[1][:HELLO_HEADER] + payload
        return view

    results, _ = run_group(3, _session_rank(secret), tamper, rounds=3 if secret else 1)
    assert_typed(results)
    for r, res in enumerate(results):
        if secret is None and r == 1:
            assert isinstance(res, Agreement)    # plaintext: only who received it can tell
            continue
        assert isinstance(res, ConfigError), (r, res)
    assert "rank 1's setup message" in str(results[0])


@FUZZ_PROTOCOL
@given(tampers=tampering, secret=st.sampled_from([SECRET, None]))
@example(tampers=[(0, 0, ("message", 1, ("json", HELLO_HEADER, DEEP)))], secret=SECRET)
@example(tampers=[(2, 0, ("message", 1, ("cut", 5)))], secret=SECRET)
@example(tampers=[(1, 2, ("empty",))], secret=SECRET)
def test_agree_session_raises_only_config_errors(tampers, secret):
    results, board = run_group(3, _session_rank(secret), host(tampers), rounds=3 if secret else 1)
    assert_typed(results)
    for res in results:
        if isinstance(res, BaseException):
            assert isinstance(res, ConfigError), res
    if secret is not None:
        assert_went_on_only_when_every_peer_verified(results, board, verdict_round=2)
    ok = [r for r in results if isinstance(r, Agreement)]
    assert len({r.session_id for r in ok}) <= 1 or secret is None


def test_agree_session_honest_ranks_succeed():
    """The other side of the fuzz: untouched, the setup succeeds on every rank."""
    results, _ = run_group(3, _session_rank(SECRET), lambda rnd, rank, view: view)
    assert all(isinstance(r, Agreement) for r in results), results
    assert len({r.session_id for r in results}) == 1


# -- the identity-key establishment ----------------------------------------------------------

IDS = [Identity.generate(f"rank{i}") for i in range(3)]
ALLOW = Allowlist({i.name: i.public_bytes for i in IDS})


def _establish_rank(rank: int, exchange) -> EstablishedKeys:
    return KeyEstablishment(IDS[rank], ALLOW).run(rank, 3, exchange, b"settings")


@FUZZ_PROTOCOL
@given(tampers=tampering)
@example(tampers=[(0, 0, ("message", 1, ("length-field", EVIDENCE_LENGTH_AT, 0xFFFFFFFF)))])
@example(tampers=[(2, 0, ("replay-round", 1, 1))])
@example(tampers=[(1, 1, ("message", 0, ("flip", 20, 0))), (2, 0, ("replay-slot", 1, 2))])
@example(tampers=[(2, 0, ("empty",))])
def test_key_establishment_raises_only_typed_errors(tampers):
    results, board = run_group(3, _establish_rank, host(tampers))
    assert_typed(results)
    assert_went_on_only_when_every_peer_verified(results, board, verdict_round=2)
    ok = [r for r in results if isinstance(r, EstablishedKeys)]
    assert len({r.session_id for r in ok}) <= 1
    for a in ok:
        for b in ok:
            if a.rank != b.rank:
                assert a.link_key(a.rank, b.rank) == b.link_key(a.rank, b.rank)


@FUZZ
@given(m=byte_mutation)
@example(m=("length-field", EVIDENCE_LENGTH_AT, 0xFFFFFFFF))
@example(m=("cut", 183))
def test_parse_message_raises_only_establishment_errors(m):
    good = KeyEstablishment(IDS[0], ALLOW).message(0, 3, b"settings", bytes(31) + b"\x09", bytes(16))
    try:
        msg = parse_message(mutate(good, m))
    except CCDDPError:
        return
    assert msg.raw == mutate(good, m)


# -- control messages, descriptors, the allowlist file -------------------------------------------

def _plaintext_group():
    return SimpleNamespace(settings=SimpleNamespace(secure=False, timeout_s=5.0), pg=None, world_size=2)


@pytest.mark.parametrize("blob", [DEEP, b'{"a": ' * 10_000, b"\xff\xfe", b"[1,"],
                         ids=["deep-array", "deep-object", "non-utf8", "truncated"])
def test_gather_json_refuses_a_malformed_message_with_a_config_error(monkeypatch, blob):
    """What ``gather_json`` receives on a plaintext group (the host may write it; on a
    secure group it is authenticated first) is parsed into data or refused, typed."""
    monkeypatch.setattr(control, "exchange_bytes", lambda b, pg, timeout: [b, blob])
    with pytest.raises(ConfigError, match="rank 1's control message"):
        control.gather_json({"wrong": 0}, _plaintext_group())


@FUZZ
@given(blobs=st.lists(st.one_of(st.binary(max_size=200), json_text, st.sampled_from(EVIL_JSON)), max_size=3))
def test_control_messages_parse_or_raise_config_errors(blobs):
    try:
        out = control.parse_messages(blobs)
    except ConfigError as e:
        assert "control message" in str(e)
        return
    assert len(out) == len(blobs)


def test_control_messages_keep_what_gather_json_writes():
    records = [{"loss": float("nan"), "steps": [1, 2], "ok": True}, {"loss": float("inf"), "nested": {"a": [[]]}}]
    out = control.parse_messages([json.dumps(r, sort_keys=True).encode() for r in records])
    assert out[0]["loss"] != out[0]["loss"] and out[1]["loss"] == float("inf") and out[1]["nested"] == {"a": [[]]}


@FUZZ
@given(blob=st.one_of(st.binary(min_size=_DESC.size, max_size=_DESC.size), st.binary(max_size=100)))
@example(blob=bytes([200, 200]) + bytes(_DESC.size - 2))
def test_a_descriptor_is_explained_whatever_it_holds(blob):
    """A peer's (authenticated) descriptor names an op, reduction or dtype this version
    may not know: the mismatch is still explained, never a ValueError."""
    text = _explain(blob)
    assert isinstance(text, str) and "\n" not in text


allowlist_doc = st.fixed_dictionaries({
    "format": st.sampled_from(["ccddp-allowlist/1", "other", 1, None]),
    "identities": st.one_of(
        st.lists(st.fixed_dictionaries(
            {"public_key": st.one_of(st.just(IDS[0].public_bytes.hex()), st.text(max_size=70), st.integers())},
            optional={"name": st.one_of(st.text(max_size=8), st.integers(), st.none()),
                      "ranks": st.one_of(st.none(), st.lists(st.integers(-2, 4), max_size=3), st.text(max_size=4),
                                         st.integers(), st.lists(st.text(max_size=2), max_size=2),
                                         st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=2),
                                         st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))}),
            max_size=3),
        st.text(max_size=5), st.integers(), st.none()),
}).map(lambda d: json.dumps(d).encode())


@FUZZ
@given(data=st.one_of(allowlist_doc, st.tuples(allowlist_doc, byte_mutation).map(lambda t: mutate(*t)),
                      st.sampled_from(EVIL_JSON), st.binary(max_size=200)))
@example(data=b'{"format": "ccddp-allowlist/1", "identities": [{"public_key": "' + IDS[0].public_bytes.hex().encode()
         + b'", "ranks": "ab"}]}')
@example(data=b'{"format": "ccddp-allowlist/1", "identities": ' + DEEP + b"}")
def test_an_allowlist_file_loads_or_raises_a_config_error(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "allow.json"
        p.write_bytes(data)
        try:
            allow = Allowlist.from_file(p)
        except ConfigError as e:
            assert "\n" not in str(e)
            return
    assert isinstance(len(allow), int)


def test_allowlist_ranks_must_be_integers():
    pub = os.urandom(32)
    for bad in ("01", 3, [1.5], [True], [-1], {"0": 1}):
        with pytest.raises(ConfigError, match="ranks must be a list"):
            Allowlist({"a": pub}, {"a": bad})
    assert Allowlist({"a": pub}, {"a": [0, 2]}).verify(2, pub, b"", b"") == "a"


def test_a_rank_of_the_previous_wire_version_is_refused_at_setup():
    """A v1 rank sends a small op's descriptor and data apart and posts descriptor receives
    with no room for a v2 rank's message (gloo would abort it): the two stop at the hello,
    saying why."""
    import struct

    from ccddp.crypto import session

    def exchange(mine):
        theirs = bytearray(mine)
        theirs[:12] = b"ccddp-ses/v1"
        theirs[12:16] = struct.pack(">I", 1)
        return [mine, bytes(theirs)]

    with pytest.raises(ConfigError, match="rank 1's setup message has an unknown format .*ccddp version"):
        session.agree_session(None, 0, 2, exchange, context=CONTEXT)
