"""Contributory, confirmed sessions for a group that holds a pre-shared secret.

Every secure group runs this before it seals its first byte. The exchange that carries it
(a process group and its store) belongs to the host, so nothing a rank receives here is
trusted until it is confirmed under the secret. Three rounds, each an all-gather of one
message per rank:

1. *hello*: ``(rank, 32 fresh random bytes, context)``; the context names the group (world
   size, member ranks, settings) and must be equal on every rank. The *transcript* is the
   hash of every hello in rank order, the session id a hash of the transcript. A rank's
   own randomness is part of its own transcript, so whatever the host replays to it, its
   session id -- and every link and purpose key derived from it -- is new: the host cannot
   pin a rank to an earlier session, and no (key, nonce) pair repeats across groups,
   processes or runs with a persistent secret unless SHA-256 collides.
2. *confirm*: ``HMAC(K, "confirm" || rank)`` with ``K = HKDF(secret, salt=transcript)``. A
   rank that verifies every peer's confirmation knows each of them holds the secret and
   saw the same hellos.
3. *verdict*: ``HMAC(K, "verified" || rank)``, or the reason this rank failed. A rank goes
   on only when every peer proves it verified too, so a failure any rank detects (an
   altered or missing contribution, a forged confirmation, another secret) stops every
   rank here with a one-line reason instead of at a later timeout.

What the host learns: the hellos (ranks, settings, random bytes) and MACs bound to this
run's transcript. Nothing is derived from the secret alone, so nothing links two runs;
a MAC still lets someone who *guesses* the secret check the guess, which is why
:class:`~ccddp.crypto.keys.GroupSecret` refuses guessable secrets.

Example::

    agreed = agree_session(secret, rank=0, world_size=1, exchange=lambda blob: [blob],
                           context={"world size": 1})
    len(agreed.session_id)      # 16, fresh every call
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass
from typing import Callable, Mapping

from ccddp.crypto.keys import SESSION_ID_BYTES, GroupSecret, _hkdf
from ccddp.crypto.wirejson import parse_json
from ccddp.errors import ConfigError, one_line

# v2: a small two-rank op's data travels in its descriptor's message, which a v1 rank's
# receive has no room for (gloo would abort it): ranks of the two versions stop here instead.
_MAGIC = b"ccddp-ses/v2"  # 12 bytes
_HELLO = struct.Struct(">12sI32s")  # magic, rank, contribution; the context JSON follows
_CONTRIBUTION_BYTES = 32
_MAC_BYTES = 32
_OK, _FAIL = b"\x00", b"\x01"
_LABEL = b"ccddp/v1/session/"
# A context names the group and its settings: ~60 KB of JSON at 10,000 ranks (the list of
# group ranks dominates), so 64 KiB, or twice this rank's own context if that is larger.
_MAX_CONTEXT_BYTES = 1 << 16
# {"group ranks": [...]} nests 2 deep; what is much deeper is not a context.
_MAX_CONTEXT_DEPTH = 8
# How much of a value an error message shows.
_SHOWN_CHARS = 120

Exchange = Callable[[bytes], "list[bytes]"]


@dataclass(frozen=True)
class Agreement:
    """What a confirmed setup yields: the session id keys are derived with, and the
    transcript hash it came from (every rank of the group holds the same two). The
    group's runtime session record is :class:`ccddp.comm.session.Session`, built from it."""

    session_id: bytes
    transcript: bytes


