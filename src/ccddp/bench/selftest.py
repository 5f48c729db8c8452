"""``ccddp selftest``: run every attack of the adversarial link against real secure
collectives and against the setup of a secure group on this machine's ranks, and say
whether each one was caught.

For each (attack, collective) case every rank builds a fresh :class:`SecureGroup` on an
:class:`~ccddp.testing.adversary.AdversarialTransport` and runs three windows:

0. a clean all-reduce (frames of several ring steps, and frames of the other links, for
   splices to draw on),
1. the collective, clean (the reference: which frame the attack will hit, its size and
   the label the receiver gives it),
2. the same collective with one rule on link ``0 -> 1``: the receiver must raise
   :class:`~ccddp.errors.IntegrityError` at exactly the tampered frame (the error's
   :class:`~ccddp.errors.FrameLabel` equals the one the receiver waited on it with), no
   rank may return a wrong result, and every rank must stop (the one that detects
   releases the others).

``delay`` must *not* be caught (authentication says nothing about timing): the result is
correct, just late. ``stall`` (a frame held past the timeout) must end in
:class:`~ccddp.errors.PeerTimeoutError` within the timeout.

The ``setup`` cases attack the messages that set a group up (each rank's fresh
contribution, the key confirmations): in window 2 a new group is created while the host
flips, swaps, replays (from an earlier group's setup), drops or reorders what rank 1
receives of rank 0's message. Every rank must refuse the setup with a one-line
``ConfigError`` (``EstablishmentError`` with identity keys) before any key is used: no
frame of that group is sealed or opened.

The ``attestation`` cases attack attested setup (:func:`run_attestation_case`): after a
group forms on SEV-SNP evidence from a TEST chain (:mod:`ccddp.testing.snp_chain`, trusted
by these verifiers alone, by pins passed in code), rank 1 replays its evidence of that
group, presents rank 0's evidence of the new one, or evidence of a launch image the policy
does not list; every rank must raise ``AttestationError`` naming rank 1 and the claim.

What decides a row -- the frame sizes and labels a plan is made from, and every rank's
outcome -- travels sealed on a clean secure group of its own (``gather_json``), so the
host cannot turn a failure into a pass: an altered report fails authentication.

Run it under torchrun (``python -m ccddp.bench.selftest --json rows.json``) or through
``ccddp selftest --world-size N``, which launches the ranks and prints the table.

Example::

    $ ccddp selftest --world-size 2
    attack  collective  world  expected                                            observed  passed
    flip    all_reduce  2      IntegrityError at rank 1: 0->1 all_reduce#3 step 0  (same)    yes
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Protocol

from ccddp.startup import pause_collector

pause_collector(__name__)  # run as a rank: the imports below without the cycle collector (ccddp.startup)
import torch
import torch.distributed as dist

from ccddp.backend.links import domain_links, prove_domains
from ccddp.bench.options import trust_domains_setting
from ccddp.bench.reference import all_gather, all_reduce, broadcast, reduce_scatter
from ccddp.bench.worker import init_from_env, run_worker
from ccddp.comm import CommSettings, SecureGroup
from ccddp.comm.collectives import run_all_reduce
from ccddp.comm.control import gather_json
from ccddp.comm.domains import DomainMap
from ccddp.comm.hierarchy import DomainLinks, hierarchical_all_reduce, hierarchical_broadcast, hierarchical_reduce_scatter
from ccddp.comm.reduce import Reduction
from ccddp.comm.transport import Transport
from ccddp.crypto.establish import EstablishmentError, KeyEstablishment
from ccddp.crypto.keys import GroupSecret
from ccddp.bench.selftest_options import (ATTESTATION_ATTACKS, COLLECTIVES, DATA_ATTACKS, FAULTS, HIERARCHICAL,
                                          SETUP_ATTACKS, build_parser, cases, check_lists, parse_lists,
                                          plaintext_links)
from ccddp.errors import CCDDPError, ConfigError, FrameLabel, IntegrityError, PeerTimeoutError
from ccddp.testing.adversary import (AbandonedWait, AbortSignal, AdversarialTransport, AdversaryError, Rule,
                                     SetupRule)

SCHEMA = "ccddp.selftest/1"
# Elements per rank chunk: with 1 KiB segments every data frame is 1 KiB + tag, so frames
# of different steps, collectives and links can be spliced into each other.
_CHUNK = 1024
_SEGMENT = 1024
_DELAY_S = 0.3
_TAG_BASE = 1000


def _pattern(numel: int, rank: int) -> torch.Tensor:
    # Small integers: exact in float32 in any summation order.
    return ((torch.arange(numel) % 7) + rank + 1).to(torch.float32)


def _ar_expect(numel: int, n: int) -> torch.Tensor:
    return ((torch.arange(numel) % 7) * n + n * (n + 1) // 2).to(torch.float32)


# -- what a case runs ------------------------------------------------------------------

class Case(Protocol):
    """What one case attacks: ``run()`` runs it once and returns whether the result is
    exactly right; ``transport`` is where the attack goes; ``close()`` frees it."""

    transport: AdversarialTransport
    warm_up_runs: int   # runs in window 0 too (its first runs differ from later ones)

    def run(self) -> bool: ...

    def close(self) -> None: ...


class CollectiveCase:
    """One secure collective of ``_CHUNK`` elements per rank on the case's group
    (``ring``: an all-reduce on the ring even where two ranks would exchange -- the
    warm-up, whose frames of two steps are what splice-step takes from)."""

    warm_up_runs = 0

    def __init__(self, collective: str, g: SecureGroup, tr: AdversarialTransport, ring: bool = False) -> None:
        if collective not in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
            raise ConfigError(f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}")
        self.collective, self.g, self.transport, self.ring = collective, g, tr, ring

    def run(self) -> bool:
        g, c = self.g, self.collective
        n, r = g.world_size, g.rank
        if c == "all_reduce" and self.ring:
            x = _pattern(n * _CHUNK, r)
            run_all_reduce(g, x, Reduction.SUM, exchange=False)
            return torch.equal(x, _ar_expect(n * _CHUNK, n))
        if c == "all_reduce":
            x = _pattern(n * _CHUNK, r)
            return torch.equal(all_reduce(x, g), _ar_expect(n * _CHUNK, n))
        if c == "reduce_scatter":
            out = torch.empty(_CHUNK)
            reduce_scatter(out, _pattern(n * _CHUNK, r), g)
            return torch.equal(out, _ar_expect(n * _CHUNK, n)[r * _CHUNK:(r + 1) * _CHUNK])
        if c == "all_gather":
            out = torch.empty(n * _CHUNK)
            all_gather(out, _pattern(_CHUNK, r), g)
            return torch.equal(out, torch.cat([_pattern(_CHUNK, k) for k in range(n)]))
        return torch.equal(broadcast(_pattern(_CHUNK, r), 0, g), _pattern(_CHUNK, 0))

    def close(self) -> None:
        pass



class HierarchicalCase:
    """All-reduce, reduce-scatter or broadcast over trust domains, the ccddp backend's own
    schedules (:mod:`ccddp.comm.hierarchy`): plaintext inside each domain, sealed on the
    shard rings across domains, where the adversary sits (``transport``: this rank's
    shard ring, or its domain's links if it holds no shard)."""

    warm_up_runs = 0

    def __init__(self, collective: str, links: DomainLinks, transport: AdversarialTransport) -> None:
        if collective not in HIERARCHICAL:
            raise ConfigError(f"{collective} does not follow the trust domains; choose from {', '.join(HIERARCHICAL)}")
        self.collective, self.links, self.transport = collective, links, transport

    def run(self) -> bool:
        links, c = self.links, self.collective
        n, r = links.world_size, links.rank
        if c == "all_reduce":
            x = _pattern(n * _CHUNK, r)
            hierarchical_all_reduce(links, x, Reduction.SUM)
            return torch.equal(x, _ar_expect(n * _CHUNK, n))
        if c == "reduce_scatter":
            out = torch.empty(_CHUNK)
            hierarchical_reduce_scatter(links, out, _pattern(n * _CHUNK, r), Reduction.SUM)
            return torch.equal(out, _ar_expect(n * _CHUNK, n)[r * _CHUNK:(r + 1) * _CHUNK])
        x = _pattern(_CHUNK, r)
        hierarchical_broadcast(links, x, 0)
        return torch.equal(x, _pattern(_CHUNK, 0))

    def close(self) -> None:
        for group in (self.links.local, self.links.cross):
            if group is not None:
                group.close()



class DDPStepCase:
    """Training steps of a small model under ``SecureDDP`` (cc="on"); the adversary sits on
    the gradient all-reduce. Correct means every parameter equals what plain SGD on the
    average of all ranks' gradients gives, which each rank computes locally from the other
    ranks' (deterministic) batches. Construction (secure broadcast), iteration 0 (one
    bucket) and iteration 1 (DDP broadcasts its rebuilt bucket layout, on the same group as
    the gradients) differ from every later step, so the first two steps are a warm-up:
    the attacked step then carries the same frames as the clean one before it."""

    warm_up_runs = 2

    def __init__(self, g: SecureGroup, tr: AdversarialTransport) -> None:
        from ccddp.bench.ddp import SecureDDP

        self.n, self.rank = g.world_size, g.rank
        torch.manual_seed(0)
        self.module = self._make()
        self.reference = [p.detach().clone() for p in self.module.parameters()]
        self.model = SecureDDP(self.module, cc="on", settings=g.settings, secret=g.secret, bucket_cap_mb=0.001)
        model_group = self.model.hook_state.group
        # Same abort flag and tag as the case's transport, on the model's group's links.
        self.transport = AdversarialTransport(model_group.pg, g.settings.timeout_s, tag=tr.tag, abort=tr.abort)
        model_group.transport = self.transport
        # Two ranks' gradient buckets are exchanges (one step): a ring all-reduce on the
        # same links gives splice-step frames of another step to take from.
        run_all_reduce(model_group, _pattern(self.n * _CHUNK, self.rank), Reduction.SUM, exchange=False)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.step = 0

    @staticmethod
    def _make() -> torch.nn.Module:
        # Two layers of unequal size, so DDP makes more than one bucket after iteration 0.
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))

    @staticmethod
    def _batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 * i + rank)
        return torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)

    def run(self) -> bool:
        i, self.step = self.step, self.step + 1
        x, y = self._batch(self.rank, i)
        self.opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(self.model(x), y).backward()
        except RuntimeError:
            # DDP re-raises a failed hook future as RuntimeError; SecureDDP kept the typed one.
            failure = self.model.comm_failure()
            if isinstance(failure, CCDDPError):
                raise failure from None
            raise
        self.opt.step()
        # The same step in plain PyTorch, one rank's batch at a time.
        ref = self._make()
        with torch.no_grad():
            for p, v in zip(ref.parameters(), self.reference):
                p.copy_(v)
        grads = [torch.zeros_like(v) for v in self.reference]
        for k in range(self.n):
            ref.zero_grad()
            xk, yk = self._batch(k, i)
            torch.nn.functional.mse_loss(ref(xk), yk).backward()
            for acc, p in zip(grads, ref.parameters()):
                acc += p.grad / self.n
        ok = True
        for v, gk, p in zip(self.reference, grads, self.module.parameters()):
            v -= 0.1 * gk
            ok = ok and torch.allclose(p.detach(), v, rtol=1e-4, atol=1e-6)
        return ok

    def close(self) -> None:
        self.model.close()


