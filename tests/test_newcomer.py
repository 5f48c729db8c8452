"""What a new user meets on the first pass (issue 43): the README's first ``ccddp train``
shows the 95 % interval it promises, ``--master-addr`` reaches torchrun, mistakes and
misfits are answered before torch or torchrun starts, every longer command says what it
is doing at once, one way to print a ratio, tables within 120 columns with every column
explained, and the README's numbers come from one file."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ccddp.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _ccddp(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ccddp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def _first_contact_commands() -> list[str]:
    """The commands of the README's "First contact" block, comments cut."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## First contact", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


# -- 1. the first `ccddp train` gives the interval the README promises -----------------------------

def test_a_comparison_by_default_measures_enough_rounds_for_an_interval():
    from ccddp.bench.options import COMPARE_DEFAULTS, DEFAULT_STEPS, build_parser, check
    from ccddp.stats import MIN_SAMPLES

    assert COMPARE_DEFAULTS["steps"] == MIN_SAMPLES
    args = build_parser().parse_args(["--workload", "graphsage", "--cc", "off,on"])
    check(args)
    assert (args.steps, args.budget, args.precision) == (MIN_SAMPLES, COMPARE_DEFAULTS["budget"],
                                                        COMPARE_DEFAULTS["precision"])
    one = build_parser().parse_args(["--workload", "graphsage", "--cc", "on"])
    check(one)
    assert (one.steps, one.budget, one.precision) == (DEFAULT_STEPS, None, None)
    given = build_parser().parse_args(["--workload", "graphsage", "--cc", "off,on", "--steps", "4"])
    check(given)     # what the user gives is kept
    assert (given.steps, given.budget, given.precision) == (4, None, None)


