"""``SecureGroup``: the one-call convenience of :func:`~ccddp.comm.session.establish` and
:class:`~ccddp.comm.endpoint.Endpoint` on a process group's links, for scripts, tests and
benchmarks that call the engine directly. The backend makes the two steps explicitly
(``ccddp.backend.process_group``, ``ccddp.backend.links``); what each step does, and the
path of a sealed all-reduce through them, is in those two modules.

Creating one is collective (every rank of its process group calls it). Where neither a
secret nor an establishment is passed, a sealed setting's key material comes from the
environment (:func:`~ccddp.comm.session.key_source_from_env`).

Example::

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    group = SecureGroup(CommSettings(impl="secure"), secret=GroupSecret.from_env(),
                        transport=Transport.open(None, 60))   # the links: made explicitly
    run_all_reduce(group, tensor.view(-1), Reduction.SUM)
"""

from __future__ import annotations

import torch.distributed as dist

from ccddp.comm.endpoint import Endpoint
from ccddp.comm.session import establish, key_source_from_env
from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.crypto.channel import NonceRecorder
from ccddp.crypto.establish import KeyEstablishment
from ccddp.crypto.keys import GroupSecret
from ccddp.errors import ConfigError


class SecureGroup(Endpoint):
    """An :class:`Endpoint` on a session established here: ``establish(transport,
    settings, secret or establishment or the environment's, ranks=ranks)``, then
    ``Endpoint(session, transport, recorder=recorder)``. ``pg``, if given, is the group
    ``transport`` runs on."""

    def __init__(self, settings: CommSettings | None = None, secret: GroupSecret | None = None,
                 pg: dist.ProcessGroup | None = None, *, recorder: NonceRecorder | None = None,
                 transport: Transport | None = None, establishment: KeyEstablishment | None = None,
                 ranks: list[int] | None = None) -> None:
        if pg is None and not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first")
        settings = settings or CommSettings()
        if transport is None:
            # No link is made behind the caller's back: a ring needs one connection per
            # direction of each link (Transport.open makes them, explicitly).
            raise ConfigError(f"a SecureGroup with impl {settings.impl!r} needs its links: pass "
                              "transport=Transport.open(pg, settings.timeout_s)")
        if pg is not None and pg is not transport.pg:
            raise ConfigError("pg and transport.pg differ: a group's session and its collectives share one set of links")
        if secret is not None and establishment is not None:
            raise ConfigError("pass either a pre-shared secret or an establishment, not both")
        key_source = secret if secret is not None else establishment
        if key_source is None:
            key_source = key_source_from_env(settings)
        super().__init__(establish(transport, settings, key_source, ranks=ranks), transport, recorder=recorder)
