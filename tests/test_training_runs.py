"""The CC-on/CC-off run table: grouping by configuration, per-variant medians, the paired
ratio of variants measured in turns (with its interval), the ratios of medians (plain and
forward-normalized), and the script that prints it from JSON files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ccddp.report.training_runs import compare_runs, markdown_table

ROOT = Path(__file__).resolve().parents[1]


def result(cc: str, total: float, forward: float, *, schedule: str = "pipelined", n: int = 2,
           workload: str = "bert-base", batch: int = 4, sha: str = "a", crypto: float = 0.0) -> dict:
    return {"schema": "ccddp.train/1", "workload": workload, "size": "default", "world_size": n,
            "shapes": {"workload": workload, "batch_size": batch, "seq_len": 128,
                       "dtype": "float32", "num_params": 10},
            "cc": cc, "schedule": schedule if cc == "on" else None, "bucket_cap_mb": None,
            "summary": {"total_ms": total, "forward_ms": forward, "crypto_busy_ms": crypto},
            "allreduce_calls_per_iteration": 14, "seals_per_rank": 28 if cc == "on" else 0,
            "param_sha256": sha}


def test_ratios_use_medians_over_runs_and_forward_normalizes_machine_drift():
    # Run 2 of every variant ran on a machine 50 % slower throughout (forward too).
    runs = [result("off", 1000, 200), result("off", 1500, 300), result("off", 1100, 200),
            result("on", 1100, 200, crypto=40), result("on", 1650, 300, crypto=60),
            result("on", 1210, 200, crypto=50),
            result("on", 1200, 200, schedule="naive"), result("on", 1800, 300, schedule="naive"),
            result("on", 1200, 200, schedule="naive")]
    [row] = compare_runs(runs)
    assert row["workload"] == "bert-base" and row["world_size"] == 2
    assert row["shapes"] == {"batch_size": 4, "seq_len": 128, "dtype": "float32"}
    assert row["seals_per_rank"] == 28 and row["distinct_param_sha256"] == 1
    off, pipe, naive = (row["variants"][v] for v in ("off", "pipelined", "naive"))
    assert off["ms_by_run"] == [1000, 1500, 1100] and off["ms"] == 1100 and off["runs"] == 3
    assert pipe["ms"] == 1210 and pipe["ratio"] == pytest.approx(1210 / 1100)
    assert pipe["crypto_busy_ms"] == 50
    # total/forward by run: off 5.0, 5.0, 5.5 -> 5.0; pipelined 5.5, 5.5, 6.05 -> 5.5
    assert pipe["ratio_fwd"] == pytest.approx(1.10)
    assert naive["ratio"] == pytest.approx(1200 / 1100) and naive["ratio_fwd"] == pytest.approx(1.2)


def test_configurations_are_kept_apart_and_need_a_cc_off_run():
    runs = [result("off", 1000, 200), result("on", 1100, 200),
            result("off", 2000, 400, n=3), result("on", 2600, 400, n=3, sha="b"),
            result("on", 900, 100, batch=8)]           # no CC-off run of batch 8
    rows = compare_runs(runs)
    assert [(r["world_size"], r["shapes"]["batch_size"]) for r in rows] == [(2, 4), (3, 4)]
    mixed = [result("off", 1000, 200, workload="bert-base", n=3), result("off", 900, 200, workload="resnet50"),
             result("off", 800, 200, workload="bert-base")]
    assert [(r["workload"], r["world_size"]) for r in compare_runs(mixed, order=["resnet50", "bert-base"])] == [
        ("resnet50", 2), ("bert-base", 2), ("bert-base", 3)]
    assert rows[1]["variants"]["pipelined"]["ratio"] == pytest.approx(1.3)
    assert rows[1]["distinct_param_sha256"] == 2


def test_markdown_table_has_one_line_per_configuration_and_dashes_for_missing_schedules():
    lines = markdown_table(compare_runs([result("off", 1000, 200), result("on", 1100, 200, crypto=42)]))
    assert len(lines) == 5 and lines[0].count("|") == lines[2].count("|")
    assert lines[4].startswith("¹ Variants that took turns in one launch: the Hodges-Lehmann median of per-round ratios")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:5] == ["bert-base", "2", "batch_size=4, seq_len=128, dtype=float32", "1",
                         "1000 (1000)"]
    assert cells[5] == "-" and cells[6] == "1100 (1100)"      # naive missing, pipelined there
    assert cells[7:13] == ["-", "-", "-", "-", "1.10×", "1.10×"]  # not in turns: no paired ratio
    assert cells[13:15] == ["-", "42"]                        # crypto busy ms per schedule
    # A ratio of medians below 1 has no interval: never shown as a speed-up.
    lines = markdown_table(compare_runs([result("off", 1000, 200), result("on", 950, 200)]))
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[11:13] == ["no measurable difference", "no measurable difference"]


def _in_turns(launch: str, off: list[float], on: list[float]) -> list[dict]:
    """CC-off and CC-on results of one launch in which they took turns, round by round."""
    out = []
    for cc, times in (("off", off), ("on", on)):
        r = result(cc, sorted(times)[len(times) // 2], 200)
        r["pairing"] = {"launch": launch, "alternation": "iteration", "variants": ["off", "on:pipelined"]}
        r["iterations"] = [{"round": i, "warmup": False, "total_ms": t} for i, t in enumerate(times)]
        out.append(r)
    return out


def test_runs_in_turns_give_a_paired_ratio_with_its_interval_pooled_over_launches():
    # Two launches of 5 rounds; the machine's speed changes from round to round (and 2x
    # between launches), CC-on costs 10 % in every round.
    a_off = [1000, 1400, 900, 1200, 1100]
    b_off = [2000, 2100, 1900, 2500, 2300]
    runs = _in_turns("a", a_off, [1.1 * t for t in a_off]) + _in_turns("b", b_off, [1.1 * t for t in b_off])
    [row] = compare_runs(runs)
    p = row["variants"]["pipelined"]["paired"]
    assert p["pairs"] == 10 and p["estimate"] == pytest.approx(1.1)
    assert p["low"] == pytest.approx(1.1) and p["high"] == pytest.approx(1.1)
    # Runs of another launch than CC-off's are not paired with it.
    stray = _in_turns("c", a_off, a_off)[1]
    [row] = compare_runs(_in_turns("a", a_off, a_off)[:1] + [stray])
    assert row["variants"]["pipelined"]["paired"] is None


def test_script_prints_the_table_and_writes_json(tmp_path):
    for i, r in enumerate([result("off", 1000, 200), result("on", 1150, 200)]):
        (tmp_path / f"r{i}.json").write_text(json.dumps(r))
    out = tmp_path / "table.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "training_table.py"), str(tmp_path),
                        "--json", str(out)], capture_output=True, text=True, check=True)
    assert "| bert-base | 2 |" in p.stdout and "1.15" in p.stdout
    assert json.loads(out.read_text())[0]["variants"]["pipelined"]["ms"] == 1150
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "training_table.py"),
                          str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