class SetupCase:
    """A new secure group on the case's transport, then one all-reduce on it. Under a
    setup attack the group must never come into being: ``keys_used`` counts the frames
    its keys sealed or opened, which must stay 0."""

    warm_up_runs = 0

    def __init__(self, g: SecureGroup, tr: AdversarialTransport, secret: GroupSecret | None) -> None:
        self.settings, self.pg, self.secret, self.transport = g.settings, g.pg, secret, tr
        self.keys_used = 0

    def _count(self, key_hash: bytes, nonce: bytes) -> None:
        self.keys_used += 1

    def run(self) -> bool:
        self.keys_used = 0
        g = SecureGroup(self.settings, self.secret, self.pg, transport=self.transport, recorder=self._count)
        try:
            return CollectiveCase("all_reduce", g, self.transport).run()
        finally:
            g.close()

    def close(self) -> None:
        pass


def make_case(collective: str, g: SecureGroup, tr: AdversarialTransport, secret: GroupSecret | None) -> Case:
    if collective == "ddp_step":
        return DDPStepCase(g, tr)
    if collective == "setup":
        return SetupCase(g, tr, secret)
    return CollectiveCase(collective, g, tr)


# -- where a case strikes ------------------------------------------------------------------

class Expect(Enum):
    """What a case must end in."""

    INTEGRITY = "IntegrityError at the tampered frame, raised by its receiver"
    INTEGRITY_OR_TIMEOUT = "the tampered frame is the link's last: IntegrityError or a timeout"
    CORRECT = "a correct result (not an attack on integrity)"
    TIMEOUT = "PeerTimeoutError within the timeout"
    REFUSED = "the setup refused on every rank before any key is used"


