"""Trust domains: which ranks of a group share a trust boundary.

Ranks inside one boundary (the CPU ranks of one confidential VM, the fenced GPUs of one
Hopper CC node) may exchange plaintext; only what crosses from one domain to another must
be sealed. The setting (``CommSettings.trust_domains``) is one of

- ``"rank"`` (default): every rank is its own domain: every link is sealed;
- ``"node"``: the ranks of one torchrun node (``GROUP_RANK``) on one host share a domain;
- an explicit map: a list of domains, each a list of group ranks, covering every rank once
  (``[[0, 1], [2, 3]]``; in ``CCDDP_SETTINGS`` as JSON).

:func:`resolve` turns the setting into a :class:`DomainMap`. Every rank must arrive at the
same map: it is bound into the group's session transcript, so ranks that disagree, or a
host that makes them disagree, fail the setup with a :class:`ConfigError` on every rank.
A map the host *can* make every rank agree on (by lying about where the ``node`` ranks
run) cannot leak: the plaintext links inside a domain are bound to the loopback interface
(:mod:`ccddp.backend.process_group`), so a "domain peer" on another machine is never
reached and the group fails to connect.

Example::

    m = DomainMap.of([[0, 1], [2, 3]], world_size=4)
    m.domain_of(2), m.local_index(3), m.shards      # (1, 1, 2)
    m.leaders(0)                                     # [0, 2]: shard 0's ring across domains
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable

from ccddp.errors import ConfigError

SETTINGS = ("rank", "node")


def check_setting(value) -> str | tuple[tuple[int, ...], ...]:
    """The setting in canonical form (a name, or a tuple of tuples of ranks); raises
    :class:`ConfigError` for anything else. An explicit map is a list (or tuple) of
    non-empty lists of integer ranks, each below 2**31: a string is not a list of its
    characters (``["01"]`` is refused, not read as ``[[0, 1]]``), and a bool or a float
    is not a rank. Coverage of the group is checked by :meth:`DomainMap.of`, which knows
    the group's size."""
    max_rank = 1 << 31          # ranks are C ints in torch
    if isinstance(value, str):
        if value not in SETTINGS:
            raise ConfigError(f"trust_domains must be one of {', '.join(SETTINGS)} or a list of rank lists, "
                              f"got {value[:40]!r}")
        return value
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"trust_domains must be one of {', '.join(SETTINGS)} or a non-empty list of rank lists "
                          f"such as [[0, 1], [2, 3]], got a {type(value).__name__}")
    domains = []
    for i, d in enumerate(value):
        if not isinstance(d, (list, tuple)) or not d:
            shown = repr(d)[:40] if isinstance(d, str) else f"a {type(d).__name__}"
            raise ConfigError(f"trust_domains: domain {i} must be a non-empty list of ranks, got {shown}")
        for r in d:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < max_rank:
                shown = f"a {type(r).__name__}" if not isinstance(r, int) or isinstance(r, bool) else \
                    ("a negative number" if r < 0 else "a number too large")
                raise ConfigError(f"trust_domains: domain {i} holds {shown}; ranks are integers from 0 to "
                                  f"{max_rank - 1}")
        domains.append(tuple(int(r) for r in d))
    return tuple(domains)


@dataclass(frozen=True)
class DomainMap:
    """A partition of the group's ranks into trust domains, each sorted, domains ordered
    by their lowest rank (so equal partitions compare equal)."""

    domains: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, domains, world_size: int) -> "DomainMap":
        """The map of ``domains`` (lists of group ranks), checked to cover ``0 .. world_size-1``
        exactly once."""
        parts = sorted((tuple(sorted(d)) for d in domains), key=lambda d: d[0] if d else -1)
        seen = [r for d in parts for r in d]
        if any(not d for d in parts) or sorted(seen) != list(range(world_size)):
            raise ConfigError(f"trust_domains {[list(d) for d in domains]} must cover ranks 0..{world_size - 1} "
                              "exactly once, with no empty domain")
        return cls(tuple(parts))

    @classmethod
    def singletons(cls, world_size: int) -> "DomainMap":
        return cls(tuple((r,) for r in range(world_size)))

    @property
    def trivial(self) -> bool:
        """Every rank its own domain: every link sealed (the flat schedules)."""
        return all(len(d) == 1 for d in self.domains)

    @property
    def shards(self) -> int:
        """Shards an all-reduce is cut into: the size of the smallest domain, so every
        domain has a rank for every shard."""
        return min(len(d) for d in self.domains)

    def domain_of(self, rank: int) -> int:
        return next(i for i, d in enumerate(self.domains) if rank in d)

    def local_index(self, rank: int) -> int:
        return self.domains[self.domain_of(rank)].index(rank)

    def members(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s domain."""
        return self.domains[self.domain_of(rank)]

    def leaders(self, shard: int) -> list[int]:
        """The rank holding ``shard`` in each domain: one sealed ring across domains."""
        return [d[shard] for d in self.domains]

    def as_lists(self) -> list[list[int]]:
        return [list(d) for d in self.domains]


def node_key() -> str:
    """What ``"node"`` groups ranks by: the host and torchrun's node rank (two agents on
    one host are two nodes)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def resolve(setting, rank: int, world_size: int, exchange: Callable[[bytes], "list[bytes]"]) -> DomainMap:
    """The map ``setting`` names for this group. ``"node"`` learns every rank's
    :func:`node_key` through ``exchange`` (plaintext, host-controlled: the session then
    checks that every rank derived the same map, and the loopback-bound domain links check
    that a domain's ranks really share a host)."""
    setting = check_setting(setting)
    if setting == "rank":
        return DomainMap.singletons(world_size)
    if setting == "node":
        keys = [b.decode(errors="replace") for b in exchange(node_key().encode())]
        groups: dict[str, list[int]] = {}
        for r, k in enumerate(keys):
            groups.setdefault(k, []).append(r)
        return DomainMap.of(list(groups.values()), world_size)
    return DomainMap.of(setting, world_size)
