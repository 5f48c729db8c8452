"""``ccddp selftest``: run every attack of the adversarial link against real secure
collectives on this machine's ranks, and say whether each one was caught.

For each (attack, collective) case every rank builds a fresh :class:`SecureGroup` on an
:class:`~ccddp.comm.adversary.AdversarialTransport` and runs three windows:

0. a clean all-reduce (frames of several ring steps, and frames of the other links, for
   splices to draw on),
1. the collective, clean (the reference: which frame the attack will hit, its size and
   the label the receiver gives it),
2. the same collective with one rule on link ``0 -> 1``: the receiver must raise
   :class:`~ccddp.errors.IntegrityError` at exactly the tampered frame, no rank may return a
   wrong result, and every rank must stop (the one that detects releases the others).

``delay`` must *not* be caught (authentication says nothing about timing): the result is
correct, just late. ``stall`` (a frame held past the timeout) must end in
:class:`~ccddp.errors.PeerTimeoutError` within the timeout.

Run it under torchrun (``python -m ccddp.bench.selftest --json rows.json``) or through
``ccddp selftest --world-size N``, which launches the ranks and prints the table.

Example::

    $ ccddp selftest --world-size 2
    attack  collective  world  expected                                            observed  passed
    flip    all_reduce  2      IntegrityError at rank 1: 0->1 all_reduce#3 step 0  (same)    yes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from ccddp.bench.worker import init_from_env, run_worker
from ccddp.comm import CommSettings, SecureGroup, all_gather, all_reduce, broadcast, reduce_scatter
from ccddp.comm.adversary import AbortSignal, AdversarialTransport, AdversaryError, Rule
from ccddp.comm.transport import exchange_bytes
from ccddp.comm.transport import Transport
from ccddp.crypto.establish import KeyEstablishment
from ccddp.crypto.keys import GroupSecret
from ccddp.errors import CCDDPError, ConfigError, IntegrityError, PeerTimeoutError

SCHEMA = "ccddp.selftest/1"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ddp_step")
INTEGRITY_ATTACKS = ("flip", "truncate", "replay", "reorder", "drop", "splice-step", "splice-bucket", "splice-link")
ATTACKS = INTEGRITY_ATTACKS + ("delay", "stall")
ROW_KEYS = ("attack", "collective", "world_size", "expected", "observed", "passed")

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


def _op(collective: str, g: SecureGroup, tr: AdversarialTransport) -> tuple[Callable[[], bool], AdversarialTransport]:
    """A callable running ``collective`` once on ``g`` and returning whether the result is
    exactly right, and the transport its frames cross (where the attack goes)."""
    n, r = g.world_size, g.rank
    if collective == "all_reduce":
        def run() -> bool:
            x = _pattern(n * _CHUNK, r)
            return torch.equal(all_reduce(x, g), _ar_expect(n * _CHUNK, n))
    elif collective == "reduce_scatter":
        def run() -> bool:
            out = torch.empty(_CHUNK)
            reduce_scatter(out, _pattern(n * _CHUNK, r), g)
            return torch.equal(out, _ar_expect(n * _CHUNK, n)[r * _CHUNK:(r + 1) * _CHUNK])
    elif collective == "all_gather":
        def run() -> bool:
            out = torch.empty(n * _CHUNK)
            all_gather(out, _pattern(_CHUNK, r), g)
            return torch.equal(out, torch.cat([_pattern(_CHUNK, k) for k in range(n)]))
    elif collective == "broadcast":
        def run() -> bool:
            return torch.equal(broadcast(_pattern(_CHUNK, r), 0, g), _pattern(_CHUNK, 0))
    elif collective == "ddp_step":
        return _ddp_op(g, tr)
    else:
        raise ConfigError(f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}")
    return run, tr


# -- DDP -------------------------------------------------------------------------------

def ddp_available() -> bool:
    try:
        from ccddp.ddp import SecureDDP  # noqa: F401
    except ImportError:
        return False
    return True


def _ddp_op(g: SecureGroup, tr: AdversarialTransport) -> tuple[Callable[[], bool], AdversarialTransport]:
    """Training steps of a small model under ``SecureDDP`` (cc="on"); the adversary sits on
    the gradient all-reduce. Correct means every parameter equals what plain SGD on the
    average of all ranks' gradients gives, which each rank computes locally from the other
    ranks' (deterministic) batches."""
    from ccddp.ddp import SecureDDP

    n, r = g.world_size, g.rank
    torch.manual_seed(0)

    def make() -> torch.nn.Module:
        # Two layers of unequal size, so DDP makes more than one bucket after iteration 0.
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))

    module = make()
    reference = [p.detach().clone() for p in module.parameters()]
    model = SecureDDP(module, cc="on", settings=g.settings, secret=g.secret, bucket_cap_mb=0.001)
    hook_group = model.hook_state.group
    # Same rules, abort flag and tag as the case's transport, on the gradient group's links.
    hook_tr = AdversarialTransport(hook_group.pg, g.settings.timeout_s, tag=tr.tag, abort=tr.abort)
    hook_group.transport = hook_tr
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = [0]

    def batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 * i + rank)
        return torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)

    def run() -> bool:
        i = step[0]
        step[0] += 1
        x, y = batch(r, i)
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError:
            # DDP re-raises a failed hook future as RuntimeError; SecureDDP kept the typed one.
            failure = model.comm_failure()
            if isinstance(failure, CCDDPError):
                raise failure from None
            raise
        opt.step()
        # The same step in plain PyTorch, one rank's batch at a time.
        ref = make()
        with torch.no_grad():
            for p, v in zip(ref.parameters(), reference):
                p.copy_(v)
        grads = [torch.zeros_like(v) for v in reference]
        for k in range(n):
            ref.zero_grad()
            xk, yk = batch(k, i)
            torch.nn.functional.mse_loss(ref(xk), yk).backward()
            for acc, p in zip(grads, ref.parameters()):
                acc += p.grad / n
        ok = True
        for v, gk, p in zip(reference, grads, module.parameters()):
            v -= 0.1 * gk
            ok = ok and torch.allclose(p.detach(), v, rtol=1e-4, atol=1e-6)
        return ok

    run.close = model.close  # type: ignore[attr-defined]
    return run, hook_tr