@dataclass(frozen=True)
class Plan:
    """Where a case strikes, chosen identically on every rank from window 1's frames."""

    rule: Rule | SetupRule
    target: int             # the frame index on the link (data), or the setup's exchange
    expect: Expect
    timeout_s: float
    note: str = ""


def resolve(expect: Expect, receiver: dict) -> Expect:
    """The expectation a row is judged by, given what the receiver observed: a held or
    dropped *last* frame leaves the receiver either the next collective's first frame in
    its place (a tag failure) or nothing (a timeout); both stop the run."""
    if expect is Expect.INTEGRITY_OR_TIMEOUT:
        return Expect.INTEGRITY if receiver["status"] == "error" and receiver["integrity"] else Expect.TIMEOUT
    return expect


def _kind(label: FrameLabel) -> str:
    """``"all_reduce"`` of ``"all_reduce#3"``; ``"descriptor"`` for a descriptor frame."""
    return label.collective.partition("#")[0]


def _plan(attack: str, n: int, src: int, dst: int, sizes: list[list[int]], labels: list[dict[int, FrameLabel]],
          timeout_s: float, short_timeout_s: float) -> Plan:
    """``sizes[w]``: frame sizes sent on ``src -> dst`` in window ``w``; ``labels[w]``: the
    receiver's label of each of those frames."""
    s1 = sizes[1]
    lab1 = [labels[1].get(i) for i in range(len(s1))]
    data = [i for i in range(len(s1)) if lab1[i] is not None and _kind(lab1[i]) != "descriptor"]
    if not data:
        raise AdversaryError(f"link {src}->{dst} carries no data frame in this collective")
    paired = [i for i in data if i + 1 < len(s1) and s1[i + 1] == s1[i]]
    # A frame in the middle of the window's last collective (in a DDP step, the last
    # bucket, so other buckets of the same step precede it): frames before it must pass,
    # and with n > 2 it sits in a later ring step or in the all-gather phase.
    last = [i for i in paired if lab1[i].collective == lab1[data[-1]].collective] or paired
    target = last[max(1, len(last) // 2)] if len(last) > 1 else (last[0] if last else data[0])
    size = s1[target]
    tlabel = lab1[target]
    if attack in ("flip", "truncate"):
        return Plan(Rule(attack, src, dst, target), target, Expect.INTEGRITY, timeout_s)
    if attack == "drop":
        # Every later frame of the collective moves up one receive slot; gloo aborts the
        # receiving process if one is larger than its slot, so pick a frame after which
        # sizes never grow.
        coll = [lab.collective if lab else None for lab in lab1]

        def shift_safe(t: int) -> bool:
            rest = [i for i in range(t, len(s1)) if coll[i] == coll[t]]
            return len(rest) > 1 and s1[t + 1] == s1[t] and all(s1[i + 1] <= s1[i] for i in rest[:-1])

        good = [t for t in data if shift_safe(t)]
        if good:
            t = next((t for t in good if t >= target), good[-1])
            return Plan(Rule("drop", src, dst, t), t, Expect.INTEGRITY, timeout_s)
        safe = [t for t in data if all(s1[i + 1] <= s1[i] for i in range(t, len(s1) - 1))]
        if safe:
            # The receiver's next receive gets the next collective's first frame, or nothing.
            return Plan(Rule("drop", src, dst, safe[-1]), safe[-1], Expect.INTEGRITY_OR_TIMEOUT, short_timeout_s,
                        "the last frame: no frame follows it")
        raise AdversaryError(f"drop: every frame on link {src}->{dst} is followed by a larger one")
    if attack == "reorder":
        if target + 1 < len(s1) and s1[target + 1] == size:
            return Plan(Rule(attack, src, dst, target), target, Expect.INTEGRITY, timeout_s)
        # No frame of the same size follows: what the receiver sees is a silent link.
        return Plan(Rule(attack, src, dst, target), target, Expect.INTEGRITY_OR_TIMEOUT, short_timeout_s,
                    "no same-size frame follows on the link")
    if attack == "delay":
        return Plan(Rule("delay", src, dst, target, seconds=_DELAY_S), target, Expect.CORRECT, timeout_s)
    if attack == "stall":
        return Plan(Rule("delay", src, dst, target, seconds=short_timeout_s + 1.5), target, Expect.TIMEOUT,
                    short_timeout_s)
    # The sender's history, in order: windows 0 and 1, then window 2 up to the target.
    history = [(0, i) for i in range(len(sizes[0]))] + [(1, i) for i in range(len(s1))] + \
              [(2, i) for i in range(target)]

    def size_of(w: int, i: int) -> int:
        return sizes[min(w, 1)][i]

    def label_of(w: int, i: int) -> FrameLabel | None:
        return labels[min(w, 1)].get(i)

    if attack == "replay":
        for back, (w, i) in enumerate(reversed(history), start=1):
            if size_of(w, i) == size:
                return Plan(Rule("replay", src, dst, target, back=back), target, Expect.INTEGRITY, timeout_s)
    elif attack == "splice-step":
        for w, i in reversed(history):
            lab = label_of(w, i)
            if size_of(w, i) == size and lab and _kind(lab) != "descriptor" and lab.step != tlabel.step:
                return Plan(Rule("splice", src, dst, target, from_window=w, from_index=i), target,
                            Expect.INTEGRITY, timeout_s, f"from step {lab.step}")
    elif attack == "splice-bucket":
        for w, i in reversed(history):
            lab = label_of(w, i)
            # Another collective of the same kind in the same iteration is another bucket.
            if (w == 2 and size_of(w, i) == size and lab and lab.collective != tlabel.collective
                    and _kind(lab) == _kind(tlabel)):
                return Plan(Rule("splice", src, dst, target, from_window=2, from_index=i), target,
                            Expect.INTEGRITY, timeout_s)
        return Plan(Rule("splice", src, dst, target, from_window=1, from_index=target), target, Expect.INTEGRITY,
                    timeout_s, "same frame of the previous collective")
    elif attack == "splice-link":
        return Plan(Rule("splice", src, dst, target, from_link=(src - 1) % n), target, Expect.INTEGRITY, timeout_s,
                    f"from link {(src - 1) % n}->{src}")
    else:
        raise ConfigError(f"unknown attack {attack!r}; choose from {', '.join(DATA_ATTACKS)}")
    raise AdversaryError(f"{attack}: no earlier {size}-byte frame to use on link {src}->{dst}")


def _setup_plan(attack: str, src: int, dst: int, timeout_s: float) -> Plan:
    nth = SETUP_ATTACKS[attack]
    # A flip must change what ``dst`` checks, not a field meant for another rank: after the
    # status byte, a confirmation is one 32-byte MAC (pre-shared secret) or a 16-byte tag
    # per rank (identity keys); byte 1 + 16 * dst lies in the part ``dst`` checks in both.
    byte = 1 + 16 * dst if attack == "flip" else None
    return Plan(SetupRule(attack, src, dst, nth, byte=byte), nth, Expect.REFUSED, timeout_s,
                "contribution" if nth == 0 else "key confirmation")


# -- one case ----------------------------------------------------------------------------

def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def _attempt(case: Case, rank: int, abort: AbortSignal) -> dict:
    t0 = time.monotonic()
    try:
        correct = bool(case.run())
        return {"status": "ok", "correct": correct, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - every failure is an outcome to report, typed
        abort.set(f"rank {rank} stopped ({type(e).__name__})")
        label = getattr(e, "label", None)
        return {"status": "error", "type": type(e).__name__, "message": _one_line(e), "one_line": "\n" not in str(e),
                "integrity": isinstance(e, IntegrityError), "timeout": isinstance(e, PeerTimeoutError),
                "refused": isinstance(e, (ConfigError, EstablishmentError)) and not isinstance(e, AdversaryError),
                "typed": isinstance(e, CCDDPError), "abandoned": isinstance(e, AbandonedWait),
                "claim": getattr(e, "claim", None),
                "seconds": time.monotonic() - t0, "error_label": label.as_dict() if label is not None else None}


def _labels_of(table: dict) -> dict[str, dict]:
    return {str(i): label.as_dict() for i, label in table.items()}


def _labels_from(table: dict[str, dict]) -> dict[int, FrameLabel]:
    return {int(i): FrameLabel(**d) for i, d in table.items()}


@dataclass(frozen=True)
class AttackedLink:
    """The directed link a case attacks: ``src -> dst`` in the group's ranks (their
    outcomes decide the row), ``ring_src -> ring_dst`` in the ranks of the ring that
    carries it (``ring_size`` ranks), and, across trust domains, where that ring runs."""

    src: int
    dst: int
    ring_src: int
    ring_dst: int
    ring_size: int
    where: str = ""

    @classmethod
    def flat(cls, n: int, under_domains: bool = False) -> "AttackedLink":
        """Link 0 -> 1 of the flat sealed ring (under trust domains too: the collectives
        that do not follow the map seal every link)."""
        return cls(0, 1, 0, 1, n, "does not follow the trust domains: every link sealed" if under_domains else "")

    @classmethod
    def across(cls, m: DomainMap) -> "AttackedLink":
        """Shard 0's sealed ring, from domain 0's holder to domain 1's: ring ranks are
        domain indices (:func:`ccddp.backend.links.domain_links`)."""
        src, dst = m.leaders(0)[:2]
        return cls(src, dst, 0, 1, len(m.domains),
                   f"shard 0's sealed ring across domains: rank {src} (domain 0) -> rank {dst} (domain 1)")


def _case_links(run: "SelftestRun", case_no: int, g: SecureGroup, tag: int, abort: AbortSignal) -> DomainLinks:
    """The backend's links over ``run.domains`` for one case (rendezvoused under keys of
    the case's own), every set on an adversarial transport that shares the case's abort
    signal: the shard ring's so the adversary can reach it, the domain's so a rank
    waiting inside its domain is released when a peer stops."""
    store = dist.PrefixStore(f"ccddp/selftest/{run.report.session_id.hex()}/case-{case_no}/",
                             dist.distributed_c10d._get_default_store())
    # The case's own proof of the map (on the case's links, before the attack is armed).
    proven, endpoint = prove_domains(g, run.domains.as_lists())
    if proven != run.domains:
        raise ConfigError(f"the case's ranks proved trust domains {proven.as_lists()}, not {run.domains.as_lists()}")
    links = domain_links(store, dist.get_rank(), proven, endpoint, g, list(range(dist.get_world_size())),
                         timedelta(seconds=run.base.timeout_s + 5))
    for group in (links.local, links.cross):
        if group is not None:
            # Swapped in after the group's setup: the adversary acts on data frames here.
            group.transport = AdversarialTransport(group.pg, run.base.timeout_s, tag=tag, abort=abort)
            run.transports.append(group.transport)
    return links


@dataclass
class SelftestRun:
    """What the cases of one selftest share."""

    secret: GroupSecret | None
    base: CommSettings
    short_timeout_s: float
    report: SecureGroup         # clean and secure: every verdict-deciding message crosses it
    domains: DomainMap | None = None    # trust domains (at least two) the hierarchical cases run over
    setup_history: list = field(default_factory=list)       # every setup each rank received
    attest_chain: object = None   # the attestation rows' TEST chain, made once (rank 0) and shared sealed
    transports: list[AdversarialTransport] = field(default_factory=list)


def run_case(case_no: int, attack: str, collective: str, run: SelftestRun) -> dict:
    """Run one case on every rank; every rank returns the same judged row. What decides
    the row crosses sealed, on ``run.report``."""
    if collective == "attestation":
        return run_attestation_case(case_no, attack, run)
    rank, n = dist.get_rank(), dist.get_world_size()
    across = run.domains is not None and collective in HIERARCHICAL
    link = AttackedLink.across(run.domains) if across else AttackedLink.flat(n, run.domains is not None)
    secret, base, report = run.secret, run.base, run.report
    abort = AbortSignal.default(f"{report.session_id.hex()}/{case_no}")
    # A process group per case: a failed case leaves receives behind and its timed-out
    # waits close their connections; neither may touch the next case.
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=base.timeout_s + 5))
    tr = AdversarialTransport(pg, base.timeout_s, tag=_TAG_BASE + case_no, abort=abort,
                              setup_history=run.setup_history)
    run.transports.append(tr)
    setup: dict = {"status": "ok"}
    plan, case, g = None, None, None
    try:
        g = SecureGroup(base, secret, pg, transport=tr)
        if across:
            links = _case_links(run, case_no, g, tr.tag, abort)
            # The rule goes on the shard ring where this rank holds shard 0; elsewhere on
            # the case's flat links, which the hierarchical collectives do not use.
            ring = links.cross.transport if links.cross is not None and links.local.rank == 0 else tr
            warm, case = HierarchicalCase("all_reduce", links, ring), HierarchicalCase(collective, links, ring)
        else:
            warm, case = CollectiveCase("all_reduce", g, tr, ring=True), make_case(collective, g, tr, secret)
        ok0 = warm.run()
        if case.transport is not tr:
            tr = case.transport
            run.transports.append(tr)
        for _ in range(case.warm_up_runs):
            ok0 = case.run() and ok0
        tr.arm()
        ok1 = case.run()
        if not (ok0 and ok1):
            setup = {"status": "error", "message": "the clean run before the attack gave a wrong result"}
    except Exception as e:  # noqa: BLE001
        abort.set(f"rank {rank} failed before the attack")
        setup = {"status": "error", "message": f"{type(e).__name__}: {_one_line(e)}"}
    mine = {"setup": setup,
            "sizes": [tr.sent_sizes[w].get(link.ring_dst, []) if rank == link.src else [] for w in (0, 1)],
            "labels": [_labels_of(tr.recv_labels[w].get(link.ring_src, {})) if rank == link.dst else {}
                       for w in (0, 1)]}
    views = gather_json(mine, report)
    failed = [f"rank {r}: {v['setup']['message']}" for r, v in enumerate(views) if v["setup"]["status"] != "ok"]
    outcome: dict = {"status": "skipped"}
    if not failed:
        try:
            if collective == "setup":
                plan = _setup_plan(attack, link.src, link.dst, base.timeout_s)
            else:
                labels = [_labels_from(views[link.dst]["labels"][w]) for w in (0, 1)]
                plan = _plan(attack, link.ring_size, link.ring_src, link.ring_dst, views[link.src]["sizes"], labels,
                             base.timeout_s, run.short_timeout_s)
        except CCDDPError as e:
            failed = [f"cannot stage the attack: {_one_line(e)}"]
    if not failed:
        # A timeout case waits a short time, so the table is not held up for a minute.
        tr.timeout = timedelta(seconds=plan.timeout_s)
        tr.arm([plan.rule])
        outcome = _attempt(case, rank, abort)
        outcome["applied"] = len(tr.applied)
        if isinstance(case, SetupCase):
            outcome["keys_used"] = case.keys_used
        label = tr.label(link.ring_src, plan.target) if rank == link.dst and collective != "setup" else None
        outcome["label"] = label.as_dict() if label is not None else None
    if case is not None:
        case.close()
    if g is not None:
        g.close()
    outcomes = gather_json(outcome, report)
    row = judge(attack, collective, n, link.src, link.dst, plan, failed, outcomes)
    return {**row, "expected": f"{row['expected']} [{link.where}]"} if link.where else row


# -- attested setup ------------------------------------------------------------------------

ATTEST_ATTACKER = 1    # the rank whose evidence is wrong (a compromised rank, or the host's replay)


class AttestedCase:
    """A new group whose keys come from attested establishment (``TeeVerifier`` with
    ``provider``), then one all-reduce on it. ``keys_used`` counts the frames its keys
    sealed or opened: under an attack the group must never come into being."""

    def __init__(self, settings: CommSettings, pg, verifier_of) -> None:
        self.settings, self.pg, self.verifier_of = settings, pg, verifier_of
        self.keys_used = 0

    def _count(self, key_hash: bytes, nonce: bytes) -> None:
        self.keys_used += 1

    def run_with(self, provider) -> bool:
        from ccddp.crypto.establish import Identity

        est = KeyEstablishment(Identity.generate(f"rank{dist.get_rank()}"), self.verifier_of(provider))
        g = SecureGroup(self.settings, pg=self.pg, recorder=self._count, establishment=est,
                        transport=Transport.open(self.pg, self.settings.timeout_s))
        try:
            return CollectiveCase("all_reduce", g, g.transport).run()
        finally:
            g.close()


class _Leak:
    """Rank 0 in the swap case: its honest evidence, also sent to the attacker as soon as
    it is made (what a host that reads rank 0's setup message could pass on)."""

    def __init__(self, provider, side) -> None:
        self.provider, self.side = provider, side

    def read(self, report_data: bytes):
        kind, blob, vcek, source = self.provider.read(report_data)
        dist.send(torch.frombuffer(bytearray(blob), dtype=torch.uint8), dst=ATTEST_ATTACKER, group=self.side)
        return kind, blob, vcek, source


class _Relay:
    """The attacker in the swap case: rank 0's evidence of this very group, as its own."""

    def __init__(self, vcek_der: bytes, side) -> None:
        self.vcek_der, self.side = vcek_der, side

    def read(self, report_data: bytes):
        from ccddp.crypto.attest.snp import REPORT_BYTES

        buf = torch.empty(REPORT_BYTES, dtype=torch.uint8)
        dist.recv(buf, src=0, group=self.side)
        return "snp", buf.numpy().tobytes(), self.vcek_der, "relayed from rank 0"


def _attest_chain(run: SelftestRun):
    """The TEST chain every rank signs with: made by rank 0 (two RSA keys take seconds),
    sent to the others over the sealed report group. It is trusted only by the verifiers
    built here (its pins, passed in code)."""
    from ccddp.testing.snp_chain import TestChain

    if run.attest_chain is None:
        mine = None
        if dist.get_rank() == 0:
            mine = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in TestChain().export().items()}
        d = gather_json(mine, run.report)[0]
        run.attest_chain = TestChain.load({k: (bytes.fromhex(v) if isinstance(v, str) else v) for k, v in d.items()})
    return run.attest_chain


