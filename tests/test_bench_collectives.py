"""``ccddp bench collectives``: every op and implementation checked for #wrong, the JSON
fields issue #2 asks for, and a wrong result is counted (not hidden by the timing)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
# Processes: a rank wraps the benchmark module's all_reduce for itself (a module global).
from dist_util import run_ranks


def _bench_rank(rank, n, broken):
    import os

    import ccddp.bench.collectives as C

    os.environ["CCDDP_GROUP_SECRET"] = "d8f79edf70a78f8d7207e5e25618aaceb142c969e0ff49dfd6b33323ba06da60"     # as `ccddp bench` sets for its ranks
    if broken == "record":
        # Which implementation ran each all_reduce, in call order.
        real, calls = C.all_reduce, []

        def recording(t, g):
            calls.append(g.settings.impl)
            return real(t, g)

        C.all_reduce = recording
        args = C.build_parser().parse_args(["--sizes", "4K", "--impl", "secure,gloo,ring", "--iters", "3",
                                            "--warmup", "1"])
        return C.bench(args), calls
    if broken:
        real = C.all_reduce

        def off_by_one(t, g):
            real(t, g)
            if g.rank == 0:
                t[:3] += 1
            return t

        C.all_reduce = off_by_one
    args = C.build_parser().parse_args(["--sizes", "4K,40000", "--impl", "gloo,ring,secure-naive,secure",
                                        "--ops", ",".join(C.OPS), "--dtype", "bfloat16", "--iters", "2",
                                        "--warmup", "1", "--segment-mb", "0.01"])
    return C.bench(args)


def test_every_op_and_impl_is_correct_and_counted():
    rows = run_ranks(_bench_rank, 3, False)[0]
    assert len(rows) == 4 * 4 * 2
    for r in rows:
        assert r["wrong"] == 0, r
        for key in ("op", "impl", "bytes", "world_size", "time_us", "algbw_gbps", "busbw_gbps",
                    "seals_per_rank", "opens_per_rank"):
            assert key in r
        assert r["time_us"] > 0 and r["world_size"] == 3 and r["cpu_us_per_rank"] > 0
        if r["impl"] == "secure" and r["op"] == "all_reduce":
            assert r["seals_per_rank"] == r["opens_per_rank"] == 4     # 2(n-1)
        if r["impl"] in ("gloo", "ring"):
            assert r["seals_per_rank"] == 0
        others = {"gloo", "ring", "secure-naive", "secure"} - {r["impl"]}
        assert set(r["paired_ratios"]) == others and all(v > 0 for v in r["paired_ratios"].values())


def test_implementations_take_turns_call_by_call():
    rows, calls = run_ranks(_bench_rank, 2, "record")[0]
    # 1 warm-up + 3 measured iterations, each calling every implementation in --impl order.
    assert calls == ["secure", "gloo", "ring"] * 4
    assert [r["impl"] for r in rows] == ["secure", "gloo", "ring"]
    assert all(r["wrong"] == 0 and r["iters"] == 3 for r in rows)


def test_paired_ratio_is_the_median_of_per_iteration_ratios():
    from ccddp.bench.collectives import paired_ratios

    # A slow third iteration for "b" only: the ratio of medians (2/3) would blame "a" for
    # the drift; the paired median says "a" took half of "b"'s time in most iterations.
    slowest = {"a": [1.0, 2.0, 30.0], "b": [2.0, 4.0, 3.0], "c": [1.0, 2.0, 30.0]}
    assert paired_ratios(slowest, "a") == {"b": 0.5, "c": 1.0}
    assert paired_ratios(slowest, "b") == {"a": 2.0, "c": 2.0}


def test_an_implementation_listed_twice_is_refused():
    from ccddp.bench.collectives import build_parser, validate
    from ccddp.errors import ConfigError

    with pytest.raises(ConfigError, match="twice"):
        validate(build_parser().parse_args(["--impl", "gloo,secure,gloo"]))


def test_a_wrong_result_is_reported_per_iteration():
    rows = run_ranks(_bench_rank, 2, True)[0]
    ar = [r for r in rows if r["op"] == "all_reduce"]
    # 3 elements wrong on rank 0, 2 measured iterations; the other ops are untouched.
    assert ar and all(r["wrong"] == 6 for r in ar), [r["wrong"] for r in ar]
    assert all(r["wrong"] == 0 for r in rows if r["op"] != "all_reduce")


def test_cli_writes_json(tmp_path):
    out = tmp_path / "coll.json"
    proc = subprocess.run([sys.executable, "-m", "ccddp.cli", "bench", "collectives", "--world-size", "2",
                           "--sizes", "64K", "--impl", "gloo,secure", "--iters", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    assert {r["impl"] for r in rows} == {"gloo", "secure"}
    assert "#wrong" in proc.stdout and "algbw" in proc.stdout and "vs gloo" in proc.stdout
    assert set(rows[1]["paired_ratios"]) == {"gloo"}
    # Which AES-GCM code path the result ran on is part of what it was measured on.
    from ccddp.bench.machine import AES_FLAGS

    machine = data["machine"]
    assert machine["openssl"].startswith("OpenSSL")
    assert set(machine["aes_flags"]) <= set(AES_FLAGS)
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    assert machine["aes_flags"] == [f for f in AES_FLAGS if f in flags]


def test_checking_a_result_counts_wrong_elements_without_a_result_sized_allocation():
    # The check runs between barriers on cores other ranks share; a bool sum() widened the
    # whole result to int64 first (8 bytes per element of fresh, page-faulted memory).
    import resource

    import torch

    from ccddp.bench.collectives import _Case

    case = _Case("all_reduce", 2, 0, 1 << 22, torch.float32)
    case.buf.copy_(case.expect)
    assert case.wrong() == 0
    case.buf[[5, 77, 1 << 21]] += 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert case.wrong() == 3
    # 4 Mi elements as int64 would be 8192 fresh pages; allow for interpreter noise.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults < 500
