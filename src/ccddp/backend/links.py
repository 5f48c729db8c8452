"""A ccddp group's internal connection sets: bare gloo backends that nothing else knows of.

- :func:`internal_links`: the group's three connection sets over all its ranks --
  collectives (one per link direction) and point-to-point messages -- which carry sealed
  frames only.
- :func:`domain_links`: with trust domains larger than one rank, a plaintext set over the
  ranks of this rank's domain, **bound to the loopback interface** (its traffic cannot
  leave the host, and a "domain peer" elsewhere is never reached: the group fails to
  connect instead), and the sealed group of this rank's shard across domains.

Every set rendezvouses under the elastic attempt's own keys in the group's store.

Example::

    coll, down, p2p = internal_links(store, rank, size, timedelta(seconds=60))
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch.distributed as dist

from ccddp.comm.domains import DomainMap
from ccddp.comm.group import SecureGroup
from ccddp.comm.hierarchy import DomainLinks
from ccddp.comm.transport import Transport
from ccddp.errors import PeerTimeoutError, one_line

LOOPBACK = "127.0.0.1"


def _attempt() -> str:
    """Which attempt of an elastic job this process belongs to ("0" outside torchelastic).

    torchrun keeps its agent's store across the restarts of ``--max-restarts``, so keys a
    failed attempt left there (its ranks' listening addresses) are still there for the
    next one; each attempt's internal links rendezvous under keys of their own."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _base(store) -> dist.PrefixStore:
    return dist.PrefixStore(f"ccddp/attempt-{_attempt()}/", store)


def _connect(store, name: str, rank: int, size: int, timeout: timedelta, *,
             loopback: bool = False) -> dist.ProcessGroup:
    """One bare gloo connection set; a peer that cannot be reached is a typed error."""
    try:
        if not loopback:
            return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, timeout)
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
        opts._timeout = timeout
        return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, opts)
    except RuntimeError as e:
        where = " on this host's loopback (are the ranks of this trust domain on one host?)" if loopback else ""
        raise PeerTimeoutError(f"rank {rank}: cannot connect the group's {name} links to its peers{where} within "
                               f"{timeout.total_seconds():.0f}s ({one_line(str(e))})") from None


def internal_links(store, rank: int, size: int, timeout: timedelta) -> tuple[dist.ProcessGroup, ...]:
    """The group's three connection sets: collectives (one per link direction) and
    point-to-point messages."""
    base = _base(store)
    return tuple(_connect(base, name, rank, size, timeout) for name in ("collectives", "collectives-down", "p2p"))


def domain_links(store, rank: int, domains: DomainMap, group: SecureGroup, global_ranks: list[int],
                 timeout: timedelta) -> DomainLinks:
    """This rank's links for the hierarchical all-reduce (collective over the group: every
    rank builds its domain's set, then the shard holders their ring's)."""
    base = _base(store)
    d, local = domains.domain_of(rank), domains.local_index(rank)
    members = domains.members(rank)
    up, down = (_connect(base, f"domain-{d}-{name}", local, len(members), timeout, loopback=True)
                for name in ("up", "down"))
    # The engine's ring, unsealed (impl "ring"): nothing to key, and these links reach
    # only this host's loopback.
    plain = SecureGroup(group.settings.with_(impl="ring", trust_domains="rank"), None, pg=up,
                        transport=Transport(up, group.settings.timeout_s, downward=down),
                        ranks=[global_ranks[r] for r in members])
    cross = None
    if len(domains.domains) > 1 and local < domains.shards:
        leaders = domains.leaders(local)
        up, down = (_connect(base, f"shard-{local}-{name}", d, len(leaders), timeout) for name in ("up", "down"))
        # The group's secret (pre-shared, or the one the key exchange agreed): the shard
        # ring runs a session of its own, so its keys are its own.
        cross = SecureGroup(group.settings.with_(trust_domains="rank"), group.secret, pg=up,
                            transport=Transport(up, group.settings.timeout_s, downward=down),
                            ranks=[global_ranks[r] for r in leaders])
    if len(domains.domains) == 1 and rank == 0:
        print("ccddp: every rank of this group is in one trust domain: its all-reduces, "
              "broadcasts and reduce-scatters are not sealed",
              file=sys.stderr, flush=True)
    return DomainLinks(domains, rank, plain, cross)