def run_attestation_case(case_no: int, attack: str, run: SelftestRun) -> dict:
    """An attested group forms (the control), then rank 1 presents evidence the verifiers
    must refuse (:data:`ATTESTATION_ATTACKS`): every rank must raise ``AttestationError``
    naming rank 1 and the claim, before any key is used. Judged, like every row, from the
    outcomes every rank sent sealed."""
    from ccddp.crypto.attest import AttestationPolicy, TeeVerifier, TrustStore
    from ccddp.testing.snp_chain import MEASUREMENT, TestProvider

    rank, n = dist.get_rank(), dist.get_world_size()
    base, report = run.base, run.report
    abort = AbortSignal.default(f"{report.session_id.hex()}/{case_no}")
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=base.timeout_s + 5))
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=base.timeout_s + 5))
    chain = _attest_chain(run)
    tcb = chain.tcb
    policy = AttestationPolicy.from_toml(
        f'format = "ccddp-attestation-policy/1"\n[snp]\nmeasurements = ["{MEASUREMENT.hex()}"]\n'
        f'min_tcb = {{ bootloader = {tcb["bootloader"]}, snp = {tcb["snp"]}, microcode = {tcb["microcode"]} }}\n')
    trust = TrustStore([chain.ask, chain.ark], pins=chain.pins)
    case = AttestedCase(base, pg, lambda provider: TeeVerifier(policy, trust, provider=provider))
    honest = TestProvider(chain)
    control: dict = {"status": "ok"}
    try:
        if not case.run_with(honest):
            control = {"status": "error", "message": "the attested group gave a wrong result"}
    except Exception as e:  # noqa: BLE001 - reported, and the row fails
        abort.set(f"rank {rank} failed before the attack")
        control = {"status": "error", "message": f"{type(e).__name__}: {_one_line(e)}"}
    views = gather_json(control, report)
    failed = [f"rank {r}: {v['message']}" for r, v in enumerate(views) if v["status"] != "ok"]
    outcome: dict = {"status": "skipped"}
    if not failed:
        provider = honest
        if rank == ATTEST_ATTACKER:
            if attack == "replay":       # its own genuine evidence, of the control group
                provider = TestProvider(chain, replay=(honest.issued[0], chain.vcek_der))
            elif attack == "swap":
                provider = _Relay(chain.vcek_der, side)
            else:                        # a launch image the policy does not list
                provider = TestProvider(chain, measurement=bytes(48))
        elif rank == 0 and attack == "swap":
            provider = _Leak(honest, side)
        case.keys_used = 0
        t0 = time.monotonic()
        try:
            outcome = {"status": "ok", "correct": bool(case.run_with(provider)), "seconds": time.monotonic() - t0}
        except Exception as e:  # noqa: BLE001
            outcome = _error_outcome(e, t0)
        outcome["keys_used"] = case.keys_used
    outcomes = gather_json(outcome, report)
    return judge_attestation(attack, n, failed, outcomes, base.timeout_s)


