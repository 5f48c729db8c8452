"""The report layer: figures and report.md drawn only from a characterize results.json.

Everything runs on a synthetic but schema-true results file (``make_results``), so the
tests need no training run and stay fast.
"""

from __future__ import annotations

import copy
import json
import math
import random
import statistics
import re

import pytest

from ccddp.cli import main
from ccddp.errors import ConfigError
from ccddp.report.crypto_ops import FAIL_MARK, OK_MARK, UNKNOWN_MARK, check_run, check_runs
from ccddp.report.figures import FIGURES, write_figures
from ccddp.report.markdown import render, write_report
from ccddp.report.results import SCHEMA, Results, load_results
from ccddp.stats import Verdict, ratio_text, verdict

# workload -> (params, fp32 buckets, paper Fig. 6, fwd ms, bwd ms, shapes overrides)
WORKLOADS = {
    "graphsage": (675_887, 1, 2, 40.0, 80.0, {"batch_size": 256, "fanouts": [15, 10, 5]}),
    "resnet50": (25_557_032, 5, None, 300.0, 600.0, {"batch_size": 8, "image_size": 224}),
    "gpt2-xl": (1_557_611_200, 145, 142, 900.0, 1800.0,
                {"batch_size": 1, "seq_len": 32, "dtype": "bfloat16", "dtype_reduced": True,
                 "dtype_reason": "memory: 12.5 GB per rank"}),
}
MEASURED_K = {"graphsage": 1, "resnet50": 5, "gpt2-xl": 73}  # gpt2-xl runs in bf16: fewer buckets


ROUNDS = 8
LAUNCH = "0123456789abcdef"
# A CC-on run whose time matches CC-off's within its noise: its ratio's interval holds 1.
LEVEL = {"resnet50/ws2/cc-on/pipelined": "same as off"}


def _drift(r: int) -> float:
    """The machine's speed in round r: moves every variant of the round alike."""
    return 1.0 + 0.3 * ((r * 7919) % 5) / 4


def _noise(key: str, r: int, amplitude: float) -> float:
    """Deterministic noise in [1 - amplitude, 1 + amplitude], different per run and round."""
    return 1.0 + amplitude * ((((sum(map(ord, key)) + 31 * r) * 2654435761) % 2001) / 1000.0 - 1.0)


