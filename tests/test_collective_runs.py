"""The repeated-runs collectives table: grouping by (op, world size, size), per-run values
kept in run order, paired ratios taken from the runs (not recomputed from medians), and
the script that prints it from JSON files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ccddp.errors import ConfigError
from ccddp.report.collective_runs import load_results, markdown_table, summarize

ROOT = Path(__file__).resolve().parents[1]


def row(impl: str, us: float, paired: dict, *, n: int = 2, nbytes: int = 64 << 20, cpu: float = 1000.0) -> dict:
    return {"op": "all_reduce", "impl": impl, "bytes": nbytes, "type": "float32", "world_size": n,
            "time_us": us, "cpu_us_per_rank": cpu, "paired_ratios": paired}


def result(*rows: dict) -> dict:
    return {"schema": "ccddp.bench.collectives/1", "machine": {}, "rows": list(rows)}


RUNS = [
    result(row("gloo", 100, {"secure": 0.8, "secure-naive": 0.75}),
           row("secure-naive", 130, {"gloo": 1.3, "secure": 1.05}),
           row("secure", 125, {"gloo": 1.25, "secure-naive": 0.95}),
           row("gloo", 10, {"secure": 0.9}, n=4, nbytes=1 << 20), row("secure", 11, {"gloo": 1.1}, n=4, nbytes=1 << 20)),
    result(row("gloo", 200, {"secure": 0.9, "secure-naive": 0.85}),
           row("secure-naive", 230, {"gloo": 1.2, "secure": 0.98}),
           # The ratio of this run's medians would be 1.0; the paired ratio is what counts.
           row("secure", 200, {"gloo": 1.12, "secure-naive": 1.02})),
    result(row("gloo", 110, {"secure": 0.85, "secure-naive": 0.8}),
           row("secure-naive", 140, {"gloo": 1.25, "secure": 1.10}),
           row("secure", 120, {"gloo": 1.18, "secure-naive": 0.9})),
]


def test_rows_keep_each_run_and_take_paired_ratios_from_the_runs():
    rows = summarize(RUNS)
    assert [(r["world_size"], r["bytes"], r["runs"]) for r in rows] == [(2, 64 << 20, 3), (4, 1 << 20, 1)]
    big = rows[0]
    assert big["impls"]["gloo"]["us_by_run"] == [100, 200, 110]
    assert big["paired"]["secure/gloo"] == {"by_run": [1.25, 1.12, 1.18], "median": 1.18}
    assert big["paired"]["secure-naive/secure"] == {"by_run": [1.05, 0.98, 1.10], "median": 1.05}
    # A run without secure-naive contributes no naive/secure ratio.
    assert rows[1]["paired"] == {"secure/gloo": {"by_run": [1.1], "median": 1.1}}


def test_markdown_table_shows_runs_and_bold_medians():
    lines = markdown_table(summarize(RUNS), impls=("gloo", "secure-naive", "secure"))
    assert lines[0].startswith("| world size | size | runs | gloo us |")
    assert "| 2 | 64 MiB | 3 | 100 / 200 / 110 |" in lines[2]
    assert "1.25 / 1.12 / 1.18 (**1.18**)" in lines[2]
    assert "| 4 | 1 MiB | 1 | 10 | – | 11 |" in lines[3] and lines[3].endswith("| – |")
    assert lines[-1].startswith("(paired): per run, the median over iterations")


def test_other_files_are_refused(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema": "ccddp.train/1"}))
    with pytest.raises(ConfigError, match="not a `ccddp bench collectives"):
        load_results([tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no benchmark results"):
        load_results([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_results([tmp_path / "missing.json"])


def test_script_prints_the_table_from_a_directory(tmp_path):
    for i, r in enumerate(RUNS):
        (tmp_path / f"r{i}.json").write_text(json.dumps(r))
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "collectives_table.py"), str(tmp_path),
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "(**1.18**)" in proc.stdout
    assert json.loads(out.read_text())[0]["paired"]["secure/gloo"]["median"] == 1.18
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "collectives_table.py"), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "collectives_table:" in bad.stderr
