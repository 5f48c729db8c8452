"""Trust domains: which ranks of a group share a trust boundary.

Ranks inside one boundary (the CPU ranks of one confidential VM, the fenced GPUs of one
Hopper CC node) may exchange plaintext; only what crosses from one domain to another must
be sealed. The setting (``CommSettings.trust_domains``) is one of

- ``"rank"`` (default): every rank is its own domain: every link is sealed;
- ``"node"``: the ranks that prove they share a machine (and torchrun node, ``GROUP_RANK``)
  share a domain;
- an explicit map: a list of domains, each a list of group ranks, covering every rank once
  (``[[0, 1], [2, 3]]``; in ``CCDDP_SETTINGS`` as JSON).

Membership is proven, never reported: ranks share a domain only after each reached the
other over a link that cannot leave its machine and answered a challenge under the
session's key (:mod:`ccddp.backend.local_links`); :func:`from_proofs` turns the setting
and every rank's proofs (exchanged sealed, so every rank sees the same) into a
:class:`DomainMap`. The setting itself is bound into the session transcript, so ranks that
ask for different maps fail the setup with a :class:`ConfigError` on every rank. Nothing
the host relays -- host names, addresses, ranks -- can put two ranks in one domain.

Example::

    m = DomainMap.of([[0, 1], [2, 3]], world_size=4)
    m.domain_of(2), m.local_index(3), m.shards      # (1, 1, 2)
    m.leaders(0)                                     # [0, 2]: shard 0's ring across domains
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    """What ``"node"`` also splits by: torchrun's node rank (two agents on one machine are
    two nodes). Host-reported, so it can only split a proven domain, never join ranks."""
    return os.environ.get("GROUP_RANK", "0")


def candidates(setting, rank: int, world_size: int) -> list[int]:
    """The group ranks ``rank`` must prove it shares a machine with: every other rank for
    ``"node"``, its claimed domain's for an explicit map, none for ``"rank"``."""
    setting = check_setting(setting)
    if setting == "rank":
        return []
    if setting == "node":
        return [r for r in range(world_size) if r != rank]
    return [r for r in DomainMap.of(setting, world_size).members(rank) if r != rank]


def from_proofs(setting, world_size: int, proven: list[set[int]], keys: list[str]) -> tuple[DomainMap, list[str]]:
    """The map, from what every rank proved (``proven[r]``: the ranks ``r`` reached over a
    link that cannot leave its machine and that answered under the session key; see
    :mod:`ccddp.backend.local_links`) and its node key. Two ranks share a domain only if
    each proved the other. Returns the map and warnings.

    - explicit map: every pair of a claimed domain must have proven itself, else a
      :class:`ConfigError` on every rank naming the pairs that did not;
    - ``"node"``: ranks with one node key that proved each other; where proofs do not
      form cliques (a rank reached some of its node's ranks but not others), the ranks
      involved are split into domains of one (sealed), with a warning.

    Every rank computes the same result from the same (authenticated) reports.
    """
    setting = check_setting(setting)
    if setting == "rank":
        return DomainMap.singletons(world_size), []

    def mutual(a: int, b: int) -> bool:
        return b in proven[a] and a in proven[b]

    if setting != "node":
        claimed = DomainMap.of(setting, world_size)
        unproven = [(a, b) for d in claimed.domains for i, a in enumerate(d) for b in d[i + 1:] if not mutual(a, b)]
        if unproven:
            pairs = ", ".join(f"{a} and {b}" for a, b in unproven)
            raise ConfigError(f"trust_domains {claimed.as_lists()}: ranks {pairs} claim one trust domain but did not "
                              "prove they share a machine (a local link answered under the session key); "
                              "their links would carry plaintext, so the group is refused")
        return claimed, []
    domains, warnings, placed = [], [], set()
    for r in range(world_size):
        if r in placed:
            continue
        mates = [s for s in range(world_size) if s not in placed and keys[s] == keys[r] and (s == r or mutual(r, s))]
        if all(mutual(a, b) for i, a in enumerate(mates) for b in mates[i + 1:]):
            domains.append(mates)
            placed.update(mates)
        else:
            warnings.append(f"ranks {mates} proved only some of each other: each is its own trust domain")
            domains.extend([m] for m in mates)
            placed.update(mates)
    same_key = [r for r in range(world_size) if sum(keys[s] == keys[r] for s in range(world_size)) > 1]
    alone = [r for r in same_key if not any(len(d) > 1 and r in d for d in domains)]
    if alone:
        warnings.append(f"ranks {alone} report a node shared with other ranks but proved it with none: "
                        "their links are sealed")
    return DomainMap.of(domains, world_size), warnings
