"""`ccddp simulate` and `ccddp tune`: tables, JSON rows, one-line user errors, and the
paper's workloads from the shipped table (DDP's real bucket plans)."""

from __future__ import annotations

import json
import re

import pytest

from ccddp.cli import main

MIB = 1 << 20


@pytest.fixture
def wl_json(tmp_path):
    p = tmp_path / "measured.json"
    p.write_text(json.dumps({"name": "measured", "bucket_bytes": [MIB] + [25 * MIB] * 6,
                             "forward_ms": 30.0, "backward_ms": 60.0, "optimizer_ms": 3.0,
                             "input_bytes": 8 * MIB}))
    return p


def test_simulate_writes_rows(tmp_path, wl_json, capsys):
    out = tmp_path / "rows.json"
    rc = main(["simulate", "--profile", "h100-cc", "--workload-profile", str(wl_json),
               "--gpus", "2,8,64", "--schedule", "naive", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "slowdown" in text and "measured" in text and "crypto" in text
    rows = json.loads(out.read_text())
    assert [r["gpus"] for r in rows] == [2, 8, 64]
    for r in rows:
        for key in ("workload", "gpus", "cc_off_ms", "cc_on_ms", "slowdown", "breakdown",
                    "profile", "schedule", "algorithm", "chains", "segment_bytes", "ops"):
            assert key in r
        assert r["profile"] == "h100-cc" and r["schedule"] == "naive"
        assert sum(r["breakdown"].values()) == pytest.approx(r["cc_on_ms"])
        assert r["ops"]["ops_per_allreduce"] == 4 * (min(r["gpus"], 8) - 1) or r["nodes"] > 1
    assert rows[-1]["nodes"] == 8 and rows[-1]["ops"]["relay_ops"] > 0


def test_json_directory_is_made_before_the_command_runs(tmp_path, wl_json, capsys):
    # Measuring commands write --json last, after their runs: the directory must exist by
    # then, or the result would be lost.
    out = tmp_path / "new" / "deeper" / "rows.json"
    assert main(["simulate", "--profile", "h100-cc", "--workload-profile", str(wl_json),
                 "--gpus", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["gpus"] == 2
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["simulate", "--profile", "h100-cc", "--workload-profile", str(wl_json),
                 "--gpus", "2", "--json", str(blocker / "rows.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ccddp: error: cannot write") and err.count("\n") == 1


def test_simulate_schedule_options_reach_the_model(tmp_path, wl_json):
    out = tmp_path / "rows.json"
    assert main(["simulate", "--profile", "b300-cc", "--workload-profile", str(wl_json),
                 "--gpus", "8", "--schedule", "pipelined", "--segment-mb", "4", "--chains", "16",
                 "--bucket-cap-mb", "50", "--algorithm", "tree", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert (r["segment_bytes"], r["chains"], r["bucket_cap_mb"], r["algorithm"]) == \
        (4 * MIB, 16, 50, "tree")
    assert r["buckets"] == 4


@pytest.mark.parametrize("argv,message", [
    (["--profile", "nonesuch"], "unknown profile 'nonesuch'"),
    (["--gpus", "0"], "--gpus needs world sizes >= 2"),
    (["--gpus", "1"], "--gpus needs world sizes >= 2"),
    (["--gpus", "two"], "--gpus must be a comma list"),
    (["--profile", "paper-h100", "--schedule", "native"], "native schedule needs"),
    (["--schedule", "fancy"], "unknown schedule 'fancy'"),
    (["--segment-mb", "0"], "--segment-mb must be > 0"),
])
def test_user_errors_are_one_line(wl_json, capsys, argv, message):
    rc = main(["simulate", "--workload-profile", str(wl_json)] + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert message in err


def test_bad_profile_file_names_the_field(tmp_path, wl_json, capsys):
    from importlib import resources
    text = (resources.files("ccddp.sim") / "profiles" / "h100-cc.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(re.sub(r"(?m)^enc_gbps = .*$", "enc_gbps = -5", text))
    assert main(["simulate", "--profile", str(bad), "--workload-profile", str(wl_json)]) == 2
    assert "'enc_gbps' must not be negative" in capsys.readouterr().err
    bad.write_text(re.sub(r"(?m)^pcie_gbps = .*$", "", text))
    assert main(["simulate", "--profile", str(bad), "--workload-profile", str(wl_json)]) == 2
    assert "'pcie_gbps' is missing" in capsys.readouterr().err


def test_bad_workload_profile(tmp_path, capsys):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"name": "x", "bucket_bytes": [1]}))
    assert main(["simulate", "--workload-profile", str(p)]) == 2
    assert "'forward_ms' is missing" in capsys.readouterr().err


def test_tune_reports_best_against_default(tmp_path, wl_json, capsys):
    out = tmp_path / "tune.json"
    assert main(["tune", "--profile", "h100-cc", "--workload-profile", str(wl_json),
                 "--gpus", "8", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best:" in text and "default:" in text and "ASSUMED" in text
    assert "security trade-off" in text
    res = json.loads(out.read_text())
    assert res["best_row"]["cc_on_ms"] <= res["default_row"]["cc_on_ms"]
    assert res["speedup_vs_default"] >= 1
    assert res["best_row"]["slowdown"] == pytest.approx(
        res["best_row"]["cc_on_ms"] / res["default_row"]["cc_off_ms"])
    assert main(["tune", "--profile", "paper-h100", "--workload-profile", str(wl_json),
                 "--gpus", "8", "--no-group-key", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["best"]["schedule"] != "group-key-allgather"
    assert res["outside_envelope"] == [] and "time_rests_on_assumed" in res


def test_paper_workloads_rebucket_as_ddp_does(tmp_path):
    """The shipped per-parameter sizes let the model re-bucket exactly as DDP does."""
    from ccddp import workloads
    from ccddp.sim import load_profile
    from ccddp.sim.catalog import catalog_workload

    wl = catalog_workload("graphsage", load_profile("h100-cc"))
    assert wl.param_bytes is not None and wl.forward_ms > 0 and wl.input_bytes > 0
    assert wl.kernel_launches > 0
    for cap_mb in (0.25, 0.5, 2):
        plan = workloads.bucket_plan("graphsage", bucket_cap_mb=cap_mb, dtype="float32")
        assert list(wl.rebucket(cap_mb * MIB).bucket_bytes) == plan.bucket_bytes
        assert plan.num_buckets > 1 or cap_mb == 2
    assert list(wl.rebucket(25 * MIB, 1 * MIB).bucket_bytes) == list(wl.bucket_bytes)
    out = tmp_path / "rows.json"
    assert main(["simulate", "--profile", "paper-h100", "--workload", "graphsage",
                 "--gpus", "2", "--schedule", "naive", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert r["buckets"] == 2 and r["slowdown"] == pytest.approx(1.61, rel=0.01)


def test_default_schedule_is_the_systems_own_and_lists_run_together(tmp_path):
    out = tmp_path / "rows.json"
    assert main(["simulate", "--profile", "h200-cc", "--workload", "gpt2-xl", "--gpus", "8",
                 "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert r["schedule"] == "native" and r["ops"]["seals"] == 0
    assert main(["simulate", "--profile", "paper-h100", "--workload", "bert-base,gpt2-xl",
                 "--gpus", "2,4", "--schedule", "naive,pipelined", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["schedule"], r["workload"], r["gpus"]) for r in rows][:4] == [
        ("naive", "bert-base", 2), ("naive", "bert-base", 4), ("naive", "gpt2-xl", 2),
        ("naive", "gpt2-xl", 4)]
    assert {r["schedule"] for r in rows} == {"naive", "pipelined"}


def test_simulate_says_when_a_setting_leaves_the_envelope(wl_json, capsys):
    assert main(["simulate", "--profile", "paper-h100", "--workload-profile", str(wl_json),
                 "--gpus", "8", "--chains", "1024"]) == 0
    assert "chains 1024 > 64" in capsys.readouterr().out


def test_default_segment_is_the_engines():
    """`ccddp simulate`/`tune` model the segment size ccddp's secure collectives use."""
    import argparse

    from ccddp.cli.cmd_simulate import add_schedule_args, schedules_from_args
    from ccddp.comm.settings import CommSettings
    from ccddp.sim import load_profile
    from ccddp.sim.schedule import Schedule

    p = argparse.ArgumentParser()
    add_schedule_args(p)
    (sched,) = schedules_from_args(p.parse_args([]), load_profile("local"))
    assert sched.schedule == "pipelined"
    assert sched.segment_bytes == Schedule().segment_bytes == CommSettings().segment_bytes
