"""Control messages between ranks: per-rank results, verdicts, records.

The host carries every byte between ranks, so a result one rank reports to another (a
wrong-element count, a self-test verdict, a training record with its loss) travels like
model data: sealed on the group's links and verified before it is read. Nothing is ever
unpickled: messages are bytes, or JSON parsed after authentication.

Example::

    group = SecureGroup(CommSettings(impl="secure"), transport=Transport.open(None, 60))   # an Endpoint
    counts = gather_json({"wrong": 0, "ms": 12.5}, group)   # one dict per rank, authenticated
    ok = all(c["wrong"] == 0 for c in counts)
"""

from __future__ import annotations

import json

from ccddp.comm.collectives import run_all_gather
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.transport import MAX_CONTROL_BYTES, exchange_bytes, gather_blobs
from ccddp.crypto.wirejson import parse_json
from ccddp.errors import ConfigError

# Records and verdicts nest a few levels; far deeper is not one of ccddp's messages.
_MAX_DEPTH = 64


def gather_sealed(blob: bytes, group: Endpoint) -> list[bytes]:
    """Every rank's ``blob``, in rank order, each sealed on the group's links (its length
    too) and verified on arrival: a forged or altered message raises
    :class:`~ccddp.errors.IntegrityError` instead of being returned.

    Collective: every rank of the group calls it, on the thread that runs the group's
    collectives. The group must be secure (``impl`` secure or secure-naive).
    """
    if not group.settings.secure:
        raise ConfigError(f"gather_sealed needs a secure group, not impl {group.settings.impl!r}")
    return _gather(blob, group)


def gather_json(obj, group: Endpoint) -> list:
    """Every rank's JSON-serializable ``obj``, in rank order.

    On a secure group the messages are sealed (:func:`gather_sealed`). On a plaintext group
    (``impl`` ring: a baseline whose collectives are plaintext anyway) they travel in
    plaintext. Either way they are parsed as JSON, never unpickled.
    """
    blob = json.dumps(obj, sort_keys=True).encode()
    blobs = _gather(blob, group) if group.settings.secure else exchange_bytes(blob, group.pg, group.settings.timeout_s)
    return parse_messages(blobs)


def parse_messages(blobs: list[bytes]) -> list:
    """The JSON value of each rank's control message, in rank order; a
    :class:`~ccddp.errors.ConfigError` naming the rank for any message that is not
    JSON as :func:`gather_json` writes it (too large, nested too deep, not UTF-8, ...).

    On a secure group every message was authenticated before it gets here (an altered
    one raised :class:`~ccddp.errors.IntegrityError` in :func:`gather_sealed`), so it was
    written by a peer that holds the group's keys; on a plaintext group the host may have
    written it. Either way nothing but a typed error comes out.

    Example::

        parse_messages([b'{"wrong": 0}', b'{"wrong": 2}'])   # [{"wrong": 0}, {"wrong": 2}]
    """
    # allow_nan: json.dumps writes a non-finite float (a diverged loss) as NaN/Infinity.
    return [parse_json(b, what=f"rank {r}'s control message", max_bytes=MAX_CONTROL_BYTES,
                       max_depth=_MAX_DEPTH, allow_nan=True) for r, b in enumerate(blobs)]


def _gather(blob: bytes, group: Endpoint) -> list[bytes]:
    # gather_blobs hands over flat CPU tensors of one dtype, the output world_size times the
    # input: the engine's checked input.
    return gather_blobs(blob, group.world_size, lambda out, inp: run_all_gather(group, out, inp))
