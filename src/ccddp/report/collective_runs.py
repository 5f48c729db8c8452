"""Summarize repeated ``ccddp bench collectives`` runs: the table BENCHMARKS.md shows.

Each run's JSON holds one row per (op, size, implementation) with its median time and
its paired ratios to the other implementations of the same run (the implementations take
turns call by call; see ``ccddp.bench.collectives``). This groups rows by (op, world
size, bytes, dtype) over runs and keeps, per implementation, each run's median time and
CPU per rank, and for chosen pairs each run's paired ratio -- so every number in the
table comes from the JSON.

Example::

    rows = summarize(load_results(["runs/collectives"]))     # folders of bench collectives JSON
    print("\\n".join(markdown_table(rows)))

The runs kept under ``benchmarks/`` are folded into ``runs.json`` files;
``scripts/collectives_table.py`` reads those.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ccddp.config import MAX_RESULTS_BYTES, RESULTS_DEPTH, read_json
from ccddp.errors import ConfigError

SCHEMA = "ccddp.bench.collectives/1"
# (numerator, denominator) pairs the collective targets are stated in: secure over gloo, naive over secure.
PAIRS = (("secure", "gloo"), ("secure-naive", "secure"))


def load_results(paths: Iterable[str | Path]) -> list[dict]:
    """The ``ccddp bench collectives --json`` results in ``paths`` (files, or directories
    searched for ``*.json``), sorted by path so runs keep their order."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    results = []
    for f in files:
        data = read_json(f, what=str(f), max_bytes=MAX_RESULTS_BYTES, max_depth=RESULTS_DEPTH)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ConfigError(f"{f} is not a `ccddp bench collectives --json` result ({SCHEMA})")
        results.append(data)
    if not results:
        raise ConfigError("no benchmark results found")
    return results


def summarize(results: Iterable[dict], pairs: Sequence[tuple[str, str]] = PAIRS) -> list[dict[str, Any]]:
    """One row per (op, world size, bytes, dtype), in first-seen order: per
    implementation the runs' median times (``us_by_run``) and CPU per rank
    (``cpu_us_by_run``), and per pair in ``pairs`` present in the runs each run's paired
    ratio (``by_run``) and their median (``median``)."""
    groups: dict[tuple, list[dict[str, dict]]] = {}
    for res in results:
        by_key: dict[tuple, dict[str, dict]] = {}
        for r in res["rows"]:
            by_key.setdefault((r["op"], r["world_size"], r["bytes"], r["type"]), {})[r["impl"]] = r
        for key, impls in by_key.items():
            groups.setdefault(key, []).append(impls)
    rows = []
    for (op, n, nbytes, dtype), runs in groups.items():
        impls: dict[str, dict] = {}
        for run in runs:
            for impl, r in run.items():
                d = impls.setdefault(impl, {"us_by_run": [], "cpu_us_by_run": []})
                d["us_by_run"].append(r["time_us"])
                d["cpu_us_by_run"].append(r.get("cpu_us_per_rank"))
        ratios = {}
        for num, den in pairs:
            by_run = [run[num]["paired_ratios"][den] for run in runs
                      if den in run.get(num, {}).get("paired_ratios", {})]
            if by_run:
                ratios[f"{num}/{den}"] = {"by_run": by_run, "median": statistics.median(by_run)}
        rows.append({"op": op, "world_size": n, "bytes": nbytes, "type": dtype, "runs": len(runs),
                     "impls": impls, "paired": ratios})
    return rows


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _runs(values: list, scale: float = 1.0, fmt: str = "{:.0f}") -> str:
    return " / ".join("–" if v is None else fmt.format(v * scale) for v in values)


def markdown_table(rows: list[dict], impls: Sequence[str] = ("gloo", "ring", "secure-naive", "secure"),
                   pairs: Sequence[tuple[str, str]] = PAIRS) -> list[str]:
    """Markdown lines: world size, size, runs, each implementation's median time by run
    (us) and CPU per rank by run (ms), and each pair's paired ratio by run with its
    median in bold; a footnote under the table says what a paired ratio is."""
    names = [f"{a}/{b}" for a, b in pairs]
    head = (["world size", "size", "runs"] + [f"{i} us" for i in impls] + [f"{i} CPU ms/rank" for i in impls]
            + [f"{n} (paired)" for n in names])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["world_size"]), _size(r["bytes"]), str(r["runs"])]
        cells += [_runs(r["impls"][i]["us_by_run"]) if i in r["impls"] else "–" for i in impls]
        cells += [_runs(r["impls"][i]["cpu_us_by_run"], 1e-3, "{:.1f}") if i in r["impls"] else "–"
                  for i in impls]
        for n in names:
            p = r["paired"].get(n)
            cells.append(f"{_runs(p['by_run'], fmt='{:.2f}')} (**{p['median']:.2f}**)" if p else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", PAIRED_FOOTNOTE]


PAIRED_FOOTNOTE = ("(paired): per run, the median over iterations of one implementation's time / the "
                   "other's in the same iteration (they took turns call by call), so it differs from the "
                   "ratio of the medians in the us columns; bold: the median over runs.")

__all__ = ["PAIRS", "load_results", "summarize", "markdown_table"]
