"""A ccddp group's internal connection sets: bare gloo backends that nothing else knows of,
and, inside a trust domain, local links the host cannot reach.

- :func:`internal_links`: the group's three connection sets over all its ranks --
  collectives (one per link direction) and point-to-point messages -- which carry sealed
  frames only.
- :func:`device_wire`: where every rank has a GPU of its own, an internal NCCL communicator
  for the sealed device frames of the pipelined collectives (``CommSettings.device_wire``).
- :func:`prove_domains`: the trust-domain map as proven, not as reported: each rank
  reaches the ranks it may share a domain with over AF_UNIX sockets that cannot leave its
  machine and checks their answer under the session's key
  (:mod:`ccddp.backend.local_links`); the proofs are exchanged sealed, so every rank
  derives the same map.
- :func:`domain_links`: with trust domains larger than one rank, the plaintext set over
  the ranks of this rank's domain -- those proven AF_UNIX links, never a TCP connection
  whose destination the store chose -- and the sealed group of this rank's shard across
  domains. Each is an engine :class:`~ccddp.comm.endpoint.Endpoint` on a session of its
  own (:func:`~ccddp.comm.session.establish`): the domain's from a plaintext session, so
  it has no channels; the shard ring's keyed with the group's secret.

Every gloo set rendezvouses under keys of its group instance's own (:func:`group_store`), and
its setup is bounded by the group's timeout, even where the host's addresses leave both
ends of a connection waiting for the other (gloo itself has no limit there).

Example::

    coll, down, p2p = internal_links(store, rank, size, timedelta(seconds=60))
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.backend.local_links import LocalEndpoint, LocalLinkSet
from ccddp.comm.control import gather_sealed
from ccddp.comm.domains import DomainMap, candidates, check_setting, from_proofs, node_key
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.hierarchy import DomainLinks
from ccddp.comm.ordered import NcclWire
from ccddp.comm.session import establish
from ccddp.comm.settings import CommSettings
from ccddp.comm.transport import Transport
from ccddp.crypto.keys import derive_purpose_key
from ccddp.errors import ConfigError, PeerTimeoutError, one_line

# Seconds past the timeout before a gloo setup that has not returned is given up on.
_CONNECT_MARGIN_S = 2.0
# gloo's connect, left waiting by the host's addresses, ends by itself after about five
# times its timeout (measured on torch 2.13: 10 s at 2 s, 15 s at 3 s).
_GLOO_GIVES_UP = 6


def _attempt() -> str:
    """Which attempt of an elastic job this process belongs to ("0" outside torchelastic)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def group_store(store, rank: int) -> dist.PrefixStore:
    """Where one ccddp group's internal sets rendezvous: keys of this elastic attempt and of
    this group instance, never read by another.

    Keys an earlier group left in a store (its ranks' listening addresses, still answered
    while that group lives) would otherwise be read again: torchrun keeps its agent's store
    across the restarts of ``--max-restarts``, and torch keeps an ``env://`` store across
    ``destroy_process_group`` and ``init_process_group`` in one process (one server per
    port), where the new default group has the old one's name. Each rank counts the
    instances it made of a group under this store, so ranks that make the same groups
    agree; a host that changes the count only stops the group from connecting."""
    attempt = dist.PrefixStore(f"ccddp/attempt-{_attempt()}/", store)
    return dist.PrefixStore(f"instance-{attempt.add(f'instances/rank-{rank}', 1)}/", attempt)


def _connect(store, name: str, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    """One bare gloo connection set (it carries sealed frames only); a peer that cannot be
    reached within ``timeout`` is a typed error.

    gloo decides which end of a connection dials by comparing the two addresses the store
    holds; a host that writes addresses so that each end waits for the other leaves gloo's
    constructor waiting with no limit. It runs on a thread of its own, and this rank stops
    waiting for it at the timeout (the thread, blocked in gloo, ends with the process)."""
    made: dict = {}

    def connect() -> None:
        try:
            made["pg"] = dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, timeout)
        except RuntimeError as e:
            made["error"] = e

    worker = threading.Thread(target=connect, name=f"ccddp-connect-{name}", daemon=True)
    worker.start()
    # gloo's own waits (the store, a refused connection) end at ``timeout``; a margin lets
    # them report first, with their own reason.
    worker.join(timeout.total_seconds() + _CONNECT_MARGIN_S)
    if "pg" in made:
        return made["pg"]
    if worker.is_alive():
        _abandoned(worker, timeout)
    why = one_line(str(made["error"])) if "error" in made else "no connection was made: the addresses the store holds lead nowhere"
    raise PeerTimeoutError(f"rank {rank}: cannot connect the group's {name} links to its peers within "
                           f"{timeout.total_seconds():.0f}s ({why})")


_ABANDONED: list[tuple[threading.Thread, float]] = []


def _abandoned(worker: threading.Thread, timeout: timedelta) -> None:
    """Remember a gloo setup this rank stopped waiting for. gloo gives up by itself after
    a few times its timeout (its connect retries); if that happens while the interpreter
    is shutting down, the thread is killed inside C++ and the process aborts. So the exit
    waits for such threads, bounded: one that never returns never takes the GIL again and
    cannot abort anything."""
    if not _ABANDONED:
        atexit.register(_settle_abandoned)
    _ABANDONED.append((worker, time.monotonic() + _GLOO_GIVES_UP * timeout.total_seconds() + _CONNECT_MARGIN_S))


