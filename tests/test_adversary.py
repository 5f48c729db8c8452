"""Every attack of the adversarial link layer against real secure collectives and a DDP
training step, on 2 and 4 CPU ranks: detected at the first tampered frame, by the rank
that receives it, with link/collective/step/segment in a typed error; no wrong result
returned; every rank stops. Every attack on the setup of a secure group (a flipped,
swapped, replayed, dropped or reordered contribution or confirmation): every rank
refuses the setup with a one-line ConfigError, and no key of that group seals or opens
a frame.

Each world size is one launch that runs all cases (``ccddp.bench.selftest``), plus two
controls that show the check can fail: the same flip against the plaintext ``ring``
goes unnoticed and corrupts the sum, and a rule aimed at a frame that never comes is
reported as not applied.
"""

from __future__ import annotations

import pytest

from _security_util import spawn, values
from ccddp.bench.selftest import Expect, Plan, judge, resolve
from ccddp.bench.selftest_options import ATTACKS, COLLECTIVES, ROW_KEYS, SETUP_ATTACKS, cases
from ccddp.errors import ConfigError, FrameLabel, IntegrityError, PeerTimeoutError
from ccddp.testing.adversary import Rule, SetupRule

SECRET = bytes.fromhex("d14cc382da6e20061e1b14a4f9ab5d6415fe3f53c7d9763b7ebb6a114d934605")


def _rank(rank, n, naive_cases):
    import torch
    import torch.distributed as dist

    from ccddp.bench.selftest import run_selftest
    from ccddp.bench.reference import all_reduce
    from ccddp.comm import CommSettings, SecureGroup
    from ccddp.testing.adversary import AdversarialTransport, Rule
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
    assert [(r["attack"], r["collective"]) for r in rows] == cases(list(ATTACKS), list(COLLECTIVES))
    assert sum(r["collective"] == "setup" for r in rows) == len(SETUP_ATTACKS)
    failed = [r for r in rows if not r["passed"]]
    assert not failed, "\n".join(f"{r['attack']}/{r['collective']}: expected {r['expected']}; "
                                 f"observed {r['observed']}" for r in failed)
    for r in rows:
        assert set(ROW_KEYS) <= set(r) and r["world_size"] == n
        if r["collective"] == "setup":
            assert r["observed"] == "ConfigError on every rank, no key used", r
        elif r["collective"] == "attestation":      # judged in test_selftest_attest.py
            assert r["observed"].startswith("AttestationError, claim "), r
        elif r["attack"] not in ("delay", "stall"):
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

LABEL = FrameLabel("0->1", "all_reduce#3", 1, 2).as_dict()


def _outcome(**kw):
    base = {"status": "error", "type": "IntegrityError", "integrity": True, "timeout": False, "typed": True,
            "refused": False, "one_line": True, "seconds": 0.1, "abandoned": False, "applied": 0,
            "error_label": LABEL, "message": "x", "label": LABEL}
    base.update(kw)
    return base


def _judge(outcomes, expect=Expect.INTEGRITY):
    plan = Plan(Rule("flip", 0, 1, 5), 5, expect, 10.0)
    return judge("flip", "all_reduce", 2, 0, 1, plan, [], outcomes)


def test_judge_passes_detection_at_the_tampered_frame():
    row = _judge([_outcome(applied=1, abandoned=True, integrity=False, timeout=True, type="AbandonedWait"),
                  _outcome()])
    assert row["passed"], row
    assert row["observed"] == row["expected"] == "IntegrityError at rank 1: 0->1 all_reduce#3 step 1 segment 2"


@pytest.mark.parametrize("receiver,sender,why", [
    (_outcome(error_label={**LABEL, "step": 2}), _outcome(applied=1), "not at frame"),      # one step late
    (_outcome(error_label={**LABEL, "segment": 3}), _outcome(applied=1), "not at frame"),   # one segment late
    (_outcome(error_label={**LABEL, "link": "1->0"}), _outcome(applied=1), "not at frame"),  # another link
    (_outcome(error_label=None), _outcome(applied=1), "not at frame"),                      # no frame named
    ({"status": "ok", "correct": False, "seconds": 0.1}, _outcome(applied=1), "WRONG RESULT"),
    ({"status": "ok", "correct": True, "seconds": 0.1}, _outcome(applied=1), "not detected"),
    (_outcome(), _outcome(applied=0), "never saw the frame"),                               # the attack did not happen
    (_outcome(typed=False, type="RuntimeError"), _outcome(applied=1), "untyped"),
])
def test_judge_fails_what_it_must(receiver, sender, why):
    row = _judge([sender, receiver])
    assert not row["passed"] and why in row["observed"], row


