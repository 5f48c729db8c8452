"""The report says which numbers to trust: a launch that stopped at its time cap with an
interval wider than the study's precision target is named as such, with why it stopped
and the machine's load while it ran; a scaling quotient below 1 is not drawn as a
speed-up without saying that the two came from separate launches, with the load of each."""

from __future__ import annotations

import json

from ccddp.cli import main
from ccddp.report.figures import scaling_load_note
from ccddp.report.results import Results
from test_report import make_results

QUIET = {"load_before": [0.4, 0.5, 0.6], "load_after": [0.6, 0.5, 0.6], "cores": 2, "wall_s": 40.0,
         "others_cpu_s": 1.6, "others_share": 0.02}
LOADED = {"load_before": [3.9, 3.0, 2.0], "load_after": [4.2, 3.2, 2.1], "cores": 2, "wall_s": 95.0,
          "others_cpu_s": 85.5, "others_share": 0.45}


def _study() -> dict:
    data = make_results(workloads=("graphsage", "resnet50"), world_sizes=(2, 3), failed=(), projections=False)
    data["config"].update(budget_s=90.0, precision=0.1, steps=8)
    for run in data["runs"]:
        wide = run["workload"] == "graphsage" and run["world_size"] == 3
        run["launch"] = LOADED if wide else QUIET
        run["result"]["pairing"]["stop"] = "time cap" if wide else "precision"
        if wide and run["cc"] == "on" and run["schedule"] == "naive":
            # Rounds that swing ±40 % against CC-off: a ratio interval far wider than ±10 %.
            for it in run["result"]["iterations"]:
                if not it["warmup"]:
                    it["total_ms"] *= 1.4 if it["round"] % 2 else 0.75
    return data


def test_the_report_names_the_launch_that_missed_its_precision_and_why(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_study()))
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "**1 of 4 launches missed the ±10% precision target** (graphsage at 3 ranks)" in text
    assert "the 1-minute load average reached 4.2 on 2 cores and other processes took up to 45% of the CPU" \
        in text
    trust = [line for line in text.splitlines() if "time cap (90 s)" in line]
    assert len(trust) == 1 and "**missed ±10%** (naive)" in trust[0] and "3.9 → 4.2 (2 cores)" in trust[0], trust
    assert "45%" in trust[0]
    assert sum("met ±10%" in line and "precision reached" in line for line in text.splitlines()) == 3
    # The ratio table marks the missed ratio, and only it.
    marked = [line for line in text.splitlines() if line.startswith("|") and " †" in line]
    assert len(marked) == 1 and marked[0].startswith("| graphsage | 3 |") and marked[0].count(" †") == 1


def test_a_file_without_load_records_says_so():
    data = _study()
    for run in data["runs"]:
        del run["launch"]
        del run["result"]["pairing"]["stop"]
    from ccddp.report.markdown import _trust

    text = "\n".join(_trust(Results(data)))
    assert "records no load per launch" in text and "not recorded (older file); a cap" in text


def test_scaling_below_one_says_the_launches_ran_under_different_load():
    data = _study()
    res = Results(data)
    # Make CC-on pipelined at 3 ranks faster than at 2 for graphsage.
    for run in data["runs"]:
        if run["key"] == "graphsage/ws3/cc-on/pipelined":
            run["result"]["summary"]["total_ms"] = res.total_ms("graphsage", 2, "on", "pipelined") * 0.8
    res = Results(data)
    panels = [("pipelined", 2, [3], ["graphsage", "resnet50"])]
    note = scaling_load_note(res, panels)
    assert "3 ranks faster than 2" in note and "different times and loads" in note and "not a speed-up" in note
    assert "load average up to 0.6 during its 2-rank launch, 4.2 during its 3-rank one" in note
    assert scaling_load_note(Results(_study()), panels) == ""


def test_characterize_records_the_load_of_every_launch(tmp_path, monkeypatch):
    # The launch itself is replaced (no ranks): what is recorded around it is under test.
    import ccddp.bench.characterize as ch
    import ccddp.bench.launch as launch

    monkeypatch.setattr(launch, "torchrun", lambda *a, **k: sum(range(10 ** 6)))
    plan = ch.Plan(["graphsage"], [2], ["pipelined"], 3, 1)
    data = {"schema": ch.SCHEMA, "machine": {}, "config": plan.as_dict(), "buckets": {}, "runs": [], "projections": []}
    ch.run_group(plan, "graphsage", 2, data, str(tmp_path / "results.json"), 60.0)
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        load = run["launch"]
        assert run["status"] == "failed" and len(load["load_before"]) == 3 and len(load["load_after"]) == 3
        assert load["cores"] >= 1 and load["wall_s"] >= 0 and 0 <= load["others_share"]
