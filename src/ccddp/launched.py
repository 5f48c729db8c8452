"""The job's size as the launch's command line says it, checked by every rank against the one
torchrun's rendezvous gave it.

torchrun's agents learn ``WORLD_SIZE`` and each rank's ``RANK`` from the rendezvous store,
which the host controls: on a multi-node launch a host that answers node 1's agent from a
store of its own can make that node a whole job of its own (``WORLD_SIZE`` = its ranks).
Its ranks hold the group's key material, so they would agree on a session among themselves
and train on that node's data alone while the job the user started waits for them. The
size the user asked for (``--nnodes N --nproc-per-node P``) reaches the ranks from the
launch itself, in ``CCDDP_WORLD_SIZE`` (the agent's environment is the launch's, not the
store's), and a rank placed in a job of another size stops before it makes a group.

Example::

    env[ENV_WORLD_SIZE] = "8"          # ccddp launch --nnodes 2 --nproc-per-node 4 ...
    check_world_size()                 # in each rank: WORLD_SIZE must be 8
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ccddp.errors import ConfigError

ENV_WORLD_SIZE = "CCDDP_WORLD_SIZE"


def check_world_size(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` if this rank's ``WORLD_SIZE`` is not the launch's
    ``CCDDP_WORLD_SIZE`` (nothing to check where the launch did not set it)."""
    environ = os.environ if environ is None else environ
    want = environ.get(ENV_WORLD_SIZE)
    got = environ.get("WORLD_SIZE")
    if want and got != want:
        raise ConfigError(f"rank {environ.get('RANK', '?')}: this launch has {want} ranks, but the rendezvous put "
                          f"this rank in a job of {got}: the rendezvous store (which the host serves) answered "
                          "another job; no group is made")