def agree_session(secret: GroupSecret | None, rank: int, world_size: int, exchange: Exchange, *,
                  context: Mapping[str, object]) -> Agreement:
    """Run the three-round setup (one round, the hello, without a secret: plaintext groups
    only check that they agree). Raises :class:`ConfigError` on every rank when ranks
    disagree or the exchange was altered.

    ``context`` is what every rank must agree on, keyed by the words an error should use
    (``{"world size": 4, "collective settings": ...}``); values must be JSON-serializable.
    """
    context_json = json.dumps(dict(context), sort_keys=True).encode()
    mine = _HELLO.pack(_MAGIC, rank, os.urandom(_CONTRIBUTION_BYTES)) + context_json
    hellos = [bytes(b) for b in exchange(mine)]
    problem = _check_hellos(rank, world_size, mine, context, hellos)
    transcript = hashlib.sha256(_LABEL + b"transcript" + struct.pack(">I", world_size)
                                + b"".join(struct.pack(">I", len(h)) + h for h in hellos)).digest()
    agreed = Agreement(hashlib.sha256(_LABEL + b"id" + transcript).digest()[:SESSION_ID_BYTES], transcript)
    if secret is None:
        if problem:
            raise ConfigError(problem)
        return agreed

    key = _hkdf(secret.value, transcript, _LABEL + b"confirm-key")

    def mac(what: bytes, who: int) -> bytes:
        return hmac.new(key, what + struct.pack(">I", who), hashlib.sha256).digest()

    # A rank that finds a problem still takes part in every round (sending its reason
    # instead of a proof), so its peers learn of it here rather than by a timeout.
    confirms = _round(exchange, problem, mac(b"confirm", rank))
    if problem is None:
        problem = _check_round(rank, world_size, confirms, lambda j: mac(b"confirm", j),
                               "confirmation does not verify: ranks disagree on key material (group secret), "
                               "or the setup exchange was altered")
    verdicts = _round(exchange, problem, mac(b"verified", rank))
    if problem is not None:
        raise ConfigError(problem)
    problem = _check_round(rank, world_size, verdicts, lambda j: mac(b"verified", j),
                           "verdict does not authenticate: the setup exchange was altered")
    if problem is not None:
        raise ConfigError(problem)
    return agreed


def _check_hellos(rank: int, world_size: int, mine: bytes, context: Mapping[str, object],
                  hellos: list[bytes]) -> str | None:
    """The first problem with the hellos as this rank received them, or None.

    A peer's context is bounded before it is parsed (see :data:`_MAX_CONTEXT_BYTES`), and
    every way it can be malformed is a problem to report, never an exception.
    """
    # An honest peer's context is this rank's own, byte for byte (the same code writes the
    # same values): a larger one cannot match. The floor leaves room for a peer whose
    # settings differ, so that the error can say how.
    max_context = max(_MAX_CONTEXT_BYTES, 2 * (len(mine) - _HELLO.size))
    if len(hellos) != world_size:
        return f"the setup exchange returned {len(hellos)} messages for {world_size} ranks"
    if hellos[rank] != mine:
        return f"rank {rank}'s own setup message came back altered: the setup exchange was tampered with"
    for j, blob in enumerate(hellos):
        if len(blob) < _HELLO.size or blob[:len(_MAGIC)] != _MAGIC:
            return f"rank {j}'s setup message has an unknown format (is every rank on this ccddp version?)"
        _, claimed, _ = _HELLO.unpack_from(blob)
        if claimed != j:
            return f"the setup message in rank {j}'s slot is rank {claimed}'s: messages were swapped or replayed"
        try:
            theirs = parse_json(blob[_HELLO.size:], what=f"rank {j}'s setup message", max_bytes=max_context,
                                max_depth=_MAX_CONTEXT_DEPTH)
        except ConfigError as e:
            return str(e)
        if not isinstance(theirs, dict):
            return f"rank {j}'s setup message is malformed (is every rank on this ccddp version?)"
        for what, value in context.items():
            if theirs.get(what) != json.loads(json.dumps(value)):
                return (f"ranks disagree on {what}: rank {j} has {_show(theirs.get(what))}, "
                        f"rank {rank} has {_show(value)}")
        if set(theirs) != set(context):
            return f"rank {j}'s setup message names other fields (is every rank on this ccddp version?)"
    return None


def _show(value: object) -> str:
    """``value`` (received JSON) as a short printable line for an error message."""
    text = one_line(value if isinstance(value, str) else json.dumps(value))
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _round(exchange: Exchange, problem: str | None, proof: bytes) -> list[bytes]:
    """Send ``proof``, or the reason this rank failed, and receive every rank's."""
    mine = _FAIL + one_line(problem).encode() if problem is not None else _OK + proof
    return [bytes(b) for b in exchange(mine)]


def _check_round(rank: int, world_size: int, replies: list[bytes], expected: Callable[[int], bytes],
                 bad: str) -> str | None:
    """The first failure a peer reports, or the first proof that does not verify (a
    missing one included)."""
    if len(replies) != world_size:
        return f"the setup exchange returned {len(replies)} messages for {world_size} ranks"
    for j, r in enumerate(replies):
        if j != rank and r[:1] == _FAIL:
            return f"session setup failed on rank {j} (as rank {j} reports): {one_line(r[1:].decode(errors='replace'))}"
    for j, r in enumerate(replies):
        if j != rank and not (r[:1] == _OK and len(r) == 1 + _MAC_BYTES
                              and hmac.compare_digest(r[1:], expected(j))):
            return f"rank {j}'s {bad} (seen at rank {rank})"
    return None