def _error_outcome(e: Exception, t0: float) -> dict:
    return {"status": "error", "type": type(e).__name__, "message": _one_line(e), "one_line": "\n" not in str(e),
            "claim": getattr(e, "claim", None), "typed": isinstance(e, CCDDPError),
            "seconds": time.monotonic() - t0}


def judge_attestation(attack: str, n: int, failed: list[str], outcomes: list[dict], timeout_s: float) -> dict:
    """The row of an attestation case: every rank refuses with ``AttestationError`` naming
    the attacker and the expected claim, in one line, within the timeout, no key used."""
    claim = ATTESTATION_ATTACKS[attack]
    row = {"attack": attack, "collective": "attestation", "world_size": n,
           "expected": f"AttestationError, claim {claim!r} of rank {ATTEST_ATTACKER}, on every rank, no key used"}
    if failed:
        return {**row, "observed": "the attested group did not form: " + "; ".join(failed)[:300], "passed": False}
    problems = []
    for r, o in enumerate(outcomes):
        if o["status"] != "error":
            problems.append(f"rank {r}: the group formed ({'correct' if o.get('correct') else 'WRONG'} result)")
        elif o["type"] != "AttestationError" or o["claim"] != claim:
            problems.append(f"rank {r}: {o['type']} claim {o.get('claim')!r}")
        elif f"rank {ATTEST_ATTACKER}" not in o["message"]:
            problems.append(f"rank {r}: the reason does not name rank {ATTEST_ATTACKER}")
        elif not o["one_line"]:
            problems.append(f"rank {r}: a reason of more than one line")
        elif o["seconds"] > timeout_s + 2.0:
            problems.append(f"rank {r}: too late")
    used = {r: o.get("keys_used", 0) for r, o in enumerate(outcomes) if o.get("keys_used", 0)}
    if used:
        problems.append(f"frames sealed or opened under the refused group's keys: {used}")
    observed = (f"AttestationError, claim {claim!r}, on every rank, no key used" if not problems
                else "; ".join(problems))
    return {**row, "observed": observed[:400], "passed": not problems}


