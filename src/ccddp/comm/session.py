"""A group's session: what a rank knows after the group agreed on its keys, and the one
step that gets it there, :func:`establish`.

``establish(transport, settings, key_source)`` is collective (every rank of the
transport's group calls it with the same settings). Every rank contributes fresh
randomness to a session whose id hashes all contributions, the group's identity (world
size, member ranks) and its settings, so no two runs share a session id and every key
derived from it is bound to that context. Before any key is used the group confirms under
the key material that every rank holds the same secret and saw the same setup; ranks that
disagree on world size, settings or key material, or a host that altered the setup, fail
every rank with an error that says what differs (a :class:`ConfigError` on the pre-shared
and plaintext paths, an :class:`EstablishmentError` or :class:`AttestationError` from the
key exchange). Where the keys come from
is the ``key_source``:

- a :class:`~ccddp.crypto.keys.GroupSecret` (pre-shared): the three-round agreement of
  :func:`ccddp.crypto.session.agree_session`;
- a :class:`~ccddp.crypto.establish.KeyEstablishment`: the authenticated X25519 exchange
  (identity keys, and the attestation verifiers that plug in there), whose pairwise keys
  key the links and which agrees on a group secret for the purpose keys;
- None, for a plaintext setting (``impl="ring"``: the unsealed ring inside a trust domain)
  only: the ranks still check that they agree on the setup (one round), and the session
  holds no key material.

:func:`key_source_from_env` is the one place the environment is read for key material
(``CCDDP_IDENTITY``/``CCDDP_ATTESTATION_POLICY`` select the exchange, else
``CCDDP_GROUP_SECRET``); nothing else here reads it.

The :class:`Session` record is frozen: the runtime state that goes with it (links,
channels, frame arenas, the sequence counter) is the :class:`~ccddp.comm.endpoint.Endpoint`
built on it. The path of a sealed ``dist.all_reduce`` through both is in
:mod:`ccddp.comm.endpoint`.

Example::

    transport = Transport.open(None, settings.timeout_s)          # the links, made explicitly
    session = establish(transport, settings, key_source_from_env(settings))
    endpoint = Endpoint(session, transport)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Union

import torch.distributed as dist

from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.crypto.establish import EstablishedKeys, KeyEstablishment
from ccddp.crypto.keys import GroupSecret, derive_purpose_key, digest
from ccddp.crypto.session import agree_session
from ccddp.errors import ConfigError

#: Where a session's keys come from (see the module docstring).
KeySource = Union[GroupSecret, KeyEstablishment, None]


@dataclass(frozen=True, eq=False)
class Session:
    """One rank's view of an agreed session: the same on every rank of the group, except
    ``rank``. Compared by identity (every establishment is a new session); the key
    material is left out of ``repr``."""

    rank: int
    world_size: int
    #: The group's global ranks, in group-rank order (hashed into the session id).
    ranks: tuple[int, ...]
    settings: CommSettings
    #: Fresh every establishment: every link and purpose key is derived with it.
    session_id: bytes
    #: The group secret (pre-shared, or agreed by the key exchange); None: plaintext.
    secret: GroupSecret | None = field(repr=False)
    #: The key exchange's pairwise keys, where the session came from one.
    keys: EstablishedKeys | None = field(repr=False)
    #: Keys the gloo tags of collectives' data (``descriptors.data_tag``): a tag is seen on
    #: the wire and must not give away a hash of the descriptor it stands for. Empty when
    #: plaintext (no descriptors, data on tag 0).
    tag_key: bytes = field(repr=False)
    #: What every collective's descriptor carries of the settings; computed once.
    settings_digest: bytes = field(repr=False)

    @property
    def sealed(self) -> bool:
        """Whether this session holds key material (its endpoint has link channels)."""
        return self.secret is not None


def key_source_from_env(settings: CommSettings) -> KeySource:
    """The key material this process's environment names for ``settings``: None for a
    plaintext setting; else a :class:`KeyEstablishment` where ``CCDDP_IDENTITY`` or
    ``CCDDP_ATTESTATION_POLICY`` is set, else the pre-shared ``CCDDP_GROUP_SECRET``
    (a :class:`ConfigError` that says how to set one where there is none)."""
    if not settings.secure:
        return None
    establishment = KeyEstablishment.from_env()
    return establishment if establishment is not None else GroupSecret.from_env()


def establish(transport: Transport, settings: CommSettings, key_source: KeySource, *,
              ranks: list[int] | None = None) -> Session:
    """Agree on a new session with every rank of ``transport``'s group (collective; see the
    module docstring). The setup's messages cross ``transport`` in plaintext, where an
    adversary can reach them: nothing received is trusted before it is confirmed.

    ``ranks``: the group's global ranks, where torch does not know the group (a bare gloo
    backend: the ccddp backend's internal links); default: torch's record of it. A
    plaintext setting takes no key material: a ``key_source`` given with one is not used.
    """
    pg = transport.pg
    rank, world_size = pg.rank(), pg.size()
    ranks = list(ranks) if ranks is not None else dist.get_process_group_ranks(pg)
    # The trust-domain setting as asked for ("node", or the claimed map): which ranks
    # really share a domain is proven after the session exists (ccddp.backend.links).
    domains = settings.trust_domains
    # What every rank must agree on: the group's identity and its settings. It is hashed
    # into the session id, so keys are bound to it.
    context = {"world size": world_size, "group ranks": ranks,
               "collective settings": settings.fingerprint(),
               "trust domains": domains if isinstance(domains, str) else [list(d) for d in domains]}
    keys: EstablishedKeys | None = None
    secret: GroupSecret | None = None
    if not settings.secure:
        session_id = agree_session(None, rank, world_size, transport.exchange, context=context).session_id
    elif isinstance(key_source, KeyEstablishment):
        keys = key_source.run(rank, world_size, transport.exchange,
                              context=json.dumps(context, sort_keys=True).encode(), ranks=ranks)
        secret, session_id = keys.group_secret, keys.session_id
    elif isinstance(key_source, GroupSecret):
        secret = key_source
        session_id = agree_session(secret, rank, world_size, transport.exchange, context=context).session_id
    else:
        raise ConfigError(f"a session with impl {settings.impl!r} needs key material: pass a GroupSecret or a "
                          f"KeyEstablishment (key_source_from_env(settings) reads the environment), "
                          f"got {type(key_source).__name__}")
    return Session(
        rank=rank, world_size=world_size, ranks=tuple(ranks), settings=settings, session_id=session_id,
        secret=secret, keys=keys,
        tag_key=derive_purpose_key(secret, session_id, "p2p-tag") if secret is not None else b"",
        settings_digest=bytes.fromhex(digest(settings.fingerprint().encode()))[:16])
