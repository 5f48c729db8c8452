"""`ccddp validate`: pairs CC-off/CC-on runs, takes compute only from the CC-off run,
predicts with the run's own schedule, and computes errors and the verdict correctly."""

from __future__ import annotations

import json

import pytest

import ccddp.bench.validate as V
from ccddp.cli import main
from ccddp.errors import ConfigError
from ccddp.sim import Schedule, load_profile, predict

MIB = 1 << 20
BUCKETS = [MIB, 25 * MIB, 20 * MIB]
HW = load_profile("local")


def step(i: int, total: float = 1000.0, warmup: bool = False, **phases) -> dict:
    """One entry of a run's ``iterations``."""
    d = {"step": i, "warmup": warmup, "total_ms": total, "data_ms": 2.0, "bounce_ms": 0.5,
         "forward_ms": 200.0, "backward_ms": 400.0, "exposed_comm_ms": 50.0,
         "optimizer_ms": 30.0}
    d.update(phases)
    return d


def run(cc: str, n: int = 2, total: float = 1000.0, schedule: str | None = "pipelined",
        workload: str = "resnet50", **shape) -> dict:
    s = {"data_ms": 2.0, "bounce_ms": 0.5, "forward_ms": 200.0, "backward_ms": 400.0,
         "exposed_comm_ms": 50.0, "optimizer_ms": 30.0, "total_ms": total,
         "crypto_busy_ms": 0.0}
    return {"schema": "ccddp.train/1", "workload": workload, "size": "default",
            "shapes": {"workload": workload, "batch_size": 2, "image_size": 112,
                       "num_params": 1, **shape},
            "world_size": n, "cc": cc, "schedule": schedule if cc == "on" else None,
            "settings": {"impl": "secure" if cc == "on" else "gloo", "segment_bytes": 4 * MIB,
                         "chains": 0, "tag": "segment", "algorithm": "ring",
                         "allgather": "per-link"},
            "bucket_cap_mb": None, "machine": {"cores": 2}, "summary": s,
            "allreduce_calls_per_iteration": len(BUCKETS)}


@pytest.fixture(autouse=True)
def no_torch_models(monkeypatch):
    """Synthetic runs: skip building real models for bucket plans and batches."""
    monkeypatch.setattr(V, "bucket_bytes", lambda r: list(BUCKETS))
    monkeypatch.setattr(V, "input_bytes", lambda r: 100_000)


def test_cc_on_run_is_refused_as_compute_source():
    with pytest.raises(ConfigError, match="CC-off runs only"):
        V.workload_from_run(run("on"), HW)
    wl = V.workload_from_run(run("off"), HW)
    assert wl.forward_ms == 200.0 and wl.optimizer_ms == 30.0 and wl.data_ms == 2.0
    assert wl.bucket_bytes == tuple(BUCKETS) and wl.measured_ranks == 2
    assert wl.input_bytes == 100_000


def test_backward_is_compute_without_the_models_cc_off_contention():
    from ccddp.sim import run_iteration

    off = run("off")
    wl = V.workload_from_run(off, HW, wait=False)
    assert wl.backward_ms <= 400.0
    ph = run_iteration(HW, wl, Schedule(), 2, cc=False).phases
    assert ph["backward"] + ph["contention"] == pytest.approx(400.0, rel=1e-6)
    # The measured exposed time beyond the model's tail is the wait for the slowest
    # peer: it becomes the slowest rank's longer backward.
    waited = V.workload_from_run(off, HW)
    assert waited.backward_ms == pytest.approx(wl.backward_ms + 50.0 - ph["exposed"])
    off["summary"]["exposed_comm_ms"] = 0.0          # no wait: nothing added
    assert V.workload_from_run(off, HW).backward_ms == pytest.approx(wl.backward_ms)


def test_backward_core_work_is_the_training_threads_cpu_time_on_shared_cores():
    from ccddp.sim.rates import compute_factor

    off = run("off", n=4)
    assert V.workload_from_run(off, HW).backward_core_ms is None      # not recorded
    off["summary"]["backward_main_cpu_ms"] = 50.0
    wl = V.workload_from_run(off, HW)
    # 4 ranks on the profile's cores: a CPU-millisecond of each takes longer on the wall.
    assert compute_factor(HW, 4) > 1
    assert wl.backward_core_ms == pytest.approx(50.0 * compute_factor(HW, 4))
    assert wl.backward_core_ms < wl.backward_ms
    # Never more than the backward it is part of.
    off["summary"]["backward_main_cpu_ms"] = 10_000.0
    wl = V.workload_from_run(off, HW)
    assert wl.backward_core_ms == wl.backward_ms