# -- the verdict ---------------------------------------------------------------------------

def judge(attack: str, collective: str, n: int, src: int, dst: int, plan: Plan | None, failed: list[str],
          outcomes: list[dict]) -> dict:
    """The row of one case, from every rank's outcome (the same on every rank)."""
    row = {"attack": attack, "collective": collective, "world_size": n}
    if failed or plan is None:
        return {**row, "expected": "the case can be staged", "observed": "; ".join(failed)[:300], "passed": False}
    wrong = [r for r, o in enumerate(outcomes) if o["status"] == "ok" and not o["correct"]]
    untyped = [r for r, o in enumerate(outcomes) if o["status"] == "error" and not o["typed"]]
    applied = sum(o.get("applied", 0) for o in outcomes)
    problems = []
    if wrong:
        problems.append(f"WRONG RESULT on rank(s) {wrong}")
    if untyped:
        problems.append("untyped error on rank(s) " + ", ".join(
            f"{r} ({outcomes[r]['type']}: {outcomes[r]['message'][:80]})" for r in untyped))
    if not applied:
        problems.append("the adversary never saw the frame" if plan.expect is not Expect.REFUSED
                        else "the adversary never saw the setup message")
    recv = outcomes[dst]
    expect = resolve(plan.expect, recv)
    if expect is Expect.INTEGRITY:
        where = FrameLabel(**recv["label"]) if recv.get("label") else None
        expected = (f"IntegrityError at rank {dst}: {_where(where)}" if where
                    else f"IntegrityError at rank {dst}: {src}->{dst} at the tampered frame")
        if recv["status"] == "error":
            got = FrameLabel(**recv["error_label"]) if recv.get("error_label") else None
            observed = f"{recv['type']} at rank {dst}: {_where(got)}"
            if not (recv["integrity"] and where is not None and got == where):
                problems.append(f"not at frame {plan.target} of link {src}->{dst} ({recv['message'][:120]})")
        else:
            observed = f"rank {dst} returned a {'correct' if recv['correct'] else 'WRONG'} result"
            problems.append("not detected")
    elif expect is Expect.CORRECT:
        expected = f"correct result, a frame {_DELAY_S:g}s late"
        errs = [r for r, o in enumerate(outcomes) if o["status"] != "ok"]
        observed = ("correct result on every rank" if not errs and not wrong else
                    "; ".join(f"rank {r}: {outcomes[r].get('type', 'wrong result')}" for r in errs + wrong))
        if errs:
            problems.append("a delay was treated as an attack")
    elif expect is Expect.TIMEOUT:
        expected = f"PeerTimeoutError within {plan.timeout_s:g}s"
        timeouts = [(o["seconds"], r) for r, o in enumerate(outcomes)
                    if o["status"] == "error" and o["timeout"] and not o["abandoned"]]
        if timeouts:
            secs, r = min(timeouts)
            observed = f"PeerTimeoutError at rank {r} after {secs:.1f}s"
            if secs > plan.timeout_s + 2.0:
                problems.append("too late")
        else:
            observed = "; ".join(f"rank {r}: {o.get('type', 'returned')}" for r, o in enumerate(outcomes))
            problems.append("no timeout")
    else:
        expected, observed = _judge_setup(plan, outcomes, problems)
    if problems:
        observed = f"{observed} [{'; '.join(problems)}]"
    return {**row, "expected": expected, "observed": observed[:400], "passed": not problems}