def _train_result(wl: str, n: int, cc: str, schedule: str | None, steps: int = ROUNDS) -> dict:
    params, _, _, fwd, bwd, shape = WORKLOADS[wl]
    k = MEASURED_K[wl]
    seals = 2 * k * (n - 1) if cc == "on" else 0
    # Synthetic but shaped like the paper: CC-on cost grows with k(n-1); naive worse.
    crypto = 0.0 if cc == "off" else k * (n - 1) * (30.0 if schedule == "naive" else 12.0)
    key = f"{wl}/ws{n}/cc-{cc}" + (f"/{schedule}" if schedule else "")
    if LEVEL.get(key) == "same as off":
        crypto = -7.0  # cancels the bounce phase's extra 7 ms: the same time as CC-off
    phases = {"data_ms": 5.0 + n, "bounce_ms": 8.0 if cc == "on" else 1.0,
              "forward_ms": fwd * (1 + 0.1 * (n - 2)), "backward_ms": bwd * (1 + 0.1 * (n - 2)),
              "exposed_comm_ms": 10.0 * (n - 1) + crypto, "optimizer_ms": 7.0}
    total = sum(phases.values())
    amplitude = 0.05 if key in LEVEL or f"{wl}/ws{n}/cc-off" == key else 0.01
    iterations = []
    for step in range(1 + steps):
        warm = step == 0
        r = None if warm else step - 1
        t = total * (1.0 if warm else _drift(r) * _noise(key, r, amplitude))
        ki = 1 if warm else k  # iteration 0: one bucket with everything
        iterations.append({"step": step, "warmup": warm, "round": r, **phases, "total_ms": t,
                           "crypto_busy_ms": crypto * 1.2, "slowest_rank_total_ms": t * 1.01,
                           "allreduce_calls": ki,
                           "seals": 2 * ki * (n - 1) if cc == "on" else 0,
                           "opens": 2 * ki * (n - 1) if cc == "on" else 0, "loss": 6.9})
    measured = sorted(it["total_ms"] for it in iterations if not it["warmup"])
    summary = {**phases, "total_ms": (measured[(steps - 1) // 2] + measured[steps // 2]) / 2,
               "crypto_busy_ms": crypto * 1.2, "slowest_rank_total_ms": total * 1.01}
    shapes = {"workload": wl, "size": "default", "dtype": "float32", "dtype_reduced": False,
              "dtype_reason": None, "num_params": params, **shape}
    return {"schema": "ccddp.train/1", "workload": wl, "world_size": n, "cc": cc,
            "schedule": schedule, "shapes": shapes, "num_params": params, "summary": summary,
            "iterations": iterations, "allreduce_calls_per_iteration": k,
            "seals_per_rank": seals, "opens_per_rank": seals,
            "broadcast_seals_per_iteration": 0, "bounce_seals_per_iteration": 1 if cc == "on" else 0,
            "pairing": {"variants": ["off", "on:naive", "on:pipelined"], "alternation": "iteration",
                        "rounds": steps, "block": 1, "launch": f"{LAUNCH}-{wl}-{n}"},
            "param_sha256": "0" * 64, "settings": {"impl": "gloo" if cc == "off" else "secure"}}


def make_results(workloads=("graphsage", "resnet50", "gpt2-xl"), world_sizes=(2, 3),
                 schedules=("naive", "pipelined"), failed=("gpt2-xl/ws3/cc-on/naive",),
                 projections=True) -> dict:
    """A schema-true ``ccddp.characterize/1`` dict; keys in ``failed`` failed."""
    runs = []
    for wl in workloads:
        for n in world_sizes:
            for cc, sch in [("off", None)] + [("on", s) for s in schedules]:
                key = f"{wl}/ws{n}/cc-{cc}" + (f"/{sch}" if sch else "")
                if key in failed:
                    runs.append({"key": key, "workload": wl, "world_size": n, "cc": cc,
                                 "schedule": sch, "status": "failed", "result": None,
                                 "error": "RuntimeError: worker 1 exited with code -9 | out of memory"})
                else:
                    runs.append({"key": key, "workload": wl, "world_size": n, "cc": cc,
                                 "schedule": sch, "status": "ok", "error": None,
                                 "result": _train_result(wl, n, cc, sch)})
    proj = []
    if projections:
        for wl in workloads:
            for g in (2, 4, 8, 64):
                for sch in schedules:
                    off = 100.0
                    on = off * (1 + 0.05 * WORKLOADS[wl][1] * (g - 1) * (2 if sch == "naive" else 1) / 10)
                    proj.append({"workload": wl, "gpus": g, "profile": "paper-h100", "schedule": sch,
                                 "cc_off_ms": off, "cc_on_ms": on, "slowdown": on / off,
                                 "breakdown": {"forward": 30.0, "backward": 60.0}})
    return {
        "schema": SCHEMA,
        "machine": {"hostname": "testbox", "cpu": "Test CPU @ 2GHz", "cores": 2, "memory_gb": 24.0,
                    "os": "Linux-test", "python": "3.11.2", "torch": "2.13.0+cpu",
                    "cryptography": "50.0.0", "gpu": "none (CPU ranks over gloo)",
                    "date": "2026-01-01T00:00:00+00:00"},
        "config": {"workloads": list(workloads), "world_sizes": list(world_sizes),
                   "schedules": list(schedules), "steps": 3, "warmup": 1, "quick": False,
                   "size": "default"},
        "buckets": {wl: {"num_params": WORKLOADS[wl][0], "num_buckets": WORKLOADS[wl][1],
                         "bucket_bytes": [1 << 20] * WORKLOADS[wl][1], "dtype": "float32",
                         "paper_allreduce_calls": WORKLOADS[wl][2]} for wl in workloads},
        "runs": runs,
        "projections": proj,
        "aes_gcm_rates": [{"bytes": 4 << 20, "reps": 20, "seal_gbps": 3.81, "open_gbps": 3.52,
                           "date": "2026-01-01T00:00:00+00:00"}],
    }


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("char")
    data = make_results()
    (d / "results.json").write_text(json.dumps(data, indent=1))
    assert main(["report", str(d)]) == 0
    return d, data


# -- figures ------------------------------------------------------------------------------

def test_every_figure_is_written(report_dir):
    d, _ = report_dir
    for name in FIGURES:
        for ext in ("png", "svg"):
            f = d / "figures" / f"{name}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f
    svg = (d / "figures" / "iteration_time.svg").read_text()
    assert "<dc:date>" not in svg  # no timestamp in the file


def test_deleted_figure_is_recreated_byte_identical(report_dir):
    d, _ = report_dir
    figs = d / "figures"
    before = {p.name: p.read_bytes() for p in figs.iterdir()}
    (figs / "phase_decomposition.png").unlink()
    (figs / "scaling.svg").unlink()
    assert main(["report", str(d)]) == 0
    after = {p.name: p.read_bytes() for p in figs.iterdir()}
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], f"{name} changed between runs"


def test_missing_data_skips_figures_without_crashing(tmp_path):
    # One world size, no naive schedule, no projections, one failed CC-off run.
    data = make_results(workloads=("resnet50", "gpt2-xl"), world_sizes=(2,), schedules=("pipelined",),
                        failed=("resnet50/ws2/cc-off",), projections=False)
    drawn = write_figures(data, tmp_path)
    assert "scaling" not in drawn and "projected_slowdown" not in drawn
    assert {"allreduces_per_iteration", "iteration_time", "phase_decomposition",
            "schedule_overhead"} <= set(drawn)
    # Nothing usable at all: no figure, still a report that lists the failures.
    data = make_results(workloads=("resnet50",), world_sizes=(2,), schedules=("naive",),
                        failed=("resnet50/ws2/cc-off", "resnet50/ws2/cc-on/naive"), projections=False)
    data["buckets"] = {}
    report = write_report(data, tmp_path / "empty").read_text()
    assert "resnet50/ws2/cc-off" in report and "out of memory" in report
    assert not list((tmp_path / "empty" / "figures").glob("*.png"))


def test_malformed_entries_are_tolerated(tmp_path):
    # What a crashed or hand-edited characterization can leave: never a traceback.
    data = make_results(workloads=("resnet50",), world_sizes=(2,), schedules=("pipelined",),
                        failed=(), projections=True)
    data["runs"][0]["result"]["summary"] = {"total_ms": float("nan")}
    for it in data["runs"][0]["result"]["iterations"]:
        it["total_ms"] = float("nan")
    data["runs"] += ["junk", {"status": "ok"}, {"status": "ok", "cc": "on", "world_size": "x",
                                                 "result": {"seals_per_rank": "x", "iterations": [None]}}]
    data["projections"] += ["junk", {"gpus": 0, "slowdown": -1.0}, {"gpus": 8, "slowdown": None}]
    data["buckets"]["weird"] = {"num_params": "many", "paper_allreduce_calls": "x"}
    data["runs"][1]["result"]["shapes"] = {"fanouts": 3, "num_params": 1.5, "dtype_reduced": True}
    md = write_report(data, tmp_path).read_text()
    assert "0 GPUs" not in md and "weird" in md
    # CC-off has no usable time, so no ratio; the CC-on run is still drawn and checked.
    assert (tmp_path / "figures" / "phase_decomposition.png").is_file()
    assert not (tmp_path / "figures" / "schedule_overhead.png").exists()


def test_stale_figure_is_removed(tmp_path):
    # A figure an earlier report drew but these results cannot: removed, not left stale.
    (tmp_path / "projected_slowdown.png").write_bytes(b"old")
    (tmp_path / "notes.png").write_bytes(b"mine")  # not a report figure: left alone
    data = make_results(workloads=("resnet50",), world_sizes=(2,), schedules=("naive",),
                        failed=("resnet50/ws2/cc-off", "resnet50/ws2/cc-on/naive"), projections=False)
    data["buckets"] = {}
    assert write_figures(data, tmp_path) == {}
    assert not (tmp_path / "projected_slowdown.png").exists()
    assert (tmp_path / "notes.png").exists()


# -- report.md --------------------------------------------------------------------------------

def _table(md: str, heading: str) -> list[list[str]]:
    """Body rows of the first markdown table after ``heading``."""
    section = md.split(heading, 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    rows, started = [], False
    for ln in section.splitlines():
        if ln.startswith("|"):
            started = True
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]])
        elif started:
            break
    assert lines, heading
    return rows[2:]  # header and separator