def test_cc_on_collectives_run_in_the_cc_off_wait_on_shared_cores():
    """A rank that waited for its peers in the CC-off run leaves that time to the CC-on
    run's crypto: less predicted, never below the work the cores must do."""
    from dataclasses import replace

    from ccddp.sim import run_iteration

    off = run("off", n=4)
    off["summary"]["exposed_comm_ms"] = 300.0        # a long wait for the slowest peer
    waited = V.workload_from_run(off, HW)
    sched = Schedule("pipelined", segment_bytes=4 * MIB, chains=1)
    before = run_iteration(HW, waited, sched, 4, cc=True)
    off["summary"]["backward_main_cpu_ms"] = 50.0
    core = V.workload_from_run(off, HW)
    after = run_iteration(HW, core, sched, 4, cc=True)
    assert after.total_ms < before.total_ms
    assert after.total_ms >= before.total_ms - (waited.backward_ms - core.backward_core_ms) - 1e-9
    # CC off, the wait is still waited: its prediction is the same.
    assert run_iteration(HW, core, sched, 4, cc=False).total_ms == pytest.approx(
        run_iteration(HW, waited, sched, 4, cc=False).total_ms)
    # All of the backward core work: the same as not knowing.
    full = replace(core, backward_core_ms=core.backward_ms)
    assert run_iteration(HW, full, sched, 4, cc=True).total_ms == pytest.approx(before.total_ms)


def test_errors_and_ratios_are_computed_from_the_prediction():
    off, on = run("off", total=700.0), run("on", total=1000.0)
    row = V.compare(HW, off, on)
    wl = V.workload_from_run(off, HW)
    expect = predict(HW, wl, Schedule("pipelined", segment_bytes=4 * MIB, chains=1), 2)
    assert row["predicted_cc_on_ms"] == pytest.approx(expect["cc_on_ms"])
    assert row["predicted_cc_off_ms"] == pytest.approx(expect["cc_off_ms"])
    assert row["cc_on_error"] == pytest.approx(expect["cc_on_ms"] / 1000.0 - 1)
    assert row["measured_ratio"] == pytest.approx(1000 / 700)
    assert row["predicted_ratio"] == pytest.approx(expect["cc_on_ms"] / expect["cc_off_ms"])
    assert row["ratio_error"] == pytest.approx(row["predicted_ratio"] / (1000 / 700) - 1)
    assert row["pass"] == (abs(row["cc_on_error"]) <= 0.2 and abs(row["ratio_error"]) <= 0.1)
    # A measurement equal to the prediction passes with zero error.
    exact = run("on", total=expect["cc_on_ms"])
    off_exact = run("off", total=expect["cc_off_ms"])
    r2 = V.compare(HW, off_exact, exact)
    assert r2["cc_on_error"] == pytest.approx(0, abs=1e-12)
    assert r2["ratio_error"] == pytest.approx(0, abs=1e-12) and r2["pass"]
    # 25 % too slow fails on time.
    r3 = V.compare(HW, off_exact, run("on", total=expect["cc_on_ms"] / 1.25))
    assert r3["cc_on_error"] == pytest.approx(0.25) and not r3["pass_time"]


def in_turns(levels: list[float], on_over_off: list[float], launch: str = "L1") -> tuple[dict, dict]:
    """A CC-off and a CC-on run measured in turns in one launch: round k's CC-off
    iteration totals ``levels[k]``, its CC-on iteration ``on_over_off[k]`` times that."""
    off, on = run("off"), run("on")
    for r in (off, on):
        r["pairing"] = {"launch": launch, "alternation": "iteration"}
    off["iterations"] = [step(k, total=t, round=k) for k, t in enumerate(levels)]
    on["iterations"] = [step(k, total=t * f, round=k) for k, (t, f) in
                        enumerate(zip(levels, on_over_off))]
    return off, on


