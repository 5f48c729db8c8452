"""The paper's operation count, checked against what each CC-on run counted.

A ring all-reduce over n ranks costs every rank n-1 reduce-scatter and n-1 all-gather
steps, each one seal and one open: 2(n-1) seals + 2(n-1) opens = 4(n-1) AES-GCM
operations (paper §IV-B); an all-reduce that two ranks run as one exchange (issue 42,
counted per iteration as ``exchanges``) costs one seal and one open. DDP launches k all-reduces (buckets) per iteration, so a rank
does 4·k·(n-1) per iteration. ccddp counts a seal per ring-step message whatever its
segmentation, so the naive and the pipelined schedule must both show exactly that;
a mismatch means an all-reduce was skipped, repeated, or bypassed the secure path.

Example::

    from ccddp.report.crypto_ops import check_run

    row = check_run(run)          # one entry of results["runs"]
    row["expected_ops"], row["ok"]   # 4*k*(n-1), True / False / None (cannot tell)
"""

from __future__ import annotations

from typing import Any, Mapping

from ccddp.report.results import Results

OK_MARK = "✅"
FAIL_MARK = "❌"
UNKNOWN_MARK = "?"


def expected_seals(k: int, n: int, exchanges: int = 0) -> int:
    """Seals (= opens) per rank per iteration: 2·k·(n-1), less n-1 for each of the ``k``
    all-reduces that two ranks ran as one exchange (issue 42: one seal, one open each).

    Example::

        expected_seals(142, 4)   # 852; with opens, the paper's 4*142*3 = 1704
        expected_seals(5, 2, 1)  # 9: four ring all-reduces and one exchange
    """
    return (2 * k - exchanges) * max(n - 1, 0)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def check_run(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The operation check of one CC-on run, or None for CC-off / unusable runs.

    ``ok`` is True when, in the steady iteration (and in every measured iteration the
    result lists), seals and opens per rank both equal 2·k·(n-1) for that iteration's k;
    False on any mismatch (even if the other count is missing); None when a count is
    missing and nothing present is wrong.

    Example::

        check_run({"cc": "on", "status": "ok", "world_size": 2, "key": "x", "result": {
            "allreduce_calls_per_iteration": 5, "seals_per_rank": 10, "opens_per_rank": 10}})
        # -> {..., "expected_ops": 20, "ok": True}
    """
    if run.get("cc") != "on" or not Results.is_ok(run):
        return None
    res = run["result"]
    n = _int(run.get("world_size")) or _int(res.get("world_size"))
    k = _int(res.get("allreduce_calls_per_iteration"))
    seals, opens = _int(res.get("seals_per_rank")), _int(res.get("opens_per_rank"))
    row: dict[str, Any] = {
        "key": run.get("key") or "/".join(str(x) for x in Results.key_of(run) if x is not None),
        "workload": run.get("workload"), "world_size": n, "schedule": run.get("schedule"),
        "allreduces": k, "seals": seals, "opens": opens,
        "ops": None if seals is None or opens is None else seals + opens,
        "expected_seals": None, "expected_ops": None, "iterations_checked": 0, "ok": None,
        "mismatch": None,
    }
    if n is None or k is None:
        return row
    x = _int(res.get("exchanges_per_iteration")) or 0
    exp = expected_seals(k, n, x)
    row["expected_seals"], row["expected_ops"] = exp, 2 * exp
    # A count that is there and wrong fails even if the other one is missing; only
    # "nothing wrong but something missing" is undecided.
    wrong = [f"{v} {what}" for v, what in ((seals, "seals"), (opens, "opens"))
             if v is not None and v != exp]
    ok: bool | None = False if wrong else (None if seals is None or opens is None else True)
    if wrong:
        row["mismatch"] = f"steady iteration: {', '.join(wrong)}, expected {exp} each"
    # Every measured iteration must agree too: a drift hidden by the last step (e.g. one
    # iteration with a plaintext fallback) must not pass.
    for it in res.get("iterations") or []:
        if not isinstance(it, Mapping) or it.get("warmup"):
            continue
        ki, si, oi = _int(it.get("allreduce_calls")), _int(it.get("seals")), _int(it.get("opens"))
        if ki is None or si is None or oi is None:
            continue
        row["iterations_checked"] += 1
        e = expected_seals(ki, n, _int(it.get("exchanges")) or 0)
        if (si, oi) != (e, e) and ok is not False:
            ok = False
            row["mismatch"] = (f"step {it.get('step', '?')}: {si} seals, {oi} opens for "
                               f"{ki} all-reduces, expected {e} each")
    row["ok"] = ok
    return row


def check_runs(results: Mapping[str, Any] | Results) -> list[dict[str, Any]]:
    """:func:`check_run` for every CC-on ok run, in file order."""
    res = results if isinstance(results, Results) else Results(results)
    return [row for r in res.runs if (row := check_run(r)) is not None]


def mark(ok: bool | None) -> str:
    """The table cell for a check: ✅, ❌ or ? (counts missing)."""
    return UNKNOWN_MARK if ok is None else (OK_MARK if ok else FAIL_MARK)


__all__ = ["expected_seals", "check_run", "check_runs", "mark", "OK_MARK", "FAIL_MARK",
           "UNKNOWN_MARK"]
