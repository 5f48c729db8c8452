"""A rank's endpoint of one session: what the engine's collectives run on.

An :class:`Endpoint` joins an agreed :class:`~ccddp.comm.session.Session` (keys, session
id, settings) to the runtime state that uses it:

- the wire: ``transport`` (:class:`~ccddp.comm.transport.Transport`, bare gloo connection
  sets, one per link direction; every byte the host sees passes there);
- the link channels: ``channels`` (:class:`~ccddp.comm.channels.LinkChannels`:
  ``channels.tx(peer)``/``rx(peer)``, one AES-256-GCM channel per link direction, each the
  only issuer of its key's nonces); a plaintext session (the unsealed ring inside a trust
  domain) has none, and asking for them is a :class:`ConfigError`;
- the frame arenas, one per device (:meth:`arena_for`): a collective's frames live where
  its tensor does;
- the collective sequence counter (:meth:`next_seq`), the host crypto threads
  (``engine``) and the crypto counters (``counters``).

The engine (``ccddp.comm.collectives``, ``pipeline``, ``exchange``, ...) reads only these
and the session's fields, mirrored read-only here (``rank``, ``world_size``, ``settings``,
``session_id``, ``tag_key``, ``settings_digest``, ``secret``).

The path of a sealed ``dist.all_reduce(t)`` on a ccddp group, from the backend to the wire:

1. ``backend.process_group.ProcessGroupCCDDP.allreduce`` is the ``ALL_REDUCE`` record of
   the op table (``backend.ops``, made a method by ``ops.method``): on the caller's thread
   it checks the tensor and stages it (``backend.calls.stage``) and queues the job; the
   group's endpoint (``pg.endpoint``) was made when the group was: the session by
   :func:`~ccddp.comm.session.establish`, then ``Endpoint(session, transport)``;
2. on the queue's thread the record's engine entry point (``ops._all_reduce``) calls
   ``comm.collectives.run_all_reduce(pg.endpoint, flat, reduction)``, then
   ``calls.write_back`` (with trust domains, ``comm.hierarchy.hierarchical_all_reduce``
   instead: the plain ring on the domain's endpoint, which has no channels, and this
   path on the shard ring's across domains). ``run_all_reduce`` numbers the collective
   (``endpoint.next_seq()``), posts a sealed descriptor to its neighbours and runs the
   ring's steps -- or a two-rank group's small all-reduce as one exchange
   (``plan.exchange_plan``) -- in ``comm.pipeline.run_pipelined``;
3. the pipeline takes its frames from ``endpoint.arena_for(device)`` and seals each
   (``_Pipeline.send_frame``) with ``endpoint.channels.tx(peer).seal_job``, the frame's
   context (session id, sequence number, step, segment) as AAD; received frames are
   opened on ``endpoint.channels.rx(peer)``;
4. ``endpoint.transport.isend``/``irecv`` put the sealed frames on the wire.

Example::

    session = establish(transport, settings, GroupSecret.from_env())
    endpoint = Endpoint(session, transport)
    run_all_reduce(endpoint, tensor.view(-1), Reduction.SUM)
    endpoint.close()
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ccddp.comm.channels import LinkChannels
from ccddp.comm.frames import FrameArena
from ccddp.comm.session import Session
from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.crypto.channel import NonceRecorder
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.engine import CryptoEngine
from ccddp.crypto.establish import EstablishedKeys
from ccddp.crypto.keys import GroupSecret
from ccddp.errors import ConfigError


class Endpoint:
    """This rank's runtime state for ``session`` on ``transport`` (see the module
    docstring). ``recorder``: what every nonce the channels use is reported to (tests)."""

    def __init__(self, session: Session, transport: Transport, *, recorder: NonceRecorder | None = None) -> None:
        pg = transport.pg
        if (pg.rank(), pg.size()) != (session.rank, session.world_size):
            raise ConfigError(f"this transport is rank {pg.rank()} of {pg.size()}, the session's rank "
                              f"{session.rank} of {session.world_size}: an endpoint needs the links its session "
                              "was established on")
        self.session = session
        # The wire; a test or the self-test may put an adversarial transport in its place.
        self.transport = transport
        self.counters = CryptoCounters()
        self._recorder = recorder
        # The session's link channels (keys derived on first use of each link); none for a
        # plaintext session, which holds no keys.
        self._channels = (LinkChannels(session.rank, session.secret, session.session_id, keys=session.keys,
                                       counters=self.counters, recorder=recorder,
                                       options=session.settings.channel_options())
                          if session.sealed else None)
        # Frame memory per device: a collective's frames live where its tensor does.
        self._arenas: dict[torch.device, FrameArena] = {}
        self.arena = self.arena_for(torch.device("cpu"))
        self.seq = 0
        chains = session.settings.resolved_chains()
        # One chain: crypto on the calling thread; no pool hand-offs to pay for.
        self.engine = CryptoEngine(chains) if session.sealed and chains > 1 else None

    # -- the session's fields (what the engine reads) ------------------------------------
    @property
    def pg(self) -> dist.ProcessGroup:
        """The process group the wire runs on (group ranks)."""
        return self.transport.pg

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def world_size(self) -> int:
        return self.session.world_size

    @property
    def settings(self) -> CommSettings:
        return self.session.settings

    @property
    def session_id(self) -> bytes:
        return self.session.session_id

    @property
    def secret(self) -> GroupSecret | None:
        return self.session.secret

    @property
    def keys(self) -> EstablishedKeys | None:
        return self.session.keys

    @property
    def tag_key(self) -> bytes:
        return self.session.tag_key

    @property
    def settings_digest(self) -> bytes:
        return self.session.settings_digest

    # -- channels ----------------------------------------------------------------------
    @property
    def channels(self) -> LinkChannels:
        """The session's link channels: ``channels.tx(peer).seal_job(...)``."""
        if self._channels is None:
            raise ConfigError(f"this endpoint's session is plaintext (impl {self.settings.impl!r}): it holds no "
                              "link keys to seal or open with")
        return self._channels

    @property
    def recorder(self) -> NonceRecorder | None:
        """What every nonce this endpoint's channels use is reported to (tests); set it
        before the first collective to see them all."""
        return self._recorder

    @recorder.setter
    def recorder(self, recorder: NonceRecorder | None) -> None:
        self._recorder = recorder
        if self._channels is not None:
            self._channels.recorder = recorder

    # -- frames and sequence -------------------------------------------------------------
    def arena_for(self, device: torch.device) -> FrameArena:
        """The frame arena on ``device`` (made on first use)."""
        arena = self._arenas.get(device)
        if arena is None:
            arena = self._arenas[device] = FrameArena(device)
        return arena

    def next_seq(self) -> int:
        """The number of the next collective (every rank counts alike: it is in the AAD)."""
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