def test_rounds_taken_in_turns_are_compared_pair_by_pair():
    """The machine drifts between rounds (two launch levels here); each round's CC-on
    iteration is compared with the prediction from that round's CC-off iteration."""
    off, on = in_turns([1000.0] * 4 + [1300.0] * 4, [1.2] * 8)
    rounds = V.launch_rounds([off], [on])
    assert sorted(rounds) == [("L1", k) for k in range(8)]
    assert all(len(idx) == 1 and len(ons) == 1 for idx, ons in rounds.values())
    row = V.compare(HW, off, on)
    assert row["comparison"] == "paired by round" and row["paired"]["rounds"] == 8
    assert row["measured_ratio"] == pytest.approx(1.2)
    # Every CC-off iteration has the same phases, so each round predicts the same time.
    wl = V.workloads_from_run(off, HW)[0]
    p = predict(HW, wl, Schedule("pipelined", segment_bytes=4 * MIB, chains=1), 2)
    per_round = [p["cc_on_ms"] / (t * 1.2) for t in [1000.0] * 4 + [1300.0] * 4]
    # Hodges-Lehmann on the log scale of 4 + 4 equal values: the geometric mean.
    import math
    assert row["cc_on_error"] == pytest.approx(math.sqrt(per_round[0] * per_round[4]) - 1)
    lo, hi = row["paired"]["cc_on_error_interval"]
    assert lo <= row["cc_on_error"] <= hi
    assert row["pooled"]["cc_on_error"] != pytest.approx(row["cc_on_error"])
    # The ratio error does not depend on the level of the round.
    assert row["ratio_error"] == pytest.approx(p["cc_on_ms"] / p["cc_off_ms"] / 1.2 - 1)


def test_runs_of_other_launches_or_without_rounds_fall_back_to_pooled_medians():
    off, on = in_turns([1000.0] * 6, [1.1] * 6)
    other_off, _ = in_turns([1000.0] * 6, [1.1] * 6, launch="L2")
    assert V.launch_rounds([other_off], [on]) is None           # its CC-off is elsewhere
    assert V.compare(HW, other_off, on)["comparison"] == "pooled medians"
    on["iterations"][2]["round"] = None
    assert V.launch_rounds([off], [on]) is None
    assert V.compare(HW, off, on)["paired"] is None


def test_each_measured_iteration_is_predicted_and_the_medians_compared():
    off, on = run("off"), run("on")
    off["iterations"] = [step(0, warmup=True, forward_ms=999, backward_ms=999)] + [
        step(i + 1, forward_ms=f, backward_ms=2 * f) for i, f in enumerate((100, 300, 200))]
    wls = V.workloads_from_run(off, HW)
    assert [w.forward_ms for w in wls] == [100, 300, 200]        # warm-up left out
    row = V.compare(HW, off, on)
    sched = V.schedule_from_run(on)
    mid = predict(HW, wls[2], sched, 2)                          # forward 200: the median
    assert row["iterations_modelled"] == 3
    assert row["predicted_cc_on_ms"] == pytest.approx(mid["cc_on_ms"])
    assert row["predicted_cc_off_ms"] == pytest.approx(mid["cc_off_ms"])
    with pytest.raises(ConfigError, match="CC-off runs only"):
        V.workloads_from_run(on, HW)


def test_schedule_follows_the_run():
    naive = V.schedule_from_run(run("on", schedule="naive"))
    assert naive.schedule == "naive"
    pipe = V.schedule_from_run(run("on", n=4))
    assert pipe.schedule == "pipelined" and pipe.chains == 1 and pipe.segment_bytes == 4 * MIB
    r = run("on")
    r["settings"]["chains"] = 3
    assert V.schedule_from_run(r).chains == 3
    r["settings"]["allgather"] = "group-key"
    assert V.schedule_from_run(r).schedule == "group-key-allgather"
    r["settings"]["pad_budget_bytes"] = 8 * MIB          # the device engine's pads
    assert V.schedule_from_run(r).pad_budget_bytes == 8 * MIB
    with pytest.raises(ConfigError, match="unknown schedule"):
        V.schedule_from_run(run("on", schedule="fancy"))


def test_pairing_needs_same_workload_shapes_and_world_size():
    runs = [run("off"), run("on"), run("on", schedule="naive"), run("on", n=4),
            run("on", image_size=64), run("off", n=4, total=2000)]
    pairs = V.pair_runs(runs)
    assert len(pairs) == 3          # n=2 pipelined, n=2 naive, n=4
    assert all(V.run_key(a) == V.run_key(b) for offs, ons in pairs for a in offs for b in ons)
    with pytest.raises(ConfigError, match="no CC-on run has a CC-off run"):
        V.pair_runs([run("on"), run("off", image_size=64)])
    with pytest.raises(ConfigError, match="same workload"):
        V.compare(HW, run("off", n=4), run("on"))
    with pytest.raises(ConfigError, match="same workload"):
        V.compare(HW, run("off"), [run("on"), run("on", schedule="naive")])