def _where(label: FrameLabel | None) -> str:
    if label is None:
        return "no frame named"
    where = f"{label.link} {label.collective} step {'?' if label.step is None else label.step}"
    return where if label.segment is None else f"{where} segment {label.segment}"


def _judge_setup(plan: Plan, outcomes: list[dict], problems: list[str]) -> tuple[str, str]:
    """Every rank must refuse the setup with a one-line setup error, within the timeout,
    before any key of the attacked group seals or opens a frame."""
    expected = "every rank refuses the setup, no key used"
    refused = [r for r, o in enumerate(outcomes) if o["status"] == "error" and o["refused"]]
    others = [r for r in range(len(outcomes)) if r not in refused]
    used = {r: o.get("keys_used", 0) for r, o in enumerate(outcomes) if o.get("keys_used", 0)}
    types = sorted({outcomes[r]["type"] for r in refused})
    if not others and not used:
        observed = f"{'/'.join(types)} on every rank, no key used"
    else:
        observed = f"{'/'.join(types)} on rank(s) {refused}" if refused else "no rank refused the setup"
    if others:
        problems.append("; ".join(f"rank {r}: {outcomes[r].get('type', 'the setup passed')}" for r in others))
    if used:
        problems.append(f"frames sealed or opened under the attacked group's keys: {used}")
    slow = [r for r in refused if outcomes[r]["seconds"] > plan.timeout_s + 2.0]
    if slow:
        problems.append(f"too late on rank(s) {slow}")
    multi = [r for r in refused if not outcomes[r]["one_line"]]
    if multi:
        problems.append(f"a reason of more than one line on rank(s) {multi}")
    return expected, observed


def run_selftest(attacks: list[str], collectives: list[str], settings: CommSettings,
                 short_timeout_s: float = 2.0, secret: GroupSecret | None = None,
                 trust_domains="rank") -> list[dict]:
    """The rows of :func:`run_selftest_over`, without the map."""
    return run_selftest_over(attacks, collectives, settings, short_timeout_s, secret, trust_domains)[0]


def run_selftest_over(attacks: list[str], collectives: list[str], settings: CommSettings,
                      short_timeout_s: float = 2.0, secret: GroupSecret | None = None,
                      trust_domains="rank") -> tuple[list[dict], DomainMap | None]:
    """Run every (attack, collective) case on the initialized default process group; the
    rows, and the trust-domain map the ranks proved (None: every rank its own domain).

    ``trust_domains`` (a ``CommSettings.trust_domains`` value of at least two domains,
    proven as the backend proves it: :func:`ccddp.backend.links.prove_domains`):
    all-reduce, reduce-scatter and broadcast run the backend's hierarchical schedules over
    them, and their attacks strike shard 0's sealed ring across domains; the links inside
    a domain are plaintext by design and not attacked (:func:`plaintext_links` lists
    them). Every other collective is sealed end to end under any map, and is attacked as
    without domains.

    Keys: ``secret`` if given; else the authenticated exchange if ``CCDDP_IDENTITY`` is
    set; else the pre-shared secret from the environment. Every rank returns the same
    rows (keys ``attack``, ``collective``, ``world_size``, ``expected``, ``observed``,
    ``passed``), judged from outcomes every rank sent sealed; a report the host altered
    raises :class:`~ccddp.errors.IntegrityError` instead.

    Example (on every rank)::

        rows = run_selftest(["flip", "replay"], ["all_reduce", "setup"], CommSettings(segment_bytes=1024))
        assert all(r["passed"] for r in rows)
    """
    check_lists(attacks, collectives)
    if dist.get_world_size() < 2:
        raise ConfigError("selftest needs a world size of at least 2")
    if not settings.secure:
        raise ConfigError(f"selftest checks the secure implementations; impl={settings.impl!r} has no crypto")
    if secret is None and KeyEstablishment.from_env() is None:
        secret = GroupSecret.from_env()
    # else: with CCDDP_IDENTITY set, each case's SecureGroup runs the authenticated exchange.
    # The report's own group: clean (no adversary of ours on it), secure, and patient enough
    # for a rank that is still finishing a case another rank has left.
    wait_s = 3 * settings.timeout_s + 30
    report = SecureGroup(CommSettings(impl="secure", timeout_s=wait_s), secret, transport=Transport.open(
        dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_s)), wait_s))
    domains = selftest_domains(trust_domains, report)
    run = SelftestRun(secret, settings, short_timeout_s, report, domains)
    try:
        return [run_case(i, attack, collective, run)
                for i, (attack, collective) in enumerate(cases(attacks, collectives), start=1)], domains
    finally:
        # Waits a rank gave up when another stopped end within their timeout; the process
        # must not tear its process groups down under them.
        for tr in run.transports:
            tr.settle()
        report.close()


