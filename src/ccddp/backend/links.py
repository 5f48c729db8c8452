"""A ccddp group's internal connection sets: bare gloo backends that nothing else knows of.

- :func:`internal_links`: the group's three connection sets over all its ranks --
  collectives (one per link direction) and point-to-point messages -- which carry sealed
  frames only.
- :func:`device_wire`: where every rank has a GPU of its own, an internal NCCL communicator
  for the sealed device frames of the pipelined collectives (``CommSettings.device_wire``).
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
import socket
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.comm.domains import DomainMap
from ccddp.comm.group import SecureGroup
from ccddp.comm.hierarchy import DomainLinks
from ccddp.comm.ordered import NcclWire
from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.errors import ConfigError, PeerTimeoutError, one_line

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


def gpu_report(device: torch.device) -> bytes:
    """What this rank tells its peers for the choice of a device wire: whether it can run
    NCCL, and on which GPU (``device``, its first CUDA op's), by host and UUID."""
    if not (dist.is_nccl_available() and torch.cuda.is_available()):
        return b"no-nccl"
    props = torch.cuda.get_device_properties(device)
    gpu = getattr(props, "uuid", None) or getattr(props, "pci_bus_id", None) or f"{props.name}#{device.index}"
    return f"nccl {socket.gethostname()} {gpu}".encode()


def choose_device_wire(setting: str, reports: list[bytes]) -> str:
    """``nccl`` or ``gloo`` for a group whose ranks sent ``reports`` (:func:`gpu_report`),
    the same on every rank that got the same reports. ``nccl`` needs every rank able to
    run it on a GPU of its own (NCCL refuses two ranks on one device); asked for where that
    does not hold, it is a ConfigError that says which ranks share or lack one.

    The reports cross the host unauthenticated: a host that lies can only move sealed
    frames from one wire to the other, or make the ranks disagree, which fails at the
    first collective's descriptor check.
    """
    if setting == "gloo" or len(reports) < 2:
        return "gloo"
    lacking = [r for r, rep in enumerate(reports) if not rep.startswith(b"nccl ")]
    seen: dict[bytes, int] = {}
    shared = []
    for r, rep in enumerate(reports):
        if r not in lacking:
            if rep in seen:
                shared.append((seen[rep], r))
            seen.setdefault(rep, r)
    if not lacking and not shared:
        return "nccl"
    if setting == "nccl":
        why = (f"ranks {lacking} have no GPU or no NCCL" if lacking else
               "ranks " + ", ".join(f"{a} and {b}" for a, b in shared) + " share a GPU (NCCL refuses two ranks on one)")
        raise ConfigError(f"device_wire 'nccl' needs a GPU of its own on every rank: {why}; "
                          "use device_wire 'gloo' or 'auto'")
    return "gloo"


def device_wire(store, rank: int, size: int, settings: CommSettings,
                exchange: Callable[[bytes], list[bytes]], device: torch.device) -> NcclWire | None:
    """The group's NCCL wire, or None where gloo carries its device frames (collective:
    every rank of the group calls it, at its first op on CUDA tensors, on ``device``)."""
    if settings.device_wire == "gloo":
        return None
    if choose_device_wire(settings.device_wire, exchange(gpu_report(device))) != "nccl":
        return None
    return NcclWire.open(dist.PrefixStore("nccl-wire/", _base(store)), rank, size, settings.timeout_s)


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


