"""Compare training runs: CC-on against CC-off, per workload.

``ccddp train --cc off,on --json`` (variants in turns in one launch),
``scripts/validation_runs.py`` and any set of ``ccddp train --json`` files leave results;
this turns them into the table BENCHMARKS.md shows, so every number there comes from the
JSON. Runs of one configuration (workload, shapes, world size) are grouped and, per
variant (``off`` or the CC-on schedule), each run's median iteration is kept.

Ratios per variant:

- ``paired``: where the variant and CC-off took turns in one launch, the median of the
  per-round ratios over every such launch's rounds, with its 95 % interval
  (:mod:`ccddp.stats`); None when no launch measured them in turns;
- ``ratio``: median over runs of the variant / median over runs of CC-off;
- ``ratio_fwd``: the same for each run's iteration time divided by its own forward time.
  The forward pass does the same work in every variant (no gradient traffic; only
  buffer broadcasts, at most a few hundred kilobytes), so this takes out most of the
  machine's speed, which drifts between runs (the same variant's runs differ by
  10-40 % on a shared VM) far more than the iteration/forward proportion does.

Tables print every ratio through :func:`ccddp.stats.ratio_text`: one without an
interval (separate launches) is never shown below 1.

Example::

    from ccddp.runs import load_runs
    rows = compare_runs(load_runs(["runs/training"]))     # folders of ccddp train JSON
    print("\\n".join(markdown_table(rows)))

The runs kept under ``benchmarks/`` are folded into ``runs.json`` files;
``scripts/training_table.py`` reads those.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from ccddp.report.results import round_ms
from ccddp.runs import run_key, settings_of
from ccddp.stats import METHOD, Interval, paired_ratio, ratio_text

SHAPE_KEYS = ("batch_size", "seq_len", "image_size", "dtype")


def variant(run: dict) -> str:
    """``off`` or the CC-on schedule a run used."""
    return "off" if run.get("cc") == "off" else str(run.get("schedule"))


def _by_run(runs: list[dict], key: str) -> list[float]:
    return [float(r["summary"][key]) for r in runs]


def _medians(runs: list[dict]) -> tuple[list[float], float, float]:
    """(each run's median iteration, their median, median of iteration / forward)."""
    totals = _by_run(runs, "total_ms")
    per_fwd = [t / f for t, f in zip(totals, _by_run(runs, "forward_ms"))]
    return totals, statistics.median(totals), statistics.median(per_fwd)


def _launch(run: dict) -> str | None:
    pairing = run.get("pairing")
    return pairing.get("launch") if isinstance(pairing, dict) else None


def paired(runs: list[dict], off: list[dict]) -> Interval | None:
    """The variant's paired ratio to CC-off over every launch that ran both in turns."""
    num, den = {}, {}
    for r in runs:
        match = [o for o in off if _launch(o) is not None and _launch(o) == _launch(r)]
        if match:
            num.update({(_launch(r), k): v for k, v in round_ms(r).items()})
            den.update({(_launch(r), k): v for k, v in round_ms(match[0]).items()})
    return paired_ratio(num, den) if num else None


def compare_runs(runs: Iterable[dict], order: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per configuration that has CC-off runs (workloads in ``order`` first, in
    that order, then the rest as first seen; then by world size): per
    variant the runs' median iterations (``ms_by_run``), their median (``ms``), ``ratio``
    and ``ratio_fwd`` to CC-off (see the module docstring), the median crypto busy time,
    and the configuration's all-reduces and seals per iteration and how many distinct
    final-parameter hashes its runs ended with (1: every variant bit-identical)."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in runs:
        groups.setdefault(run_key(r), {}).setdefault(variant(r), []).append(r)
    rows = []
    for key, by_variant in groups.items():
        off = by_variant.get("off")
        if not off:
            continue
        _, off_ms, off_fwd = _medians(off)
        first = off[0]
        on = [r for v, rs in by_variant.items() if v != "off" for r in rs]
        row: dict[str, Any] = {
            "workload": first["workload"], "world_size": int(first["world_size"]),
            "shapes": {k: v for k, v in settings_of(first).items() if k in SHAPE_KEYS},
            "allreduce_calls_per_iteration": first.get("allreduce_calls_per_iteration"),
            "seals_per_rank": on[0].get("seals_per_rank") if on else None,
            "distinct_param_sha256": len({r.get("param_sha256") for rs in by_variant.values()
                                          for r in rs}),
            "variants": {},
        }
        for v, rs in sorted(by_variant.items(), key=lambda kv: (kv[0] != "off", kv[0])):
            totals, ms, fwd = _medians(rs)
            pr = paired(rs, off) if v != "off" else None
            row["variants"][v] = {
                "runs": len(rs), "ms_by_run": totals, "ms": ms, "ratio": ms / off_ms,
                "ratio_fwd": fwd / off_fwd,
                "paired": None if pr is None else {"estimate": pr.estimate, "low": pr.low, "high": pr.high,
                                                   "pairs": pr.n},
                "crypto_busy_ms": statistics.median(_by_run(rs, "crypto_busy_ms")),
            }
        rows.append(row)
    rank = {w: i for i, w in enumerate(order)}
    return sorted(rows, key=lambda r: (rank.get(r["workload"], len(rank)), r["world_size"]))


def _paired(v: dict) -> Interval | None:
    p = v.get("paired")
    return Interval(p["estimate"], p["low"], p["high"], p["pairs"]) if p else None


def markdown_table(rows: list[dict[str, Any]], schedules: tuple[str, ...] = ("naive", "pipelined")) -> list[str]:
    """The rows as a markdown table: each variant's median (runs' medians in brackets),
    the paired ratio to CC-off with its 95 % interval where the variants took turns, the
    ratio of medians and its forward-normalized form, and the median crypto busy ms per
    iteration for ``schedules``; a footnote says how the ratios are computed."""
    head = ["workload", "n", "shapes (per rank)", "runs", "CC-off ms (by run)"]
    for s in schedules:
        head += [f"{s} ms (by run)"]
    for s in schedules:
        head += [f"{s} / off, paired ¹", f"{s} / off ²", f"{s} / off, forward-normalized ²"]
    head += [f"crypto busy ms ({s})" for s in schedules]
    head += ["all-reduces/iter", "seals/rank/iter", "distinct param_sha256"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        vs = row["variants"]

        def ms(v: str) -> str:
            if v not in vs:
                return "-"
            return f"{vs[v]['ms']:.0f} ({' / '.join(f'{x:.0f}' for x in vs[v]['ms_by_run'])})"

        def unpaired(x: float) -> str:
            return ratio_text(Interval(x, None, None, 0)).replace(" (not measured in turns, no interval)", "")

        cells = [row["workload"], str(row["world_size"]),
                 ", ".join(f"{k}={v}" for k, v in row["shapes"].items()),
                 str(vs["off"]["runs"]), ms("off")]
        cells += [ms(s) for s in schedules]
        for s in schedules:
            if s not in vs:
                cells += ["-", "-", "-"]
                continue
            p = _paired(vs[s])
            cells += [ratio_text(p) if p else "-", unpaired(vs[s]["ratio"]), unpaired(vs[s]["ratio_fwd"])]
        cells += [f"{vs[s]['crypto_busy_ms']:.0f}" if s in vs else "-" for s in schedules]
        cells += [str(row["allreduce_calls_per_iteration"]), str(row["seals_per_rank"]),
                  str(row["distinct_param_sha256"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", FOOTNOTE]


FOOTNOTE = (f"¹ Variants that took turns in one launch: the {METHOD}; \"-\": no launch ran them in turns. "
            "² Median over runs of each run's median iteration (or of iteration / forward), CC-on over CC-off: "
            "no interval, so a value below 1 is written \"no measurable difference\".")