# -- labels ----------------------------------------------------------------------------

def parse_label(what: str | None) -> tuple[str, int | None] | None:
    """``(collective, step)`` from the ``what`` a receiver waited with.

    ``"receive in all_reduce#3 step 1"`` -> ``("all_reduce#3", 1)``;
    ``"descriptor exchange of collective #3"`` -> ``("descriptor#3", 0)``.
    """
    if not what:
        return None
    m = re.search(r"collective #(\d+)", what)
    if what.startswith("descriptor") and m:
        return f"descriptor#{m.group(1)}", 0
    m = re.search(r"(\w+#\d+)(?: step (\d+))?", what)
    if not m:
        return None
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def _is_descriptor(label: tuple | None) -> bool:
    return label is not None and label[0].startswith("descriptor")


# -- one case ----------------------------------------------------------------------------

@dataclass
class Plan:
    """Where a case strikes, chosen identically on every rank from window 1's frames."""

    rule: Rule | None
    target: int
    expect: str          # "integrity", "correct", "timeout"
    timeout_s: float
    note: str = ""


def _plan(attack: str, n: int, src: int, dst: int, sizes: list[list[int]], labels: list[dict[int, str]],
          timeout_s: float, short_timeout_s: float) -> Plan:
    """``sizes[w]``: frame sizes sent on ``src -> dst`` in window ``w``; ``labels[w]``: the
    receiver's label of each of those frames."""
    s1 = sizes[1]
    lab1 = [parse_label(labels[1].get(i)) for i in range(len(s1))]
    data = [i for i in range(len(s1)) if not _is_descriptor(lab1[i])]
    if not data:
        raise AdversaryError(f"link {src}->{dst} carries no data frame in this collective")
    paired = [i for i in data if i + 1 < len(s1) and s1[i + 1] == s1[i]]
    # A frame in the middle of the window's last collective (in a DDP step, the last
    # bucket, so other buckets of the same step precede it): frames before it must pass,
    # and with n > 2 it sits in a later ring step or in the all-gather phase.
    last = [i for i in paired if lab1[i][0] == lab1[data[-1]][0]] or paired
    target = last[max(1, len(last) // 2)] if len(last) > 1 else (last[0] if last else data[0])
    size = s1[target]
    tlabel = lab1[target]
    if attack in ("flip", "truncate"):
        return Plan(Rule(attack, src, dst, target), target, "integrity", timeout_s)
    if attack == "drop":
        # Every later frame of the collective moves up one receive slot; gloo aborts the
        # receiving process if one is larger than its slot, so pick a frame after which
        # sizes never grow.
        coll = [lab[0] if lab else None for lab in lab1]

        def shift_safe(t: int) -> bool:
            rest = [i for i in range(t, len(s1)) if coll[i] == coll[t]]
            return len(rest) > 1 and s1[t + 1] == s1[t] and all(s1[i + 1] <= s1[i] for i in rest[:-1])

        good = [t for t in data if shift_safe(t)]
        if good:
            t = next((t for t in good if t >= target), good[-1])
            return Plan(Rule("drop", src, dst, t), t, "integrity", timeout_s)
        safe = [t for t in data if all(s1[i + 1] <= s1[i] for i in range(t, len(s1) - 1))]
        if safe:
            # The receiver's next receive gets the next collective's first frame, or nothing.
            return Plan(Rule("drop", src, dst, safe[-1]), safe[-1], "integrity-or-timeout", short_timeout_s,
                        "the last frame: no frame follows it")
        raise AdversaryError(f"drop: every frame on link {src}->{dst} is followed by a larger one")
    if attack == "reorder":
        if target + 1 < len(s1) and s1[target + 1] == size:
            return Plan(Rule(attack, src, dst, target), target, "integrity", timeout_s)
        # No frame of the same size follows: what the receiver sees is a silent link.
        return Plan(Rule(attack, src, dst, target), target, "integrity-or-timeout", short_timeout_s,
                    "no same-size frame follows on the link")
    if attack == "delay":
        return Plan(Rule("delay", src, dst, target, seconds=_DELAY_S), target, "correct", timeout_s)
    if attack == "stall":
        return Plan(Rule("delay", src, dst, target, seconds=short_timeout_s + 1.5), target, "timeout",
                    short_timeout_s)
    # The sender's history, in order: windows 0 and 1, then window 2 up to the target.
    history = [(0, i) for i in range(len(sizes[0]))] + [(1, i) for i in range(len(s1))] + \
              [(2, i) for i in range(target)]

    def size_of(w: int, i: int) -> int:
        return sizes[min(w, 1)][i]

    def label_of(w: int, i: int):
        return parse_label(labels[min(w, 1)].get(i))

    if attack == "replay":
        for back, (w, i) in enumerate(reversed(history), start=1):
            if size_of(w, i) == size:
                return Plan(Rule("replay", src, dst, target, back=back), target, "integrity", timeout_s)
    elif attack == "splice-step":
        for w, i in reversed(history):
            lab = label_of(w, i)
            if size_of(w, i) == size and lab and not _is_descriptor(lab) and lab[1] != tlabel[1]:
                return Plan(Rule("splice", src, dst, target, from_window=w, from_index=i), target, "integrity",
                            timeout_s, f"from step {lab[1]}")
    elif attack == "splice-bucket":
        base = tlabel[0].split("#")[0]
        for w, i in reversed(history):
            lab = label_of(w, i)
            # Another collective of the same kind in the same iteration is another bucket.
            if w == 2 and size_of(w, i) == size and lab and lab[0] != tlabel[0] and lab[0].startswith(base):
                return Plan(Rule("splice", src, dst, target, from_window=2, from_index=i), target,
                            "integrity", timeout_s)
        return Plan(Rule("splice", src, dst, target, from_window=1, from_index=target), target, "integrity",
                    timeout_s, "same frame of the previous collective")
    elif attack == "splice-link":
        return Plan(Rule("splice", src, dst, target, from_link=(src - 1) % n), target, "integrity", timeout_s,
                    f"from link {(src - 1) % n}->{src}")
    else:
        raise ConfigError(f"unknown attack {attack!r}; choose from {', '.join(ATTACKS)}")
    raise AdversaryError(f"{attack}: no earlier {size}-byte frame to use on link {src}->{dst}")


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def _attempt(fn: Callable[[], bool], rank: int, abort: AbortSignal) -> dict:
    t0 = time.monotonic()
    try:
        correct = bool(fn())
        return {"status": "ok", "correct": correct, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - every failure is an outcome to report, typed
        abort.set(f"rank {rank} stopped ({type(e).__name__})")
        out = {"status": "error", "type": type(e).__name__, "message": _one_line(e),
               "integrity": isinstance(e, IntegrityError), "timeout": isinstance(e, PeerTimeoutError),
               "typed": isinstance(e, CCDDPError), "seconds": time.monotonic() - t0,
               "abandoned": "abandoned:" in str(e)}
        for k in ("link", "collective", "step"):
            if hasattr(e, k):
                out[k] = str(getattr(e, k))
        return out


def _gather_json(obj) -> list:
    return [json.loads(b) for b in exchange_bytes(json.dumps(obj).encode())]


def run_case(case: int, attack: str, collective: str, secret: GroupSecret | None, base: CommSettings,
             short_timeout_s: float, prefix: str) -> dict:
    """Run one case on every rank; every rank returns the same judged row."""
    rank, n = dist.get_rank(), dist.get_world_size()
    src, dst = 0, 1
    abort = AbortSignal.default(f"{prefix}/{case}")
    # A process group per case: a failed case leaves receives behind and its timed-out
    # waits close their connections; neither may touch the next case.
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=base.timeout_s + 5))
    tr = AdversarialTransport(pg, base.timeout_s, tag=_TAG_BASE + case, abort=abort)
    g = SecureGroup(base, secret, pg, transport=tr)
    setup: dict = {"status": "ok"}
    plan, run = None, None
    try:
        ok0 = _op("all_reduce", g, tr)[0]()
        run, tr = _op(collective, g, tr)
        if collective == "ddp_step":
            # Construction (secure broadcast) and iteration 0 (one bucket) differ from
            # every later step, so they stay in window 0 with the all-reduce.
            ok0 = run() and ok0
        tr.arm()
        ok1 = run()
        if not (ok0 and ok1):
            setup = {"status": "error", "message": "the clean run before the attack gave a wrong result"}
    except Exception as e:  # noqa: BLE001
        abort.set(f"rank {rank} failed before the attack")
        setup = {"status": "error", "message": f"{type(e).__name__}: {_one_line(e)}"}
    mine = {"setup": setup,
            "sizes": [tr.sent_sizes[w].get(dst, []) if rank == src else [] for w in (0, 1)],
            "labels": [tr.recv_labels[w].get(src, {}) if rank == dst else {} for w in (0, 1)]}
    views = _gather_json(mine)
    failed = [f"rank {r}: {v['setup']['message']}" for r, v in enumerate(views) if v["setup"]["status"] != "ok"]
    outcome: dict = {"status": "skipped"}
    if not failed:
        try:
            labels = [{int(k): v for k, v in views[dst]["labels"][w].items()} for w in (0, 1)]
            plan = _plan(attack, n, src, dst, views[src]["sizes"], labels, base.timeout_s, short_timeout_s)
        except CCDDPError as e:
            failed = [f"cannot stage the attack: {_one_line(e)}"]
    if not failed:
        # A timeout case waits a short time, so the table is not held up for a minute.
        tr.timeout = timedelta(seconds=plan.timeout_s)
        tr.arm([plan.rule])
        outcome = _attempt(run, rank, abort)
        outcome["applied"] = len(tr.applied)
        outcome["label"] = tr.label(src, plan.target) if rank == dst else None
    if hasattr(run, "close"):
        run.close()
    g.close()
    outcomes = _gather_json(outcome)
    return judge(attack, collective, n, src, dst, plan, failed, outcomes)


def judge(attack: str, collective: str, n: int, src: int, dst: int, plan: Plan | None, failed: list[str],
          outcomes: list[dict]) -> dict:
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
        problems.append("the adversary never saw the frame")
    recv = outcomes[dst]
    if plan.expect == "integrity-or-timeout":
        # A held or dropped last frame: the receiver either sees the next collective's
        # first frame in its place (tag failure) or nothing (timeout). Both stop the run.
        plan.expect = "integrity" if recv["status"] == "error" and recv["integrity"] else "timeout"
    if plan.expect == "integrity":
        where = parse_label(recv.get("label"))
        expected = (f"IntegrityError at rank {dst}: {src}->{dst} {where[0]} step {where[1]}" if where
                    else f"IntegrityError at rank {dst}: {src}->{dst} at the tampered frame")
        if recv["status"] == "error":
            observed = (f"{recv['type']} at rank {dst}: {recv.get('link')} {recv.get('collective')} "
                        f"step {recv.get('step')}")
            hit = (recv["integrity"] and where is not None and recv.get("link") == f"{src}->{dst}"
                   and recv.get("collective") == where[0] and (where[1] is None or recv.get("step") == str(where[1])))
            if not hit:
                problems.append(f"not at frame {plan.target} of link {src}->{dst} ({recv['message'][:120]})")
        else:
            observed = f"rank {dst} returned a {'correct' if recv['correct'] else 'WRONG'} result"
            problems.append("not detected")
    elif plan.expect == "correct":
        expected = f"correct result, a frame {_DELAY_S:g}s late"
        errs = [r for r, o in enumerate(outcomes) if o["status"] != "ok"]
        observed = ("correct result on every rank" if not errs and not wrong else
                    "; ".join(f"rank {r}: {outcomes[r].get('type', 'wrong result')}" for r in errs + wrong))
        if errs:
            problems.append("a delay was treated as an attack")
    else:
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
    if problems:
        observed = f"{observed} [{'; '.join(problems)}]"
    return {**row, "expected": expected, "observed": observed[:400], "passed": not problems}


def run_selftest(attacks: list[str], collectives: list[str], settings: CommSettings,
                 short_timeout_s: float = 2.0, secret: GroupSecret | None = None) -> list[dict]:
    """Run every (attack, collective) case on the initialized default process group.

    Keys: ``secret`` if given; else the authenticated exchange if ``CCDDP_IDENTITY`` is
    set; else the pre-shared secret from the environment. Every rank returns the same
    rows (keys ``attack``, ``collective``, ``world_size``, ``expected``, ``observed``,
    ``passed``).

    Example (on every rank)::

        rows = run_selftest(["flip", "replay"], ["all_reduce"], CommSettings(segment_bytes=1024))
        assert all(r["passed"] for r in rows)
    """
    for a in attacks:
        if a not in ATTACKS:
            raise ConfigError(f"unknown attack {a!r}; choose from {', '.join(ATTACKS)}")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ConfigError(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    if dist.get_world_size() < 2:
        raise ConfigError("selftest needs a world size of at least 2")
    if not settings.secure:
        raise ConfigError(f"selftest checks the secure implementations; impl={settings.impl!r} has no crypto")
    if secret is None and KeyEstablishment.from_env() is None:
        secret = GroupSecret.from_env()
    # else: with CCDDP_IDENTITY set, each case's SecureGroup runs the authenticated exchange.
    # One nonce for this job, so abort flags of two selftests on one store never mix.
    prefix = exchange_bytes(os.urandom(8).hex().encode())[0].decode()
    rows, case = [], 0
    for collective in collectives:
        for attack in attacks:
            case += 1
            rows.append(run_case(case, attack, collective, secret, settings, short_timeout_s, prefix))
    return rows


# -- faults (one torchrun job each) -------------------------------------------------------

FAULTS = {
    "tampered-frame": ("a frame on link 0->1 is tampered with", "IntegrityError"),
    "killed-rank": ("rank 1 is killed (SIGKILL) in the middle of an all-reduce", "PeerTimeoutError"),
    "silent-peer": ("rank 1 stops responding in the middle of an all-reduce", "PeerTimeoutError"),
    "other-settings": ("rank 1 is started with another segment size", "ConfigError"),
    "other-key": ("rank 1 holds another group secret", "ConfigError"),
    "other-length": ("rank 1 all-reduces a tensor of another length", "ConfigError"),
    "other-dtype": ("rank 1 all-reduces float64, the others float32", "ConfigError"),
}


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


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ccddp selftest", description=__doc__.splitlines()[0], add_help=add_help)
    p.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma list of {', '.join(ATTACKS)}")
    p.add_argument("--collectives", default=None,
                   help=f"comma list of {', '.join(COLLECTIVES)} (default: all; ddp_step if ccddp.ddp is built)")
    p.add_argument("--impl", default="secure", choices=["secure", "secure-naive"])
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a rank may wait on a peer")
    p.add_argument("--stall-timeout", type=float, default=2.0,
                   help="timeout of the cases that must end in a timeout (stall, a dropped last frame)")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    p.add_argument("--fault", default=None, choices=sorted(FAULTS), help=argparse.SUPPRESS)
    p.add_argument("--fault-attack", default="flip", help=argparse.SUPPRESS)
    return p


def parse_lists(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    attacks = [a for a in args.attacks.split(",") if a]
    if args.collectives:
        collectives = [c for c in args.collectives.split(",") if c]
    else:
        collectives = [c for c in COLLECTIVES if c != "ddp_step" or ddp_available()]
    for a in attacks:
        if a not in ATTACKS:
            raise ConfigError(f"unknown attack {a!r}; choose from {', '.join(ATTACKS)}")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ConfigError(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    if "ddp_step" in collectives and not ddp_available():
        raise ConfigError("ddp_step needs ccddp.ddp.SecureDDP, which this installation lacks")
    if args.timeout <= 0 or args.stall_timeout <= 0:
        raise ConfigError("timeouts must be positive")
    return attacks, collectives


def main() -> None:
    args = build_parser().parse_args()
    if args.fault:
        init_from_env(max(30.0, 3 * args.timeout))
        run_fault(args.fault, args.timeout, args.fault_attack)
        return
    attacks, collectives = parse_lists(args)
    init_from_env(max(30.0, 3 * args.timeout))
    settings = CommSettings(impl=args.impl, segment_bytes=_SEGMENT, chains=2, timeout_s=args.timeout)
    rows = run_selftest(attacks, collectives, settings, args.stall_timeout)
    if dist.get_rank() == 0 and args.json:
        # Written before a failure is raised, so the CLI can show the table either way.
        from ccddp.bench.machine import machine_info

        with open(args.json, "w") as f:
            json.dump({"schema": SCHEMA, "machine": machine_info(), "world_size": dist.get_world_size(),
                       "settings": settings.as_dict(), "rows": rows}, f, indent=2)
    if not all(r["passed"] for r in rows):
        failed = [f"{r['attack']}/{r['collective']}" for r in rows if not r["passed"]]
        raise CCDDPError(f"selftest: {len(failed)} of {len(rows)} cases failed: {', '.join(failed[:6])}")


if __name__ == "__main__":
    run_worker(main)