def selftest_domains(setting, report: SecureGroup) -> DomainMap | None:
    """The map ``setting`` names, as the ranks prove it over the report's group (None:
    every rank its own domain), refused with a :class:`ConfigError` if it leaves no link
    across domains to attack."""
    m, endpoint = prove_domains(report, setting)
    if endpoint is not None:
        endpoint.close()            # each case proves the map again, on links of its own
    if m.trivial:
        return None
    if len(m.domains) < 2:
        raise ConfigError(f"--trust-domains {m.as_lists()}: one domain holds every rank, so no link crosses "
                          "domains and nothing is sealed to attack")
    return m


# -- faults (one torchrun job each) -------------------------------------------------------

class _FaultTransport(Transport):
    """Makes rank ``victim`` die or go silent when it is about to send frame ``after``."""

    def __init__(self, pg, timeout_s: float, victim: int, after: int, action: str) -> None:
        super().__init__(pg, timeout_s)
        self.victim, self.after, self.action, self.sent = victim, after, action, 0

    def isend(self, frame, dst, tag=0):
        if self.rank == self.victim:
            self.sent += 1
            if self.sent > self.after:
                if self.action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                while True:  # alive, connections open, never answering
                    time.sleep(3600)
        return super().isend(frame, dst, tag)


_FAULT_RULES = {
    # Frame 18 of link 0->1 is in the second ring step (16 one-KiB segments per step), so
    # rank 0 has by then received frames of its other link to splice from.
    "flip": Rule("flip", 0, 1, nth=18),
    "truncate": Rule("truncate", 0, 1, nth=18),
    "replay": Rule("replay", 0, 1, nth=18),
    "reorder": Rule("reorder", 0, 1, nth=18),
    "wrong-key": Rule("splice", 0, 1, nth=18, from_link=-1),
}


def run_fault(name: str, timeout_s: float, attack: str = "flip") -> None:
    """Run fault ``name`` on the initialized default group; it must raise on every
    surviving rank (a :class:`CCDDPError`), and may never return a wrong result.
    ``attack`` picks what ``tampered-frame`` does to the frame (``wrong-key``: a frame
    sealed under another link's key)."""
    if name not in FAULTS:
        raise ConfigError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
    rank, n = dist.get_rank(), dist.get_world_size()
    settings = CommSettings(segment_bytes=_SEGMENT, timeout_s=timeout_s)
    secret = GroupSecret.from_env()
    transport = None
    numel, dtype = n * 4 * _CHUNK, torch.float32
    if name == "tampered-frame":
        if attack not in _FAULT_RULES:
            raise ConfigError(f"unknown attack {attack!r} for tampered-frame; choose from {', '.join(_FAULT_RULES)}")
        rule = _FAULT_RULES[attack]
        if rule.from_link is not None:
            rule = Rule("splice", 0, 1, nth=rule.nth, from_link=n - 1)
        transport = AdversarialTransport(dist.group.WORLD, timeout_s, [rule])
        transport.arm()
    elif name in ("killed-rank", "silent-peer"):
        transport = _FaultTransport(dist.group.WORLD, timeout_s, victim=1, after=6,
                                    action="kill" if name == "killed-rank" else "silent")
    elif name == "other-settings" and rank == 1:
        settings = settings.with_(segment_bytes=2 * _SEGMENT)
    elif name == "other-key" and rank == 1:
        secret = GroupSecret.generate()
    elif name == "other-length" and rank == 1:
        numel += 1
    elif name == "other-dtype" and rank == 1:
        dtype = torch.float64
    g = SecureGroup(settings, secret, transport=transport)
    for _ in range(3):
        x = _pattern(numel, rank).to(dtype)
        all_reduce(x, g)
        if not torch.equal(x.float(), _ar_expect(numel, n)):
            raise CCDDPError(f"fault {name}: WRONG RESULT returned on rank {rank}")
    raise CCDDPError(f"fault {name} was not detected: every all-reduce completed on rank {rank}")


def main() -> None:
    args = build_parser().parse_args()
    if args.fault:
        init_from_env(max(30.0, 3 * args.timeout))
        run_fault(args.fault, args.timeout, args.fault_attack)
        return
    attacks, collectives = parse_lists(args)
    init_from_env(max(30.0, 3 * args.timeout))
    settings = CommSettings(impl=args.impl, segment_bytes=_SEGMENT, chains=2, timeout_s=args.timeout)
    rows, domains = run_selftest_over(attacks, collectives, settings, args.stall_timeout,
                                      trust_domains=trust_domains_setting(args.trust_domains))
    if dist.get_rank() == 0 and args.json:
        # Written before a failure is raised, so the CLI can show the table either way.
        from ccddp.bench.machine import machine_info

        with open(args.json, "w") as f:
            json.dump({"schema": SCHEMA, "machine": machine_info(), "world_size": dist.get_world_size(),
                       "settings": settings.as_dict(),
                       "trust_domains": domains.as_lists() if domains is not None else None,
                       "plaintext_links": plaintext_links(domains.as_lists()) if domains is not None else [],
                       "rows": rows}, f, indent=2)
    if not all(r["passed"] for r in rows):
        failed = [f"{r['attack']}/{r['collective']}" for r in rows if not r["passed"]]
        raise CCDDPError(f"selftest: {len(failed)} of {len(rows)} cases failed: {', '.join(failed[:6])}")


if __name__ == "__main__":
    run_worker(main)