def test_the_readme_first_train_command_prints_a_95_percent_interval(tmp_path):
    train = [c for c in _first_contact_commands() if c.startswith("ccddp train")]
    assert train, "the README's first contact has no ccddp train command"
    out = tmp_path / "t.json"
    r = _ccddp(*shlex.split(train[0])[1:], "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert min(run["pairing"]["rounds"] for run in runs) >= 6       # the fewest rounds with a 95 % interval
    ratio_line = next(line for line in r.stdout.splitlines() if "on:pipelined" in line and "│" in line)
    assert "no interval" not in ratio_line and re.search(r"\(\d+\.\d\d–\d+\.\d\d\)", ratio_line), r.stdout
    assert re.search(r"^  measured \d+ rounds per variant: stopped at ", r.stdout, re.M), r.stdout


def test_a_budgeted_run_prints_its_first_rounds_then_a_line_a_second(monkeypatch):
    from types import SimpleNamespace

    import ccddp.bench.train as train

    clock = [100.0]
    monkeypatch.setattr(train.time, "monotonic", lambda: clock[0])
    t = SimpleNamespace(args=SimpleNamespace(budget=10.0, steps=6), last_shown=0.0)
    shown = []
    for r in [None, None] + list(range(20)):
        clock[0] += 0.1
        shown.append(train.Trainer._due(t, r))
    assert shown[:8] == [True] * 8                   # warm-up and the first 6 rounds
    assert sum(shown[8:]) == 1                       # then one line in the next 1.4 s
    fixed = SimpleNamespace(args=SimpleNamespace(budget=None, steps=20), last_shown=0.0)
    assert all(train.Trainer._due(fixed, r) for r in range(20))


# -- 4. --master-addr reaches torchrun -------------------------------------------------------------

SECRET = "04fccafb0452801fd7829c2113e85de94146f84ef090b1f880c47b8dcf90fec9"


def test_train_passes_master_addr_to_torchrun(monkeypatch, capsys):
    import ccddp.bench.launch as launch

    seen: list[list[str]] = []

    def fake_supervised(cmd, env, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(launch, "supervised", fake_supervised)
    monkeypatch.setenv("CCDDP_GROUP_SECRET", SECRET)
    assert main(["train", "--workload", "graphsage", "--size", "tiny", "--cc", "on", "--world-size", "1",
                 "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29555"]) == 0
    (cmd,) = seen
    assert cmd[1:3] == ["-m", launch.AGENT]
    assert "--master-addr=10.1.2.3" in cmd and "--master-port=29555" in cmd and "--node-rank=1" in cmd
    assert not any(a.startswith("--master-addr=127.") for a in cmd)


def test_torchrun_defaults_to_this_machine(monkeypatch):
    import ccddp.bench.launch as launch

    seen: list[list[str]] = []
    monkeypatch.setattr(launch, "supervised",
                        lambda cmd, env, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    launch.torchrun("ccddp.bench.train", [], nproc=2, env={})
    launch.torchrun("ccddp.bench.train", [], nproc=1, nnodes=2, master_addr="node0.example", master_port=29600,
                    env={})
    assert "--master-addr=127.0.0.1" in seen[0]
    assert "--master-addr=node0.example" in seen[1] and "--master-port=29600" in seen[1]


# -- 3. mistakes answered before torch or torchrun, in one line -----------------------------------

PROBE = """
import json, sys
from ccddp.cli import main
code = main(json.loads(sys.argv[1]))
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


@pytest.mark.parametrize("argv", [
    ["train", "--workload", "graphsage", "--device", "cuda"],
    ["bench", "collectives", "--device", "cuda"],
    ["characterize", "--quick", "--device", "cuda", "--out", "OUT"],
    ["train", "--workload", "graphsage", "--nnodes", "2", "--node-rank", "1", "--master-port", "29500"],
], ids=["train-cuda", "bench-cuda", "characterize-cuda", "train-no-master-addr"])
def test_no_gpu_and_no_master_addr_are_answered_before_torch_loads(argv, tmp_path):
    from ccddp.cli.preflight import gpu_device_files

    if "cuda" in argv and gpu_device_files():
        pytest.skip("this machine has a GPU device: torch's own check answers")
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "CCDDP_GROUP_SECRET": SECRET})
    assert p.stdout.split()[-2:] == ["NO-TORCH", "2"], p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: "), p.stderr
    assert ("--device cpu" in lines[0]) if "cuda" in argv else ("--master-addr HOST" in lines[0])


def test_more_ranks_than_cores_is_a_warning_with_the_numbers():
    import io

    from ccddp.cli.preflight import oversubscribed, warn_oversubscribed

    assert oversubscribed(2, cores=2) is None
    err = io.StringIO()
    text = warn_oversubscribed(64, "ccddp train", stream=err, cores=2)
    assert text and "64 local ranks on 2 CPU cores" in text and "--world-size 2" in text
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("ccddp train: warning: 64 local ranks")


def test_train_warns_before_it_launches_more_ranks_than_cores(monkeypatch, capsys):
    import ccddp.bench.launch as launch
    import ccddp.cli.preflight as preflight

    monkeypatch.setattr(preflight, "usable_cores", lambda: 2)
    monkeypatch.setattr(launch, "supervised", lambda cmd, env, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    assert main(["train", "--workload", "graphsage", "--size", "tiny", "--cc", "on", "--world-size", "3"]) == 0
    out, err = capsys.readouterr()
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == ["ccddp train: warning: 3 local ranks on 2 CPU cores: the ranks will take turns on the cores, "
                       "so the times measure that contention too (--world-size 2 or fewer gives each rank a core)"]


NO_SECRET_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("ccddp")
print("initialised")
"""


def test_the_backend_without_key_material_says_so_in_one_line_per_rank(tmp_path):
    # A script started without ccddp launch or a secret (as under plain torchrun: RANK,
    # WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): one line, naming both ways to fix it.
    from ccddp.bench.launch import free_port

    script = tmp_path / "demo.py"
    script.write_text(NO_SECRET_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCDDP_")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode != 0 and "initialised" not in p.stdout
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ccddp: error: rank 0: no key material") and "`ccddp launch`" in lines[0] \
        and "CCDDP_GROUP_SECRET" in lines[0], lines[0]


def test_a_bad_setting_stops_the_backend_in_one_line_per_rank(tmp_path):
    # README: "a bad setting stops the run with one line naming the setting" -- also
    # under plain torchrun, where no ccddp command prints the error for the script.
    from ccddp.bench.launch import free_port

    script = tmp_path / "demo.py"
    script.write_text(NO_SECRET_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCDDP_")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               CCDDP_GROUP_SECRET="5e0c9a3f7b1d2e8c4a6f0b9d3e7c1a5f8b2d6e0c4a9f3b7d1e5c8a2f6b0d4e9c",
               CCDDP_SETTINGS='{"segment_byte": 4096}')
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode != 0 and "initialised" not in p.stdout
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ccddp: error: CCDDP_SETTINGS: unknown setting 'segment_byte'"), lines[0]


# -- 5. every longer command says what it is doing before anything slow starts --------------------

class _Stop(Exception):
    pass


def _stop_at(monkeypatch, module: str, name: str, capsys, seen: list[str]):
    """Replace ``module.name`` with a function that records what was printed so far and stops
    the command there (as a ccddp error: exit 2)."""
    import importlib

    from ccddp.errors import CCDDPError

    def stop(*a, **k):
        seen.append(capsys.readouterr().out)
        raise CCDDPError("stopped by the test")

    monkeypatch.setattr(importlib.import_module(module), name, stop)


def test_bench_collectives_says_what_it_measures_before_timing_anything(monkeypatch, capsys):
    seen: list[str] = []
    _stop_at(monkeypatch, "ccddp.bench.machine", "aes_gcm_rate", capsys, seen)
    assert main(["bench", "collectives", "--world-size", "2", "--sizes", "1M,64M"]) == 2
    (before,) = seen
    assert before.splitlines()[0] == (
        "ccddp bench collectives: gloo, ring, secure-naive, secure in turns on 2 local ranks, all_reduce of 1M, "
        "64M: 2 warm-up + 10 measured calls each (96 calls); timing this machine's AES-GCM first, then starting "
        "the ranks")


def test_selftest_says_what_it_attacks_before_the_ranks_start(monkeypatch, capsys):
    seen: list[str] = []
    _stop_at(monkeypatch, "ccddp.bench.launch", "torchrun", capsys, seen)
    assert main(["selftest", "--world-size", "2", "--attacks", "flip,replay", "--collectives",
                 "all_reduce,broadcast"]) == 2
    assert seen[0].splitlines()[0].startswith("ccddp selftest: 2 attacks against 2 collectives on 2 local ranks")


def test_train_says_it_checks_the_model_before_loading_torch(monkeypatch, capsys):
    seen: list[str] = []
    _stop_at(monkeypatch, "ccddp.cli.cmd_train", "check_request", capsys, seen)
    assert main(["train", "--workload", "graphsage", "--cc", "off,on"]) == 2
    lines = seen[0].splitlines()
    assert lines[0].startswith("ccddp train: graphsage on 2 ranks, cc off, on:pipelined; 2 warm-up iterations per "
                               "variant, then rounds until every ratio's 95 % interval is within ±10 % (at least 6, "
                               "at most 10 s measured)"), lines
    assert lines[1] == "checking that graphsage fits in memory (loads torch and the model)"


def test_characterize_says_what_it_runs_and_its_bar_knows_the_total(monkeypatch, capsys, tmp_path):
    from ccddp.cli.cmd_characterize import BarProgress, plan_from

    seen: list[str] = []
    _stop_at(monkeypatch, "ccddp.bench.characterize", "characterize", capsys, seen)
    assert main(["characterize", "--quick", "--out", str(tmp_path / "q")]) == 2
    first = seen[0].splitlines()[0]
    assert re.match(r"ccddp characterize: \d+ launches to run: .* ranks, CC-off and CC-on", first), first
    import argparse

    from ccddp.cli import build_parser

    args: argparse.Namespace = build_parser(["characterize"]).parse_args(
        ["characterize", "--quick", "--out", str(tmp_path / "q")])
    plan = plan_from(args)
    with BarProgress(plan, total=4) as bar:
        assert bar.bar.tasks[0].total == 4           # not "0/None" while the first launch prepares


# -- 8. one way to print a ratio ------------------------------------------------------------------

def test_bench_collectives_prints_its_ratios_as_train_does():
    import io

    from ccddp.report.tables import print_collectives
    from ccddp.stats import Interval, ratio_text

    def row(impl, t, iv):
        return {"impl": impl, "op": "all_reduce", "bytes": 1 << 20, "count": 262144, "type": "float32",
                "redop": "sum", "time_us": t, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wrong": 0,
                "cpu_us_per_rank": 1.0, "seals_per_rank": 0, "opens_per_rank": 0, "tag_granularity": "segment 4MiB",
                "paired_ratios": {"gloo": iv[0]} if iv else {}, "paired_ratio_intervals": {"gloo": iv} if iv else {}}

    rows = [row("gloo", 100.0, None), row("secure", 333.0, [3.33, 0.50, 6.79, 10]),
            row("ring", 180.0, [1.8, 1.6, 2.0, 10]), row("secure-naive", 500.0, [5.0, None, None, 3])]
    out = io.StringIO()
    print_collectives(rows, title="t", aes=None, stream=out)
    text = out.getvalue()
    assert "no measurable difference (0.50–6.79)" in text and "3.33 (0.50" not in text
    assert ratio_text(Interval(1.8, 1.6, 2.0, 10)) in text and "5.00× (n=3, no interval)" in text


# -- 9. tables within 120 columns, every column explained -----------------------------------------

def _train_result(variant: str, n: int = 8) -> dict:
    its = [{"step": i, "warmup": i < 2, "round": None if i < 2 else i - 2, "total_ms": 100.0 + i + (30 if variant != "off" else 0),
            "data_ms": 1.0, "bounce_ms": 0.0, "forward_ms": 20.0, "backward_ms": 50.0, "exposed_comm_ms": 10.0,
            "optimizer_ms": 5.0, "crypto_busy_ms": 12.0} for i in range(n)]
    return {"workload": "bert-base", "world_size": 2, "variant": variant, "steps": n - 2, "iterations": its,
            "summary": {k: 10.0 for k in ("total_ms", "data_ms", "bounce_ms", "forward_ms", "backward_ms",
                                          "exposed_comm_ms", "optimizer_ms", "crypto_busy_ms")},
            "pairing": {"alternation": "iteration"}, "allreduce_calls_per_iteration": 12, "seals_per_rank": 24,
            "opens_per_rank": 24, "broadcast_seals_per_iteration": 0, "bounce_seals_per_iteration": 0,
            "param_sha256": "0123456789abcdef" * 4}


@pytest.mark.parametrize("variants", [["on:pipelined"], ["off", "on:naive", "on:pipelined"]], ids=["one", "three"])
def test_train_tables_fit_120_columns_off_a_terminal_and_explain_every_column(variants):
    import io

    from ccddp.cli.cmd_train import print_summary

    out = io.StringIO()
    print_summary([_train_result(v) for v in variants], stream=out)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120, max(text.splitlines(), key=len)
    for word in ("exposed comm (waiting", "crypto busy:", "bounce (the input", "total:"):
        assert word in " ".join(text.split()), word
    wide = io.StringIO()
    print_summary([_train_result(v) for v in variants], stream=wide, wide=True)
    assert "Left out" not in wide.getvalue()


def test_train_has_wide():
    from ccddp.cli import build_parser

    args = build_parser(["train"]).parse_args(["train", "--workload", "graphsage", "--wide"])
    assert args.wide is True


@pytest.mark.parametrize("argv", [
    ["simulate", "--profile", "h100-cc", "--workload", "gpt2-xl", "--gpus", "2,4,8,64"],
    ["simulate", "--profile", "paper-h100", "--workload", "all", "--gpus", "2,4,8", "--schedule", "naive,pipelined"],
    ["tune", "--profile", "h100-cc", "--workload", "bert-large", "--gpus", "8"],
    ["tune", "--profile", "paper-h100", "--workload", "gpt2-xl", "--gpus", "8"],
], ids=["simulate-h100-cc", "simulate-paper", "tune-h100-cc", "tune-paper"])
def test_simulate_and_tune_fit_120_columns_in_a_pipe(argv):
    p = _ccddp(*argv)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert "…" not in p.stdout


def test_simulate_explains_every_column_and_crypto_0_beside_a_slowdown():
    p = _ccddp("simulate", "--profile", "h100-cc", "--workload", "gpt2-xl", "--gpus", "2,64")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    header = next(line for line in p.stdout.splitlines() if "workload" in line and "slowdown" in line)
    columns = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert "other" not in columns and "launch" in columns
    notes = " ".join(p.stdout.rsplit("└", 1)[1].split()[1:])      # what is printed under the last table
    for col in columns[1:]:
        assert re.search(rf"(^|[ ,]){re.escape(col)}[ :,]", notes), col   # each column named in the notes
    assert "--wide adds ops/AR and AR" in text
    assert "crypto 0 beside a slowdown (h100-cc native at 2 GPUs)" in text and "slower kernel launches (launch)" in text
    wide = _ccddp("simulate", "--profile", "h100-cc", "--workload", "gpt2-xl", "--gpus", "2", "--wide")
    assert "ops/AR" in wide.stdout and "ops/AR: seal + open operations per all-reduce call" in " ".join(wide.stdout.split())


# -- 10. calibrate says when its model check ran under load ---------------------------------------

def test_calibrate_says_its_model_check_ran_under_load():
    from ccddp.cli.cmd_calibrate import load_line

    checks = [{"error": -0.72}, {"error": 0.84}, {"error": 0.1}]
    loaded = load_line({"load_before": [3.1, 2.0, 1.5], "load_after": [4.0, 2.5, 1.6], "cores": 2,
                        "others_share": 0.45}, checks)
    assert loaded.startswith("The model check ran under load: other processes took 45% of the CPU, load average "
                             "3.1 (1 min) on 2 cores before it started.")
    assert "(-72% to +84%)" in loaded and "quiet machine" in loaded
    quiet = load_line({"load_before": [0.1, 0.1, 0.1], "cores": 2, "others_share": 0.01}, checks)
    assert quiet.startswith("The model check ran on a quiet machine: other processes took 1% of the CPU")
    # Without psutil's measure, the load average before it started decides.
    assert "under load" in load_line({"load_before": [1.5, 1, 1], "cores": 2, "others_share": None}, checks)
    assert load_line(None, checks) is None


# -- 7. the README's first screen ----------------------------------------------------------------

def test_the_readme_first_screen_says_what_it_is_then_the_commands_then_the_example():
    text = (ROOT / "README.md").read_text()
    first = text.split("## First contact", 1)[0]
    block = first.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    commands = [line.split("#", 1)[0].strip() for line in block]
    assert commands == ["python -m venv .venv && . .venv/bin/activate",
                        "bash scripts/setup.sh && ccddp characterize --quick --out runs/quick",
                        "bash scripts/setup.sh && python -m pytest -q -n auto"]
    before = first.split("```bash", 1)[0]
    assert "torch.distributed" in before and "AES-256-GCM" in before          # what it is, first
    assert "**Runs today**" in first.split("```bash", 1)[1]                  # then what runs today
    for detail in ("NCCL", "Triton", "placement", "pinned"):
        assert detail not in first, detail                                   # details come later
    assert ".venv/" in (ROOT / ".gitignore").read_text().split()


# -- 6. the README's numbers from one place --------------------------------------------------------

def _numbers_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "scripts" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_numbers_agree_with_the_numbers_file():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_numbers.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = (ROOT / "README.md").read_text()
    plain = _numbers_script().SPAN.sub("", text)
    # No test count or test/main-job time outside a span.
    for stray in (r"\(~\d+ min", r"\d[,\d]* tests in", r"\d+ of [\d,]+ on 20", r"~\d+ min quiet"):
        assert not re.search(stray, plain), re.search(stray, plain)[0]


def test_a_measured_run_updates_every_number_at_once(tmp_path):
    readme, numbers = tmp_path / "README.md", tmp_path / "numbers.json"
    readme.write_text((ROOT / "README.md").read_text())
    numbers.write_text((ROOT / "docs" / "numbers.json").read_text())
    junit = tmp_path / "suite.xml"
    junit.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="1212" failures="0" '
                     'errors="0" skipped="257" time="790.2"/></testsuites>')
    script = _numbers_script()
    assert script.main(["--junit", str(junit), "--main-job-s", "314", "--date", "2026-12-01",
                        "--numbers", str(numbers), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "1,212 tests, 257 of them skipping" in text and "all 1,212 tests in 13 min 10 s -- 955 pass" in text
    assert text.count("<!--n:main_job_about-->~5 min<!--/n-->") == 2 and "5 min 14 s in one run" in text
    assert json.loads(numbers.read_text())["suite"]["passed"] == 955
    assert script.main(["--check", "--numbers", str(numbers), "--readme", str(readme)]) == 0


WEAK = "00" * 32      # a repeated pattern: every rank would refuse it


@pytest.mark.parametrize("argv", [
    ["train", "--workload", "graphsage", "--size", "tiny"],
    ["bench", "collectives", "--sizes", "4K"],
    ["selftest", "--attacks", "flip", "--collectives", "all_reduce"],
    ["characterize", "--quick", "--out", "OUT"],
], ids=lambda a: " ".join(a[:2]))
def test_a_secret_every_rank_would_refuse_is_answered_before_torch_loads(argv, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "CCDDP_GROUP_SECRET": WEAK})
    assert p.stdout.split()[-2:] == ["NO-TORCH", "2"], p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert lines == [lines[0]] and lines[0].startswith("ccddp: error: CCDDP_GROUP_SECRET: group secret looks "
                                                       "guessable"), p.stderr


def test_buckets_and_report_say_what_they_do_before_the_slow_part(monkeypatch, capsys, tmp_path):
    seen: list[str] = []
    _stop_at(monkeypatch, "ccddp.cli.cmd_buckets", "rows", capsys, seen)
    assert main(["buckets", "--workload", "resnet50"]) == 2
    assert seen[0].startswith("ccddp buckets: building 1 model (resnet50) to count DDP's gradient buckets")
    _stop_at(monkeypatch, "ccddp.report.markdown", "write_report", capsys, seen)
    (tmp_path / "results.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert seen[1].startswith(f"ccddp report: writing {tmp_path / 'report.md'} and its figures")


def test_characterize_warns_in_its_own_options_words(monkeypatch, capsys, tmp_path):
    import ccddp.cli.preflight as preflight

    monkeypatch.setattr(preflight, "usable_cores", lambda: 2)
    import ccddp.bench.characterize as characterize
    from ccddp.errors import CCDDPError

    errs: list[str] = []

    def stop(*a, **k):
        errs.append(capsys.readouterr().err)
        raise CCDDPError("stopped by the test")

    monkeypatch.setattr(characterize, "characterize", stop)
    assert main(["characterize", "--quick", "--world-sizes", "2,3", "--out", str(tmp_path / "q")]) == 2
    err = errs[0]
    assert "ccddp characterize: warning: 3 local ranks on 2 CPU cores" in err and "(--world-sizes up to 2 gives" in err


def test_launch_of_a_script_that_is_not_there_is_one_line_before_any_rank(tmp_path):
    """Issue 43, item 3: was 18 s and 65 lines (every rank failing under torchrun)."""
    import subprocess
    import sys

    from dist_util import child_env

    done = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", "2", "missing.py"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "'missing.py' does not exist" in lines[0], lines


def test_launch_of_a_module_that_is_not_there_is_one_line_before_any_rank(tmp_path, monkeypatch, ccddp_here):
    """The same for ``-m``: a module on no path the ranks import from is one line (was a
    traceback per rank); one in the directory the launch runs from is found."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CCDDP_GROUP_SECRET", raising=False)
    code, err = ccddp_here("launch", "--nproc-per-node", "2", "-m", "no_such_module_here.train")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("ccddp: error: no module named 'no_such_module_here' for -m no_such_module_here.train"), err
    from ccddp.cli.cmd_launch import check_script, torchrun_argv

    (tmp_path / "here_mod.py").write_text("")
    check_script(torchrun_argv(["--nproc-per-node", "2", "-m", "here_mod"], {}))