def test_report_ratios_agree_with_data(report_dir):
    d, data = report_dir
    md = (d / "report.md").read_text()
    res = Results(data)
    rows = _table(md, "## CC-on / CC-off")
    seen = 0
    for row in rows:
        wl, n = row[0], int(row[1])
        assert float(row[2].split()[0]) == pytest.approx(res.total_ms(wl, n, "off"), abs=0.05)
        for sch, col in (("naive", 4), ("pipelined", 6)):
            r = res.comparison(wl, n, sch)
            if r is None:
                assert row[col] in ("failed", "–")
            else:
                assert r.n == ROUNDS and r.known
                assert row[col] == ratio_text(r)
                seen += 1
    assert seen == 11  # 3 workloads x 2 sizes x 2 schedules, one failed
    # The paired column says how it was computed, right under the table.
    assert "median of per-round ratios" in md.split("## CC-on / CC-off", 1)[1].split("##", 1)[0]


def test_paired_ratio_is_the_hodges_lehmann_median_of_round_ratios_and_drift_cancels(report_dir):
    _, data = report_dir
    res = Results(data)
    # resnet50 at 3 ranks: CC-on costs a fixed share more per iteration; the machine's
    # drift (30 %) moves both variants of a round alike, so it stays out of the ratio.
    r = res.comparison("resnet50", 3, "pipelined")
    on, off = res.run("resnet50", 3, "on", "pipelined"), res.run("resnet50", 3, "off")
    rounds_on, rounds_off = Results.round_ms(on), Results.round_ms(off)
    assert max(rounds_off.values()) / min(rounds_off.values()) > 1.2
    logs = [math.log(rounds_on[k] / rounds_off[k]) for k in rounds_on]
    n = len(logs)
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    assert r.estimate == pytest.approx(math.exp(statistics.median(walsh)))
    assert verdict(r) is Verdict.SLOWER and r.half_width < 0.05
    # The signed-rank test's critical value, by counting all 2**8 sign patterns: the
    # interval runs from the (c+1)-th smallest to the (c+1)-th largest Walsh average, c
    # the largest rank sum with P(T <= c) <= 2.5 %.
    sums = [sum(rank for rank in range(1, n + 1) if pattern >> (rank - 1) & 1) for pattern in range(2 ** n)]
    c = max(t for t in range(n * (n + 1) // 2) if sum(s <= t for s in sums) / 2 ** n <= 0.025)
    assert (n, c) == (8, 3)   # the textbook table's value for n = 8
    assert (r.low, r.high) == (pytest.approx(math.exp(walsh[c])), pytest.approx(math.exp(walsh[-c - 1])))


def test_the_paired_interval_is_the_inverted_wilcoxon_signed_rank_test():
    # Shifts just inside the interval are not rejected at 5 % by SciPy's exact test;
    # shifts just outside are: the interval is the test's, not an approximation of it.
    from scipy.stats import wilcoxon

    from ccddp.stats import hodges_lehmann_interval

    rng = random.Random(7)
    for n in (6, 9, 10, 17, 25):
        xs = [rng.gauss(0.1, 0.05) for _ in range(n)]
        iv = hodges_lehmann_interval(xs)
        eps = 1e-9
        for shift, rejected in ((iv.low - eps, True), (iv.low + eps, False), (iv.high - eps, False),
                                (iv.high + eps, True)):
            p = wilcoxon([x - shift for x in xs], method="exact").pvalue
            assert bool(p < 0.05) == rejected, (n, shift, p)
    assert hodges_lehmann_interval([0.1] * 5).low is None        # 5 rounds: no 95 % interval exists
    # Ratios pooled over many launches: the null distribution stays finite (2**n overflowed).
    big = hodges_lehmann_interval([rng.gauss(0.0, 1.0) for _ in range(1500)])
    assert -0.15 < big.low < big.estimate < big.high < 0.15


def test_the_null_distributions_lower_tail_is_the_whole_ones():
    """The interval reads only the lower half of the signed-rank null; computed alone it
    is, value for value, the start of the whole distribution (which sums to one and is
    symmetric)."""
    from ccddp.stats import signed_rank_null

    for n in (1, 2, 5, 6, 13, 40):
        whole = signed_rank_null(n)
        assert abs(whole.sum() - 1.0) < 1e-12 and (whole == whole[::-1]).all()
        for upto in (0, n, n * (n + 1) // 4, n * (n + 1) // 2, n * n):
            assert (signed_rank_null(n, upto) == whole[:upto + 1]).all(), (n, upto)


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference(report_dir):
    d, data = report_dir
    res = Results(data)
    r = res.comparison("resnet50", 2, "pipelined")
    assert r.low < 1.0 < r.high and verdict(r) is Verdict.NO_DIFFERENCE
    md = (d / "report.md").read_text()
    row = next(row for row in _table(md, "## CC-on / CC-off") if row[:2] == ["resnet50", "2"])
    assert row[6].startswith("no measurable difference (") and "×" not in row[6]
    # Unpaired runs (separate launches): the ratio of medians, no interval, never a
    # speed-up when it is below 1.
    unpaired = copy.deepcopy(data)
    for run in unpaired["runs"]:
        if run["result"]:
            run["result"].pop("pairing")
    r = Results(unpaired).comparison("resnet50", 2, "pipelined")
    assert r.n == 0 and not r.known
    assert ratio_text(r).startswith("no measurable difference") if r.estimate < 1 else "×" in ratio_text(r)
    assert ratio_text(Results(unpaired).comparison("resnet50", 3, "pipelined")).endswith(
        "(not measured in turns, no interval)")


def test_report_states_provenance_shapes_and_failures(report_dir):
    d, _ = report_dir
    md = (d / "report.md").read_text()
    for text in ("Test CPU @ 2GHz", "2.13.0+cpu", "50.0.0", "measured", "projected",
                 "bfloat16", "memory: 12.5 GB per rank", "gpt2-xl/ws3/cc-on/naive",
                 "out of memory", "seal 3.81 GB/s, open 3.52 GB/s"):
        assert text in md, text
    # Figures are embedded with paths relative to report.md, and exist.
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert not link.startswith("/") and (d / link).is_file(), link
    assert len(re.findall(r"!\[", md)) == len(FIGURES)
    # Pipe in an error message must not break the table.
    assert "exited with code -9 \\| out of memory" in md


def test_report_ops_table_marks(report_dir):
    d, data = report_dir
    md = (d / "report.md").read_text()
    rows = _table(md, "## Crypto operations")
    assert len(rows) == len(check_runs(data)) == 11
    for row in rows:
        assert row[-1] == OK_MARK, row
    assert "gpt2-xl/ws3/cc-on/pipelined" in md and "| 73 | 292 | 292 | 584 | 584 |" in md


def test_ops_check_logic():
    run = {"key": "r", "cc": "on", "status": "ok", "world_size": 4,
           "result": _train_result("gpt2-xl", 4, "on", "pipelined")}
    row = check_run(run)
    assert (row["allreduces"], row["seals"], row["expected_ops"], row["ok"]) == (73, 438, 876, True)
    assert row["iterations_checked"] == ROUNDS
    bad = copy.deepcopy(run)
    bad["result"]["seals_per_rank"] -= 1
    assert check_run(bad)["ok"] is False
    drift = copy.deepcopy(run)  # steady iteration fine, an earlier one skipped a seal
    drift["result"]["iterations"][1]["opens"] -= 2
    row = check_run(drift)
    assert row["ok"] is False and "step 1" in row["mismatch"]
    missing = copy.deepcopy(run)
    del missing["result"]["opens_per_rank"]
    assert check_run(missing)["ok"] is None
    assert check_run({**run, "cc": "off"}) is None
    assert check_run({**run, "status": "failed"}) is None


def test_ops_mismatch_shows_failure_mark(tmp_path):
    data = make_results(workloads=("resnet50",), world_sizes=(2,), schedules=("naive",),
                        failed=(), projections=False)
    data["runs"][1]["result"]["seals_per_rank"] = 7
    data["runs"][1]["result"]["opens_per_rank"] = None
    # The text alone (no figures needed to check a table).
    md = render(Results(data), {}, tmp_path)
    (row,) = _table(md, "## Crypto operations")
    assert row[-1].startswith(FAIL_MARK) and "7 seals" in row[-1] and "expected 10" in row[-1]
    data["runs"][1]["result"]["seals_per_rank"] = None
    md = render(Results(data), {}, tmp_path)
    assert _table(md, "## Crypto operations")[0][-1] == UNKNOWN_MARK


# -- loading and the CLI ---------------------------------------------------------------------

def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_results(tmp_path / "results.json")
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_results(tmp_path / "results.json")
    with pytest.raises(ConfigError, match="unsupported schema 'ccddp.characterize/2'"):
        load_results({"schema": "ccddp.characterize/2", "runs": []})
    with pytest.raises(ConfigError, match="unsupported schema None"):
        load_results({"runs": []})


@pytest.mark.parametrize("content,message", [
    (None, "results.json does not exist"),
    ("[1, 2", "not valid JSON"),
    ('{"schema": "ccddp.characterize/9"}', "unsupported schema"),
])
def test_cli_user_errors_are_one_line(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_missing_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_characterize_table_script_puts_runs_side_by_side(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(make_results(workloads=("resnet50",))))
    script = Path(__file__).resolve().parents[1] / "scripts" / "characterize_table.py"
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "b")],
                       capture_output=True, text=True, check=True)
    lines = p.stdout.splitlines()
    assert lines[0].endswith("| intervals overlap |") and len(lines) == 2 + 4  # 2 sizes x 2 schedules
    row = next(ln for ln in lines if ln.startswith("| resnet50 | 2 | pipelined |"))
    assert row.count("no measurable difference (") == 2 and row.endswith("| yes |")


def test_the_scaling_figure_shows_every_error_bar_and_label(monkeypatch, tmp_path):
    """Every panel shares the y axis: its limit must clear the highest interval and the
    label above it in every panel, not only in the last one drawn."""
    from ccddp.report import figures

    data = make_results()
    for run in data["runs"]:     # the first panel's (naive) highest bar well above the second's
        if run["schedule"] == "naive" and run["world_size"] == 3 and run["result"]:
            for it in run["result"]["iterations"]:
                it["total_ms"] *= 3
            run["result"]["summary"]["total_ms"] *= 3
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, name: drawn.setdefault(name, fig) and [])
    figures.fig_scaling(data, tmp_path)
    fig = drawn["scaling"]
    for ax in fig.axes:
        if not ax.patches:
            continue                        # the legend's slot
        top = ax.get_ylim()[1]
        bar_tops = [seg[:, 1].max() for c in ax.collections for seg in c.get_segments()]
        labels = [t.xy[1] for t in ax.texts if hasattr(t, "xy")]
        assert bar_tops and labels
        # A label is drawn a few points above its bar: it needs headroom below the limit.
        assert max(bar_tops) < top and max(labels) < 0.93 * top, (ax.get_title(), max(bar_tops), max(labels), top)


