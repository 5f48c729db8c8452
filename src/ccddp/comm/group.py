"""A secure group: the process group, its session, and what the engine's collectives run
on -- the session's link channels (:class:`~ccddp.comm.channels.LinkChannels`:
``group.channels.tx(peer)``), the frame arena, the collective sequence counter and the
crypto threads.

Creating one is collective: every rank contributes fresh randomness to a session whose id
hashes all contributions and the group's identity and settings, and the group confirms
under the key material that every rank holds the same secret and saw the same setup
before any key is used (:mod:`ccddp.crypto.session`; or the authenticated key exchange
of :mod:`ccddp.crypto.establish`). Ranks that disagree on world size, settings or key
material, or a host that altered the setup, fail every rank with a :class:`ConfigError`
that says what differs.

Example::

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    group = SecureGroup(CommSettings(impl="secure"), secret=GroupSecret.from_env(),
                        transport=Transport.open(None, 60))   # the links: made explicitly
    run_all_reduce(group, tensor.view(-1), Reduction.SUM)
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from ccddp.comm.channels import LinkChannels
from ccddp.comm.frames import FrameArena
from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.crypto.channel import NonceRecorder
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.engine import CryptoEngine
from ccddp.crypto.establish import EstablishedKeys, KeyEstablishment
from ccddp.crypto.keys import GroupSecret, derive_purpose_key, digest
from ccddp.crypto.session import agree_session
from ccddp.errors import ConfigError


class SecureGroup:
    """Everything a rank needs to run secure collectives on one process group."""

    def __init__(self, settings: CommSettings | None = None, secret: GroupSecret | None = None,
                 pg: dist.ProcessGroup | None = None, *, recorder: NonceRecorder | None = None,
                 transport: Transport | None = None, establishment: KeyEstablishment | None = None,
                 ranks: list[int] | None = None) -> None:
        if pg is None and not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first")
        self.settings = settings or CommSettings()
        if transport is None:
            # No link is made behind the caller's back: a ring needs one connection per
            # direction of each link (Transport.open makes them, explicitly).
            raise ConfigError(f"a SecureGroup with impl {self.settings.impl!r} needs its links: pass "
                              "transport=Transport.open(pg, settings.timeout_s)")
        # A registered group, or a bare gloo backend (the ccddp backend's internal links,
        # which then comes with its transport).
        self.pg = pg if pg is not None else transport.pg
        self.rank = self.pg.rank()
        self.world_size = self.pg.size()
        if self.settings.secure and secret is None and establishment is None:
            # CCDDP_IDENTITY selects the authenticated exchange; else the pre-shared secret.
            establishment = KeyEstablishment.from_env()
            if establishment is None:
                secret = GroupSecret.from_env()
        self.counters = CryptoCounters()
        # The setup's messages cross the transport too, where an adversary can reach them.
        self.transport = transport
        # What every rank must agree on: the group's identity and its settings. It is
        # hashed into the session id, so keys are bound to it.
        # ``ranks``: the global ranks of a bare gloo backend, which torch does not know.
        ranks = ranks if ranks is not None else dist.get_process_group_ranks(self.pg)
        # The trust-domain setting as asked for ("node", or the claimed map): which ranks
        # really share a domain is proven after the session exists (ccddp.backend.links).
        domains = self.settings.trust_domains
        context = {"world size": self.world_size, "group ranks": list(ranks),
                   "collective settings": self.settings.fingerprint(),
                   "trust domains": domains if isinstance(domains, str) else [list(d) for d in domains]}
        self.keys: EstablishedKeys | None = None
        if establishment is not None:
            if secret is not None:
                raise ConfigError("pass either a pre-shared secret or an establishment, not both")
            self.keys = establishment.run(self.rank, self.world_size, self.exchange_bytes,
                                          context=json.dumps(context, sort_keys=True).encode())
            secret, self.session_id = self.keys.group_secret, self.keys.session_id
        else:
            self.session_id = agree_session(secret if self.settings.secure else None, self.rank, self.world_size,
                                            self.exchange_bytes, context=context).session_id
        self.secret = secret
        self.seq = 0
        # The session's link channels (keys derived on first use of each link).
        self.channels = LinkChannels(self.rank, secret, self.session_id, keys=self.keys, counters=self.counters,
                                     recorder=recorder, options=self.settings.channel_options())
        # Frame memory per device: a collective's frames live where its tensor does.
        self._arenas: dict[torch.device, FrameArena] = {}
        self.arena = self.arena_for(torch.device("cpu"))
        # What every collective's descriptor carries of the settings; computed once.
        self.settings_digest = bytes.fromhex(digest(self.settings.fingerprint().encode()))[:16]
        # Keys the gloo tags of collectives' data (collectives.data_tag): the tag is seen
        # on the wire, and must not give away a hash of the descriptor it stands for.
        self.tag_key = derive_purpose_key(secret, self.session_id, "p2p-tag") if secret else b""
        chains = self.settings.resolved_chains()
        # One chain: crypto on the calling thread; no pool hand-offs to pay for.
        self.engine = CryptoEngine(chains) if self.settings.secure and chains > 1 else None

    @property
    def recorder(self) -> NonceRecorder | None:
        """What every nonce this group's channels use is reported to (tests); set it before
        the first collective to see them all."""
        return self.channels.recorder

    @recorder.setter
    def recorder(self, recorder: NonceRecorder | None) -> None:
        self.channels.recorder = recorder

    # -- establishment -------------------------------------------------------------
    def exchange_bytes(self, blob: bytes) -> list[bytes]:
        """Every rank's ``blob``, in plaintext, through this group's transport (the setup's
        messages)."""
        return self.transport.exchange(blob)

    # -- frames ----------------------------------------------------------------------
    def arena_for(self, device: torch.device) -> FrameArena:
        """The frame arena on ``device`` (made on first use)."""
        arena = self._arenas.get(device)
        if arena is None:
            arena = self._arenas[device] = FrameArena(device)
        return arena

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def close(self) -> None:
        """Stop the crypto threads and drop the buffers. The second connection set
        (``Transport.downward``) stays with torch.distributed until the process exits:
        gloo closes sockets abortively, so destroying it could reset a connection a peer
        is still reading its last frames from."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        for arena in self._arenas.values():
            arena.clear()