def _settle_abandoned() -> None:
    for worker, until in _ABANDONED:
        worker.join(max(0.0, until - time.monotonic()))


def internal_links(store, rank: int, size: int, timeout: timedelta) -> tuple[dist.ProcessGroup, ...]:
    """The group's three connection sets: collectives (one per link direction) and
    point-to-point messages (``store``: the group's, :func:`group_store`)."""
    return tuple(_connect(store, name, rank, size, timeout) for name in ("collectives", "collectives-down", "p2p"))


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

    The group gathers the reports sealed (``ProcessGroupCCDDP`` passes ``gather_sealed``
    as ``exchange``): every rank decides on the same, authentic reports.
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
    return NcclWire.open(dist.PrefixStore("nccl-wire/", store), rank, size, settings.timeout_s)


def prove_domains(group: Endpoint, setting=None) -> tuple[DomainMap, LocalEndpoint | None]:
    """The trust-domain map of ``group`` (collective: every rank calls it once the group's
    session is established) for ``setting`` (default: the group's ``trust_domains``), and this
    rank's local endpoint holding the proven links to its domain's ranks (None where every
    rank is its own domain).

    Each rank listens on its session-named AF_UNIX socket; once every rank listens (a
    sealed exchange, so the host cannot announce a rank early), it reaches the ranks it
    may share a domain with and runs the proof; then every rank's proofs and node key go
    round sealed and :func:`ccddp.comm.domains.from_proofs` turns them into the map, the
    same on every rank. An explicit map whose pairs did not all prove themselves is a
    :class:`ConfigError` on every rank; ``"node"`` splits what was not proven, warning."""
    setting = check_setting(group.settings.trust_domains if setting is None else setting)
    if setting == "rank" or group.world_size == 1:
        return DomainMap.singletons(group.world_size), None
    key = derive_purpose_key(group.secret, group.session_id, "local-link")
    endpoint = LocalEndpoint.listen(group.session_id, key, group.rank, group.settings.timeout_s)
    try:
        gather_sealed(b"listening", group)
        proven = endpoint.prove(candidates(setting, group.rank, group.world_size))
        mine = json.dumps({"proven": sorted(proven), "node": node_key()}).encode()
        reports = [_proof_report(r, blob, group.world_size) for r, blob in enumerate(gather_sealed(mine, group))]
        domains, warnings = from_proofs(setting, group.world_size, [p for p, _ in reports], [k for _, k in reports])
    except BaseException:
        endpoint.close()
        raise
    if group.rank == 0:
        for w in warnings:
            print(f"ccddp: trust domains: {w}", file=sys.stderr, flush=True)
    endpoint.drop(set(domains.members(group.rank)))
    if domains.trivial:
        endpoint.close()
        return domains, None
    return domains, endpoint


def _proof_report(rank: int, blob: bytes, world_size: int) -> tuple[set[int], str]:
    """A rank's sealed proof report: the ranks it proved, its node key (authenticated, so
    written by the rank itself; still checked, as every parsed message is)."""
    try:
        report = json.loads(blob.decode())
        proven = {int(r) for r in report["proven"] if isinstance(r, int) and 0 <= r < world_size}
        return proven, str(report["node"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"rank {rank}'s trust-domain proof report is malformed ({e})") from None


def domain_links(store, rank: int, domains: DomainMap, endpoint: LocalEndpoint, group: Endpoint,
                 global_ranks: list[int], timeout: timedelta) -> DomainLinks:
    """This rank's links for the hierarchical all-reduce (collective over the group: every
    rank builds its domain's set, then the shard holders their ring's). ``endpoint``
    holds the proven local links (:func:`prove_domains`); ``store``: the group's
    (:func:`group_store`)."""
    d, local = domains.domain_of(rank), domains.local_index(rank)
    members = domains.members(rank)
    links = LocalLinkSet(endpoint, list(members))
    # The engine's ring, unsealed (impl "ring"), on an endpoint without channels: a plaintext
    # session holds no keys, and these links are AF_UNIX sockets to ranks that proved they
    # share this machine. Its session still checks that the domain's ranks agree on the setup.
    local_wire = Transport(links, group.settings.timeout_s)
    plain = Endpoint(establish(local_wire, group.settings.with_(impl="ring", trust_domains="rank"), None,
                               ranks=[global_ranks[r] for r in members]), local_wire)
    cross = None
    if len(domains.domains) > 1 and local < domains.shards:
        leaders = domains.leaders(local)
        up, down = (_connect(store, f"shard-{local}-{name}", d, len(leaders), timeout) for name in ("up", "down"))
        # The group's secret (pre-shared, or the one the key exchange agreed): the shard
        # ring runs a session of its own, so its keys are its own.
        ring_wire = Transport(up, group.settings.timeout_s, downward=down)
        cross = Endpoint(establish(ring_wire, group.settings.with_(trust_domains="rank"), group.secret,
                                   ranks=[global_ranks[r] for r in leaders]), ring_wire)
    if len(domains.domains) == 1 and rank == 0:
        print("ccddp: every rank of this group is in one trust domain: its all-reduces, "
              "broadcasts and reduce-scatters are not sealed",
              file=sys.stderr, flush=True)
    return DomainLinks(domains, rank, plain, cross)