@pytest.mark.parametrize("precision,marked", [(0.0001, True), (10.0, False)])
def test_the_iteration_figure_marks_ratios_that_missed_the_precision_target(monkeypatch, tmp_path, precision, marked):
    from ccddp.report import figures

    data = make_results()
    data["config"]["precision"] = precision
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, out_dir, name: drawn.setdefault(name, fig) and [])
    figures.fig_iteration_time(data, tmp_path)
    fig = drawn["iteration_time"]
    labels = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text() != "failed"]
    notes = [t.get_text() for t in fig.texts]
    assert labels
    assert all(lab.endswith("†") for lab in labels) if marked else not any("†" in lab for lab in labels)
    assert any("precision target" in n for n in notes) == marked


def test_machine_info_names_the_gpu_a_cuda_run_used(monkeypatch):
    """A result measured on a GPU says which one in its machine record (the first GPU
    run's JSON said "none (CPU ranks over gloo)" beside its H100 rows)."""
    import torch

    from ccddp.bench.machine import machine_info

    assert machine_info()["gpu"] == "none (CPU ranks over gloo)" or torch.cuda.is_initialized()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert machine_info()["gpu"] == "NVIDIA H100 80GB HBM3 (1 visible)"


def test_the_shapes_section_says_a_tiny_architecture_is_not_the_papers():
    """A report of ``--size tiny`` runs must not claim full-size architectures (gradient
    bytes and bucket counts as the paper's); a default-size report still says it."""
    from ccddp.report.markdown import _shapes
    from ccddp.report.results import Results

    default = make_results(workloads=("graphsage",), world_sizes=(2,), failed=())
    tiny = json.loads(json.dumps(default))
    for run in tiny["runs"]:
        run["result"]["shapes"]["size"] = "tiny"
    default_text, tiny_text = (" ".join(_shapes(Results(d))) for d in (default, tiny))
    assert "Architectures are full size" in default_text and "tiny" not in default_text
    assert "Size `tiny` is a reduced architecture" in tiny_text
    assert "Architectures are full size" not in tiny_text and "are not the paper's" in tiny_text
