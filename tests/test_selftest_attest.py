"""``ccddp selftest``'s attestation rows (issue 41): evidence replay, evidence swapped in
from another rank, and a policy miss, each refused on every rank by the claim it breaks,
with the judge shown to fail a row whose outcomes are not that refusal."""

from __future__ import annotations

import pytest

from ccddp.bench.selftest_options import ATTACKS, ATTESTATION_ATTACKS, COLLECTIVES, cases, check_lists
from thread_ranks import run_thread_ranks as run_ranks


def test_attestation_rows_are_cases_of_their_own():
    assert "attestation" in COLLECTIVES and "policy-miss" in ATTACKS
    assert cases(list(ATTACKS), ["attestation"]) == [("replay", "attestation"), ("swap", "attestation"),
                                                     ("policy-miss", "attestation")]
    # policy-miss strikes nothing else; the data and setup attacks do not strike attestation.
    assert cases(["policy-miss"], ["all_reduce", "setup"]) == []
    with pytest.raises(Exception, match="no case"):
        check_lists(["flip"], ["attestation"])


def _outcome(claim="report_data", message="rank 1: SEV-SNP attestation refused", **kw):
    return {"status": "error", "type": "AttestationError", "message": message, "one_line": True, "claim": claim,
            "typed": True, "seconds": 0.1, "keys_used": 0, **kw}


@pytest.mark.parametrize("outcomes, why", [
    ([_outcome(), {"status": "ok", "correct": True, "keys_used": 3}], "the group formed"),
    ([_outcome(), _outcome(claim="measurement")], "claim 'measurement'"),
    ([_outcome(), _outcome(type="EstablishmentError")], "EstablishmentError"),
    ([_outcome(), _outcome(message="rank 0: refused")], "does not name rank 1"),
    ([_outcome(), _outcome(keys_used=1)], "frames sealed or opened"),
    ([_outcome(), _outcome(seconds=60.0)], "too late"),
])
def test_the_judge_fails_anything_but_a_refusal_everywhere(outcomes, why):
    from ccddp.bench.selftest import judge_attestation

    assert judge_attestation("replay", 2, [], [_outcome(), _outcome()], 10)["passed"]
    row = judge_attestation("replay", 2, [], outcomes, 10)
    assert not row["passed"] and why in row["observed"], row
    row = judge_attestation("swap", 2, ["rank 1: NoEvidenceError: none"], [{"status": "skipped"}] * 2, 10)
    assert not row["passed"] and "did not form" in row["observed"]


def _rows(rank, n):
    from ccddp.bench.selftest import run_selftest
    from ccddp.comm import CommSettings
    from ccddp.crypto.keys import GroupSecret

    settings = CommSettings(impl="secure", segment_bytes=1024, timeout_s=15)
    return run_selftest(list(ATTESTATION_ATTACKS), ["attestation"], settings, secret=GroupSecret(bytes(range(32))))


@pytest.mark.parametrize("n", [2, 3])
def test_selftest_attestation_rows_pass_on_real_ranks(n):
    res = run_ranks(_rows, n, timeout=240)
    rows = res[0]
    assert all(other == rows for other in res[1:]), "every rank judges alike"
    assert [(r["attack"], r["collective"]) for r in rows] == cases(list(ATTESTATION_ATTACKS), ["attestation"])
    for r in rows:
        assert r["passed"], r
        assert repr(ATTESTATION_ATTACKS[r["attack"]]) in r["observed"] and r["world_size"] == n
