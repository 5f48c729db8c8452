"""Every attack of the adversarial link layer against real secure collectives and a DDP
training step, on 2 and 4 CPU ranks: detected at the first tampered frame, by the rank
that receives it, with link/collective/step in a typed error; no wrong result returned;
every rank stops.

Each world size is one launch that runs all cases (``ccddp.bench.selftest``), plus two
controls that show the check can fail: the same flip against the plaintext ``ring``
goes unnoticed and corrupts the sum, and a rule aimed at a frame that never comes is
reported as not applied.
"""

from __future__ import annotations

import pytest

from _security_util import spawn, values
from ccddp.bench.selftest import ATTACKS, COLLECTIVES, ROW_KEYS, Plan, judge, parse_label
from ccddp.comm.adversary import Rule
from ccddp.errors import ConfigError

SECRET = bytes.fromhex("d14cc382da6e20061e1b14a4f9ab5d6415fe3f53c7d9763b7ebb6a114d934605")


def _rank(rank, n, naive_cases):
    import torch
    import torch.distributed as dist

    from ccddp.bench.selftest import run_selftest
    from ccddp.comm import CommSettings, SecureGroup, all_reduce
    from ccddp.comm.adversary import AdversarialTransport, Rule
    from ccddp.crypto.keys import GroupSecret

    secret = GroupSecret(SECRET)
    settings = CommSettings(impl="secure", segment_bytes=1024, chains=2, timeout_s=10)
    rows = run_selftest(list(ATTACKS), list(COLLECTIVES), settings, short_timeout_s=1.0, secret=secret)
    naive = []
    if naive_cases:
        naive = run_selftest(naive_cases[0], naive_cases[1], settings.with_(impl="secure-naive"),
                             short_timeout_s=1.0, secret=secret)
    # Control: the plaintext ring over the same adversary. Nothing notices the flip.
    tr = AdversarialTransport(dist.group.WORLD, 10, tag=7)
    g = SecureGroup(CommSettings(impl="ring", segment_bytes=1024, timeout_s=10), transport=tr)
    tr.arm([Rule("flip", src=0, dst=1, nth=1, bit=8 * 100 + 6)])
    x = torch.ones(n * 1024)
    all_reduce(x, g)
    control = {"wrong": int((x != n).sum()), "applied": len(tr.applied)}
    return {"rows": rows, "naive": naive, "control": control}


def _check(res, n):
    rows = res[0]["rows"]
    for other in res[1:]:
        assert other["rows"] == rows, "ranks must judge every case alike"
    assert {(r["attack"], r["collective"]) for r in rows} == {(a, c) for a in ATTACKS for c in COLLECTIVES}
    failed = [r for r in rows if not r["passed"]]
    assert not failed, "\n".join(f"{r['attack']}/{r['collective']}: expected {r['expected']}; "
                                 f"observed {r['observed']}" for r in failed)
    for r in rows:
        assert set(ROW_KEYS) <= set(r) and r["world_size"] == n
        if r["attack"] not in ("delay", "stall"):
            assert r["observed"].startswith("IntegrityError at rank 1: 0->1 ")
            assert r["observed"] == r["expected"]
    # Control: the adversary really tampered, and without crypto the sum is silently wrong.
    assert res[1]["control"]["wrong"] > 0 or res[0]["control"]["wrong"] > 0
    assert res[0]["control"]["applied"] == 1


@pytest.mark.timeout(240)
def test_every_attack_detected_world_size_2():
    naive_cases = (["flip", "reorder", "drop"], ["all_reduce", "reduce_scatter"])
    res = values(spawn(_rank, 2, naive_cases, timeout=220, pg_timeout=60))
    _check(res, 2)
    naive = res[0]["naive"]
    assert len(naive) == 6 and all(r["passed"] for r in naive), [r for r in naive if not r["passed"]]


@pytest.mark.timeout(300)
def test_every_attack_detected_world_size_4():
    res = values(spawn(_rank, 4, None, timeout=280, pg_timeout=60))
    _check(res, 4)


# -- the judge can say no ---------------------------------------------------------------

def _outcome(**kw):
    base = {"status": "error", "type": "IntegrityError", "integrity": True, "timeout": False, "typed": True,
            "seconds": 0.1, "abandoned": False, "applied": 0, "link": "0->1", "collective": "all_reduce#3",
            "step": "1", "message": "x", "label": "receive in all_reduce#3 step 1"}
    base.update(kw)
    return base


def _judge(outcomes, expect="integrity"):
    plan = Plan(Rule("flip", 0, 1, 5), 5, expect, 10.0)
    return judge("flip", "all_reduce", 2, 0, 1, plan, [], outcomes)


def test_judge_passes_detection_at_the_tampered_frame():
    row = _judge([_outcome(applied=1, abandoned=True, integrity=False, timeout=True, type="PeerTimeoutError"),
                  _outcome()])
    assert row["passed"], row


@pytest.mark.parametrize("receiver,sender,why", [
    (_outcome(step="2"), _outcome(applied=1), "not at frame"),                          # detected one step late
    (_outcome(link="1->0"), _outcome(applied=1), "not at frame"),                       # on another link
    ({"status": "ok", "correct": False, "seconds": 0.1}, _outcome(applied=1), "WRONG RESULT"),
    ({"status": "ok", "correct": True, "seconds": 0.1}, _outcome(applied=1), "not detected"),
    (_outcome(), _outcome(applied=0), "never saw the frame"),                           # the attack did not happen
    (_outcome(typed=False, type="RuntimeError"), _outcome(applied=1), "untyped"),
])
def test_judge_fails_what_it_must(receiver, sender, why):
    row = _judge([sender, receiver])
    assert not row["passed"] and why in row["observed"], row


def test_labels_and_rules():
    assert parse_label("receive in all_reduce#3 step 1") == ("all_reduce#3", 1)
    assert parse_label("descriptor exchange of collective #12") == ("descriptor#12", 0)
    assert parse_label("receive in tree_all_reduce#2") == ("tree_all_reduce#2", None)
    assert parse_label(None) is None
    with pytest.raises(ConfigError):
        Rule("melt", 0, 1)
    with pytest.raises(ConfigError):
        Rule("splice", 0, 1)            # needs a source
    with pytest.raises(ConfigError):
        Rule("drop", 0, 1, count=2)
    r = Rule("flip", 0, 1, nth=3, count=2)
    assert r.hits(0, 1, 3) and r.hits(0, 1, 4) and not r.hits(0, 1, 5) and not r.hits(1, 0, 3)
