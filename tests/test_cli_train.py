"""``ccddp train`` end to end through torchrun: single node, two "nodes" on loopback,
and user errors as one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ccddp.bench.launch import free_port

SECRET = "04fccafb0452801fd7829c2113e85de94146f84ef090b1f880c47b8dcf90fec9"


def _ccddp(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ccddp.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _shape(d):
    """The structure of a result: keys and value types, recursively (numbers differ run to run)."""
    if isinstance(d, dict):
        return {k: _shape(v) for k, v in d.items() if k not in ("machine",)}
    if isinstance(d, list):
        return [_shape(d[0])] if d else []
    return type(d).__name__ if not isinstance(d, (int, float)) or isinstance(d, bool) else "number"


def test_two_nodes_on_loopback_match_a_single_node_run(turns, tmp_path):
    """Two one-rank nodes (``--nnodes 2``) end where the single-node launch's same variant
    ended (the ``turns`` launch's ``on:pipelined``: every variant builds its model afresh
    and sees the same batches, so its result is a one-variant run's, but for the pairing's
    launch id)."""
    port = str(free_port())
    multi = tmp_path / "multi.json"
    common = ["train", "--workload", "graphsage", "--size", "tiny", "--cc", "on", "--schedule", "pipelined",
              "--steps", "6", "--warmup", "1", "--timeout", "60"]
    nodes = [subprocess.Popen([sys.executable, "-m", "ccddp.cli", *common, "--world-size", "1", "--nnodes", "2",
                               "--node-rank", str(k), "--master-addr", "127.0.0.2", "--master-port", port]
                              + (["--json", str(multi)] if k == 0 else []),
                              env={**os.environ, "CCDDP_GROUP_SECRET": SECRET},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    for p in nodes:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    a = next(run for run in json.loads(turns[0].read_text())["runs"] if run["variant"] == "on:pipelined")
    b = json.loads(multi.read_text())
    assert a["world_size"] == b["world_size"] == 2
    a_shape = _shape(a)
    del a_shape["pairing"]["launch"]
    assert a_shape == _shape(b)
    # 2(n-1) per ring all-reduce, n-1 per two-rank exchange (issue 42).
    assert a["seals_per_rank"] == b["seals_per_rank"] == 2 * a["allreduce_calls_per_iteration"] - a[
        "exchanges_per_iteration"]
    # Same seed, same data, same reduction order at n=2: the same final parameters.
    assert a["param_sha256"] == b["param_sha256"]


@pytest.mark.parametrize("args, expect", [
    (["train", "--workload", "nope"], "unknown workload"),
    (["train", "--workload", "resnet50", "--world-size", "1"], "at least 2 ranks"),
    (["train", "--workload", "gpt2-xl", "--world-size", "64", "--dtype", "float32"], "GiB is available"),
    (["train", "--workload", "resnet50", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "1"],
     "group secret"),
    (["train", "--workload", "resnet50", "--cc", "off,on", "--precision", "0.1"], "--precision needs --budget"),
    (["train", "--workload", "resnet50", "--cc", "off,on", "--budget", "9", "--precision", "10"],
     "fraction of the ratio"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_user_errors_are_one_line(args, expect, monkeypatch, ccddp_here):
    """Refused before any rank starts, so in this process: exit status 2 and one line on
    stderr, no traceback."""
    monkeypatch.setenv("CCDDP_GROUP_SECRET", "")
    code, err = ccddp_here(*args)
    assert code == 2, (args, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in err, (args, err)


def test_memory_estimate_counts_each_schedules_frames(monkeypatch):
    import pytest

    from ccddp.bench import memory
    from ccddp.errors import ConfigError
    from ccddp.workloads import get_workload

    wl = get_workload("gpt2-xl", dtype="bfloat16")
    params = wl.num_params * 2
    off = memory.estimate_bytes(wl, 2)
    assert off == int(2 * 2.5 * params)
    # Naive: a receive and a send frame of a whole chunk (DDP's first bucket is every
    # gradient); pipelined: at most two rounds' worth, whatever the model.
    assert memory.frame_bytes(wl, 2, "naive") == int(2 * params / 2)
    assert memory.frame_bytes(wl, 4, "naive") == int(2 * params / 4)
    assert memory.frame_bytes(wl, 2, "pipelined") == 2 * (256 << 20)
    assert memory.estimate_bytes(wl, 2, 2, "naive") > memory.estimate_bytes(wl, 2, 2, "pipelined") > off
    # A request that fits CC-off-and-pipelined but not with naive's frames is refused in one
    # line that names the fix.
    have = memory.estimate_bytes(wl, 2, 2, "pipelined") + (1 << 30)
    monkeypatch.setattr(memory, "available_bytes", lambda: have)
    memory.check_fits(wl, 2, 2, "pipelined")
    with pytest.raises(ConfigError, match="naive frames.*--schedule pipelined"):
        memory.check_fits(wl, 2, 2, "naive")


def test_tiny_workloads_stay_under_the_bound_that_spares_their_memory_check():
    """``ccddp train --size tiny`` does not load the model to check its memory: each tiny
    model, in any dtype and with any of the options that ``train`` passes (which change
    activations, not parameters), with the frames of either schedule, stays under
    ``TINY_BYTES_PER_RANK`` per rank."""
    from ccddp.bench import memory
    from ccddp.workloads import WORKLOADS, get_workload

    for name in WORKLOADS:
        for overrides in ({}, {"dtype": "float32", "batch_size": 64, "seed": 7}):
            wl = get_workload(name, "tiny", **overrides)
            for schedule in (None, "naive", "pipelined"):
                assert memory.estimate_bytes(wl, 1, 2, schedule) < memory.TINY_BYTES_PER_RANK, (name, schedule)
        if name != "graphsage":     # the options that change a tiny model's inputs leave its parameters
            key = "image_size" if name.startswith("resnet") else "seq_len"
            assert get_workload(name, "tiny", **{key: 64}).num_params == get_workload(name, "tiny").num_params


def test_a_rank_killed_by_the_kernel_is_reported_as_such():
    from ccddp.bench.launch import reason

    stderr = """E1122 09:43:20.000000 17566 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 17612) of binary: /usr/bin/python
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -9 (pid: 17612)  (SIGKILL)
"""
    line = reason(stderr)
    assert "local rank 1" in line and "SIGKILL" in line and "out-of-memory" in line, line
    # A ccddp error on another rank still wins: it says what went wrong first, without the
    # rank's own "ccddp: error: " (the command that reports it puts its own first).
    assert reason(stderr + "[rank0]: ccddp: error: rank 0: ConfigError: x\n") == "rank 0: ConfigError: x"


@pytest.fixture(scope="module")
def turns(tmp_path_factory):
    """One launch of three variants taking turns, in a pipe (no terminal), that three tests
    read: its result file, its output."""
    out = tmp_path_factory.mktemp("turns") / "cmp.json"
    r = _ccddp("train", "--workload", "graphsage", "--size", "tiny", "--cc", "off,on", "--schedule", "naive,pipelined",
               "--world-size", "2", "--steps", "6", "--warmup", "1", "--timeout", "60", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    return out, r


def test_cc_off_and_on_take_turns_in_one_launch_and_print_paired_ratios(turns):
    out, r = turns
    data = json.loads(out.read_text())
    assert data["schema"] == "ccddp.train.compare/1"
    runs = {run["variant"]: run for run in data["runs"]}
    assert list(runs) == ["off", "on:naive", "on:pipelined"]
    launch = {run["pairing"]["launch"] for run in runs.values()}
    assert len(launch) == 1 and all(run["pairing"]["alternation"] == "iteration" for run in runs.values())
    # Every iteration is kept; each round runs each variant once, the order rotating.
    for run in runs.values():
        assert [it["round"] for it in run["iterations"]] == [None] + list(range(6))
        assert run["steps"] == 6
        # CPU time from backward's start to the last bucket: the training thread's is part
        # of its process's, and neither exceeds what the process could use in that window.
        for it in run["iterations"]:
            window = it["backward_ms"] + it["exposed_comm_ms"]
            assert 0 < it["backward_main_cpu_ms"] <= it["backward_process_cpu_ms"] + 1.0
            assert it["backward_main_cpu_ms"] <= window + 1.0
    for rnd in range(6):
        order = sorted(runs, key=lambda v: next(it["start_ms"] for it in runs[v]["iterations"] if it["round"] == rnd))
        assert order == list(runs)[rnd % 3:] + list(runs)[:rnd % 3], (rnd, order)
    # The CC-on input path reports its stages and how it ran (on the CPU: OpenSSL opens).
    assert runs["off"]["bounce"] is None
    for variant in ("on:naive", "on:pipelined"):
        assert runs[variant]["bounce"]["opener"] == "host"
        for it in runs[variant]["iterations"]:
            assert it["bounce_seal_ms"] > 0 and it["bounce_open_ms"] > 0 and it["bounce_copy_ms"] >= 0
            assert it["bounce_seal_ms"] + it["bounce_copy_ms"] + it["bounce_open_ms"] <= it["bounce_ms"] + 0.01
    # Same start, same batches, own random streams: bit-identical training at 2 ranks.
    assert len({run["param_sha256"] for run in runs.values()}) == 1
    on = runs["on:pipelined"]
    assert on["seals_per_rank"] == 2 * on["allreduce_calls_per_iteration"] - on["exchanges_per_iteration"]
    # The summary pairs them; 6 rounds give each ratio a 95 % interval.
    lines = r.stdout.splitlines()
    for variant in ("on:naive", "on:pipelined"):
        row = next(ln for ln in lines if ln.lstrip("│ ").startswith(variant))
        assert re.search(r"(\d+\.\d\d× |no measurable difference )\(\d+\.\d\d–\d+\.\d\d\)", row), row
    # The footnote (under the table, wrapped to its width) says how the ratio is made.
    assert "¹ Hodges-Lehmann median of per-round ratios" in " ".join(" ".join(lines).split())


def test_variants_that_take_turns_in_blocks_rebuild_their_model_every_round(tmp_path):
    out = tmp_path / "blocks.json"
    r = _ccddp("train", "--workload", "graphsage", "--size", "tiny", "--cc", "off,on", "--world-size", "2",
               "--alternate", "block", "--block", "2", "--steps", "4", "--warmup", "1", "--timeout", "60",
               "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    off, on = json.loads(out.read_text())["runs"]
    for run in (off, on):
        assert run["pairing"]["alternation"] == "block" and run["pairing"]["rounds"] == 2
        # Each round: a fresh model, its warm-up, then a block of 2 measured iterations.
        assert [it["round"] for it in run["iterations"]] == [None, 0, 0, None, 1, 1]
    # Round 1 of CC-on came first (turns rotate), after CC-off's round 0.
    start = {(run["variant"], it["round"]): it["start_ms"] for run in (off, on) for it in run["iterations"]
             if it["round"] is not None}
    assert start[("off", 0)] < start[("on:pipelined", 0)] < start[("on:pipelined", 1)] < start[("off", 1)]


def test_precision_stops_a_budgeted_launch_once_the_ratios_are_that_precise(tmp_path):
    # A tiny model's round takes ~0.1 s: 60 s of budget would hold the 200-round cap. A
    # precision the intervals meet early stops at the first round where every ratio's
    # interval is that precise (recomputed here from the recorded rounds, so a load spike
    # that widens an interval for a round or two moves the stop, not the verdict); one no
    # interval can meet measures the whole cap.
    from ccddp.stats import paired_ratio

    def launch(precision: str, budget: str) -> list[dict]:
        out = tmp_path / f"p{precision}.json"
        r = _ccddp("train", "--workload", "graphsage", "--size", "tiny", "--cc", "off,on", "--world-size", "2",
                   "--steps", "6", "--warmup", "1", "--budget", budget, "--precision", precision, "--timeout", "60",
                   "--json", str(out), env={"CCDDP_GROUP_SECRET": SECRET})
        assert r.returncode == 0, r.stderr[-2000:]
        runs = json.loads(out.read_text())["runs"]
        assert len({run["pairing"]["rounds"] for run in runs}) == 1
        return runs

    def first_precise_round(runs: list[dict], precision: float) -> int | None:
        times = {run["variant"]: {it["round"]: it["total_ms"] for it in run["iterations"] if not it["warmup"]}
                 for run in runs}
        off = times.pop("off")
        for n in range(6, len(off) + 1):
            widths = [paired_ratio({k: v for k, v in on.items() if k < n}, {k: v for k, v in off.items() if k < n})
                      for on in times.values()]
            if all(iv is not None and iv.known and iv.half_width <= precision for iv in widths):
                return n
        return None

    precise = launch("0.99", "60")
    rounds = precise[0]["pairing"]["rounds"]
    assert {run["pairing"]["stop"] for run in precise} == {"precision"}, "why it stopped is recorded"
    assert 6 <= rounds < 200 and rounds == first_precise_round(precise, 0.99), rounds
    capped = launch("0.0001", "3")
    assert {run["pairing"]["stop"] for run in capped} == {"time cap"}
    assert capped[0]["pairing"]["rounds"] > 6 and first_precise_round(capped, 0.0001) is None


def test_train_says_what_it_launched_then_each_iteration_once(turns):
    # In a pipe (no terminal): the launch line comes first, before any rank starts, and
    # rank 0 alone prints one line per iteration of each variant (none repeated by rank 1).
    out, r = turns
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ccddp train: graphsage (tiny) on 2 ranks, cc off, on:naive, on:pipelined; "
                               "1 warm-up + 6 measured iterations"), lines[:3]
    assert str(out) in lines[0]
    for variant in ("off", "on:naive", "on:pipelined"):
        progress = [line.split() for line in lines if line.startswith("  iteration ")]
        progress = [" ".join(p) for p in progress if p[2].rstrip(":") == variant]
        assert [p.split()[1] for p in progress] == [f"{k}/7" for k in range(1, 8)], lines
        assert "(warm-up)" in progress[0] and not any("(warm-up)" in p for p in progress[1:])