def test_the_expectation_is_resolved_not_rewritten():
    plan = Plan(Rule("drop", 0, 1, 5), 5, Expect.INTEGRITY_OR_TIMEOUT, 1.0)
    timed_out = _outcome(type="PeerTimeoutError", integrity=False, timeout=True, seconds=1.2, error_label=None)
    assert resolve(plan.expect, _outcome()) is Expect.INTEGRITY
    assert resolve(plan.expect, timed_out) is Expect.TIMEOUT
    assert judge("drop", "all_reduce", 2, 0, 1, plan, [], [_outcome(applied=1), timed_out])["passed"]
    assert plan.expect is Expect.INTEGRITY_OR_TIMEOUT


def _refused(**kw):
    return _outcome(**{"type": "ConfigError", "integrity": False, "refused": True, "error_label": None,
                       "label": None, "keys_used": 0, **kw})


def _judge_setup(outcomes):
    plan = Plan(SetupRule("flip", 0, 1, 1), 1, Expect.REFUSED, 10.0)
    return judge("flip", "setup", 3, 0, 1, plan, [], outcomes)


def test_judge_passes_a_setup_every_rank_refused():
    row = _judge_setup([_refused(), _refused(applied=1), _refused()])
    assert row["passed"] and row["observed"] == "ConfigError on every rank, no key used", row


@pytest.mark.parametrize("outcomes,why", [
    ([_refused(), _refused(applied=1), {"status": "ok", "correct": True, "seconds": 0.1, "keys_used": 12}],
     "rank 2: the setup passed"),                                              # one rank went on
    ([_refused(keys_used=3), _refused(applied=1), _refused()], "sealed or opened"),
    ([_refused(), _refused(applied=1), _refused(type="PeerTimeoutError", refused=False)], "rank 2: PeerTimeoutError"),
    ([_refused(), _refused(applied=1), _refused(type="AdversaryError", refused=False)], "rank 2: AdversaryError"),
    ([_refused(), _refused(), _refused()], "never saw the setup message"),
    ([_refused(), _refused(applied=1), _refused(seconds=30.0)], "too late"),
    ([_refused(), _refused(applied=1, one_line=False), _refused()], "more than one line"),
])
def test_judge_fails_a_setup_that_was_not_refused_everywhere(outcomes, why):
    row = _judge_setup(outcomes)
    assert not row["passed"] and why in row["observed"], row


def test_labels_and_rules():
    label = FrameLabel("0->1", "all_reduce#3", 1, 2)
    assert str(label) == "link 0->1, collective all_reduce#3, step 1, segment 2"
    assert FrameLabel(**label.as_dict()) == label
    e = IntegrityError("bad tag", link="0->1", collective="all_reduce#3", step=1, segment=2)
    assert e.label == label and str(e) == f"bad tag ({label})"
    assert str(IntegrityError("closed", link="0->1")) == "closed (link 0->1, collective ?, step ?)"
    assert PeerTimeoutError("late", label=label).label == label
    with pytest.raises(ConfigError):
        Rule("melt", 0, 1)
    with pytest.raises(ConfigError):
        Rule("splice", 0, 1)            # needs a source
    with pytest.raises(ConfigError):
        Rule("drop", 0, 1, count=2)
    r = Rule("flip", 0, 1, nth=3, count=2)
    assert r.hits(0, 1, 3) and r.hits(0, 1, 4) and not r.hits(0, 1, 5) and not r.hits(1, 0, 3)
    for bad in (dict(attack="melt", src=0, dst=1), dict(attack="flip", src=1, dst=1),
                dict(attack="reorder", src=0, dst=1, nth=0), dict(attack="replay", src=0, dst=1, sessions_back=0)):
        with pytest.raises(ConfigError):
            SetupRule(**bad)
    assert cases(["flip", "swap", "delay"], ["all_reduce", "setup"]) == \
        [("flip", "all_reduce"), ("delay", "all_reduce"), ("flip", "setup"), ("swap", "setup")]