def test_repeated_runs_are_pooled():
    def with_steps(r, totals):
        r["iterations"] = [step(i, t) for i, t in enumerate(totals)]
        return r
    runs = [with_steps(run("off"), [700, 710]), with_steps(run("off"), [900]),
            with_steps(run("on"), [1000, 1300]), with_steps(run("on"), [1100, 1200, 1250])]
    [(offs, ons)] = V.pair_runs(runs)
    assert len(offs) == 2 and len(ons) == 2
    row = V.compare(HW, offs, ons)
    assert row["measured_cc_off_ms"] == 710 and row["measured_cc_on_ms"] == 1200
    assert row["iterations_modelled"] == 3 and row["runs_cc_on"] == 2


def test_verdict_needs_three_workloads_at_both_world_sizes():
    def row(w, n, ok):
        return {"workload": w, "world_size": n, "schedule": "pipelined", "pass": ok}
    rows = [row(w, n, True) for w in ("a", "b", "c") for n in (2, 4)]
    assert V.verdict(rows)["accepted"]
    rows[-1]["pass"] = False
    v = V.verdict(rows)
    assert not v["accepted"] and v["workloads_passing_ws2_and_ws4"] == ["a", "b"]


def test_load_runs_from_files_dirs_and_characterize(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    (d / "off.json").write_text(json.dumps(run("off")))
    (d / "on.json").write_text(json.dumps(run("on")))
    (d / "calibrate.json").write_text(json.dumps({"schema": "ccddp.calibrate/1"}))
    assert len(V.load_runs([str(d)])) == 2
    ch = tmp_path / "results.json"
    ch.write_text(json.dumps({"schema": "ccddp.characterize/1", "runs": [
        {"key": "k1", "status": "ok", "result": run("off")},
        {"key": "k2", "status": "failed", "result": None}]}))
    assert len(V.load_runs([str(ch)])) == 1
    with pytest.raises(ConfigError, match="is not a `ccddp train --json`"):
        V.load_runs([str(d / "calibrate.json")])
    with pytest.raises(ConfigError, match="not found"):
        V.load_runs([str(tmp_path / "missing.json")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no measured training results"):
        V.load_runs([str(empty)])


def test_validate_cli_table_and_json(tmp_path, capsys):
    d = tmp_path / "runs"
    d.mkdir()
    for i, r in enumerate([run("off", total=700), run("on", total=900),
                           run("off", n=4, total=1400), run("on", n=4, total=1900)]):
        (d / f"{i}.json").write_text(json.dumps(r))
    out, md = tmp_path / "v.json", tmp_path / "v.md"
    assert main(["validate", "--profile", "local", "--measured", str(d), "--json", str(out),
                 "--markdown", str(md)]) == 0
    table = md.read_text().splitlines()
    assert table[0].startswith("| workload |") and len(table) == 6
    assert table[3].endswith("| pooled | no (time) |") and "Hodges-Lehmann" in table[5]
    text = capsys.readouterr().out
    assert "resnet50" in text and all(len(line) <= 120 for line in text.splitlines()), text
    assert main(["validate", "--profile", "local", "--measured", str(d), "--wide"]) == 0
    text = capsys.readouterr().out
    assert "resnet50" in text and "pred. on ms" in text and "ratio error" in text
    data = json.loads(out.read_text())
    assert data["schema"] == "ccddp.validate/1" and len(data["rows"]) == 2
    assert data["verdict"]["rows"] == 2 and not data["verdict"]["accepted"]
    assert data["profile"]["mac_gbps"] == "inf"          # strict JSON, no Infinity
    for r in data["rows"]:           # separate launches: pooled medians decide
        assert r["comparison"] == "pooled medians" and r["paired"] is None
        assert r["cc_on_error"] == pytest.approx(r["predicted_cc_on_ms"]
                                                 / r["measured_cc_on_ms"] - 1)
        assert set(r["predicted_phases_cc_on"]) == set(r["measured_phases_cc_on"])


def test_validate_cli_user_error(tmp_path, capsys):
    p = tmp_path / "on.json"
    p.write_text(json.dumps(run("on")))
    assert main(["validate", "--measured", str(p)]) == 2
    err = capsys.readouterr().err
    assert "no CC-on run has a CC-off run" in err and "Traceback" not in err
