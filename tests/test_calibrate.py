"""`ccddp calibrate`: micro-benchmarks only, a complete and valid profile, every field a
record of its value and source (measured / derived / assumed); the fits it relies on
recover known values, the crypto's fixed and per-byte costs with their uncertainty."""

from __future__ import annotations

import json
import math
import re

import pytest

from ccddp.bench.calibrate_fit import (build_profile, crypto_lines, derive_profile, fit_line,
                                      fit_segment_overhead, model_checks)
from ccddp.cli import main
from ccddp.errors import ConfigError
from ccddp.sim import FIELDS, load_profile, validate_profile, write_profile
from ccddp.sim.profile import FieldValue, Source

MIB = 1 << 20


def fake_measurements(world_size: int = 2) -> tuple[dict, dict]:
    """What calibrate's micro-benchmarks return, with round numbers."""
    rows = [{"bytes": b, "seal_s": 10e-6 + b / 3e9, "open_s": 12e-6 + b / 3.2e9}
            for b in (4096, 65536, MIB)]
    local = {"crypto": {"rows": rows, **crypto_lines(rows)},
             "crypto_chains": {"bytes": MIB, "max_chains": 2, "scaling": 1.93,
                               "rows": [{"chains": 1, "gbps": 3.0}, {"chains": 2, "gbps": 5.8}]},
             "torch": {"reduce_gbps": 8.0, "memcpy_gbps": 1.5, "sgd_gbps": 7.0,
                       "matmul_tflops": 0.07, "xor_gbps": 9.0}}
    stream = [{"bytes": b, "s": 100e-6 + b / 0.6e9, "cpu_s": b / 1.2e9}
              for b in (256 << 10, MIB, 4 * MIB)]
    p2p = {"world_size": world_size, "rtt_us": 200.0, "stream": stream,
           "tiny": {"bytes": world_size * 64 * 4096, "segment_bytes": 4096, "chains": 1,
                    "seg_hops": 2 * (world_size - 1) * 64, "secure_s": 0.05,
                    "secure_cpu_s": 0.03, "ring_s": 0.02, "ring_cpu_s": 0.01},
           "allreduce": [{"impl": i, "bytes": 4 * MIB, "segment_bytes": 4 * MIB, "chains": 1,
                          "s": 0.01} for i in ("gloo", "ring", "secure-naive", "secure")]}
    return local, p2p


def test_fit_line_recovers_intercept_and_slope_with_their_errors():
    xs = [1e3, 1e4, 1e5, 1e6]
    f = fit_line(xs, [5e-6 + x / 2e9 for x in xs])
    assert f.intercept == pytest.approx(5e-6, rel=1e-6) and f.slope == pytest.approx(1 / 2e9, rel=1e-6)
    assert f.intercept_se < 1e-12 and f.slope_se < 1e-18      # exact data: no scatter
    assert fit_line([1, 2], [0.5, 1.5]).intercept == 0.0     # a negative intercept is clipped
    # Scatter on the small sizes widens the intercept's error, not the slope's much.
    noisy = fit_line(xs * 2, [5e-6 + x / 2e9 + (1e-6 if x < 1e5 and i < 4 else -1e-6 if x < 1e5 else 0)
                              for i, x in enumerate(xs * 2)])
    assert noisy.intercept_se > 1e-8 and noisy.intercept == pytest.approx(5e-6, abs=3 * noisy.intercept_se)


def test_build_profile_is_complete_and_marks_every_field():
    local, p2p = fake_measurements()
    d, header = build_profile(local, p2p)
    hw = validate_profile(d)
    records = {k: v for k, v in d.items() if isinstance(v, FieldValue)}
    assert set(records) == {f.name for f in FIELDS} - {"name", "description"}
    assert all(r.note for r in records.values())
    assert hw.enc_gbps == pytest.approx(3.0, rel=1e-6) and hw.dec_gbps == pytest.approx(3.2, rel=1e-6)
    assert hw.crypto_op_us == pytest.approx(11.0, rel=1e-3)
    assert hw.field("crypto_op_us").source is Source.MEASURED
    assert hw.field("crypto_op_us").stderr is not None and hw.field("enc_gbps").stderr is not None
    assert hw.envelope_chains == 2 and hw.envelope_min_bytes == 4096 and hw.mac_chains == 0
    assert hw.link_gbps == pytest.approx(0.6, rel=1e-3)
    assert hw.link_latency_us == 100.0 and hw.reduce_gbps == 8.0 and math.isinf(hw.mac_gbps)
    assert hw.link_cpu_gbps == pytest.approx(1.2, rel=1e-3)
    assert hw.host_cores >= 1 and hw.overlap_efficiency == 0.0
    assert any("never from training runs" in h for h in header)
    from ccddp.bench.machine import cpu_details
    assert any(f"flags: {' '.join(cpu_details()['aes_flags']) or 'none'};" in h for h in header)


def test_rates_measured_with_every_rank_busy_are_preferred():
    import os
    local, p2p = fake_measurements(world_size=4)
    p2p["concurrent"] = {"seal_fixed_us": 20.0, "open_fixed_us": 22.0, "seal_gbps": 1.0,
                         "open_gbps": 1.1, "seal_fixed_us_se": 1.0, "open_fixed_us_se": 1.0,
                         "seal_gbps_se": 0.01, "open_gbps_se": 0.01, "matmul_tflops": 0.05,
                         "memcpy_gbps": 5.0, "reduce_gbps": 4.0, "sgd_gbps": 6.0, "xor_gbps": 7.0}
    p2p["interference"] = {"compute_s": 1.0, "crypto_s": 0.5, "both_s": 1.8, "excess": 0.2}
    d, _ = build_profile(local, p2p)
    v = {k: getattr(x, "value", x) for k, x in d.items()}
    soft = max(1.0, 4 / (os.cpu_count() or 1))   # the model slows 4 ranks on fewer cores
    per_core = max(1.0, 4 * v["compute_threads"] / (os.cpu_count() or 1))
    assert v["interference"] == pytest.approx(0.2 / per_core, rel=1e-3)
    assert d["interference"].source is Source.MEASURED
    assert v["enc_gbps"] == pytest.approx(1.0 * soft) and v["dec_gbps"] == pytest.approx(1.1 * soft)
    assert v["crypto_op_us"] == pytest.approx(21.0 / soft, rel=1e-3)
    assert v["reduce_gbps"] == pytest.approx(4.0 * soft)
    assert "4 ranks at once" in d["enc_gbps"].note


def test_link_rate_measured_on_more_ranks_than_cores_is_uncontended():
    """At 4 ranks on 2 cores the model slows the link 2x itself; calibrate undoes that."""
    local, p2p = fake_measurements(world_size=4)
    d, _ = build_profile(local, p2p)
    import os
    factor = max(1.0, 4 / (os.cpu_count() or 1))
    assert d["link_gbps"].value == pytest.approx(0.6 * factor, rel=1e-3)


def test_segment_overhead_fit_reproduces_the_micro_benchmark():
    from ccddp.sim.collective import secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    local, p2p = fake_measurements()
    d, _ = build_profile(local, p2p)
    truth = validate_profile({**d, "segment_overhead_us": 250.0})
    tiny = dict(p2p["tiny"])
    sched = Schedule("pipelined", segment_bytes=tiny["segment_bytes"], chains=tiny["chains"])
    cost = secure_allreduce(Rates.resolve(truth, sched, 2, True), sched, 2, tiny["bytes"])
    tiny["secure_s"], tiny["secure_cpu_s"] = cost.ms / 1e3, cost.busy_ms / 1e3
    hw = validate_profile(d)
    if hw.host_cores >= 2:          # the model's busy time is core time at 2 ranks
        assert fit_segment_overhead(hw, tiny, 2) == pytest.approx(250.0, abs=0.1)
    assert fit_segment_overhead(hw, tiny, 2, quantity="wall") == pytest.approx(250.0, abs=0.1)
    tiny["secure_s"] = tiny["secure_cpu_s"] = 1e-9     # faster than the model can be
    assert fit_segment_overhead(hw, tiny, 2) == 0.0
    assert fit_segment_overhead(hw, tiny, 2, quantity="wall") == 0.0
    rows = model_checks(truth, p2p)
    assert [r["impl"] for r in rows] == ["gloo", "ring", "secure-naive", "secure"]
    assert all(r["model_ms"] > 0 and r["measured_ms"] == 10.0 for r in rows)


def test_checks_say_which_rows_a_field_was_solved_from():
    local, p2p = fake_measurements()
    big = [{**r, "bytes": 64 * MIB, "s": 0.1, "cpu_s": 0.08 if r["impl"] != "secure" else 0.12}
           for r in p2p["allreduce"]]
    p2p["allreduce"] = p2p["allreduce"] + big
    out = derive_profile(local, p2p)
    fitted = {(c["impl"], c["bytes"]): c["fitted"] for c in out["checks"]}
    solved_link = out["profile"]["link_gbps"].note.startswith("solved through the model")
    solved_crypto = "solved through the model" in out["profile"]["enc_gbps"].note
    assert fitted.pop(("ring", 64 * MIB)) == ("time" if solved_link else "")
    assert fitted.pop(("secure", 64 * MIB)) == ("CPU" if solved_crypto else "")
    assert solved_link or solved_crypto
    assert set(fitted.values()) == {""}          # everything else is a check


def test_write_profile_records_and_header(tmp_path):
    d = load_profile("local").as_records()
    d["enc_gbps"] = FieldValue(2.5, Source.MEASURED, "here", stderr=0.1)
    out = write_profile(d, tmp_path / "p.toml", header=["calibrated today"])
    text = out.read_text()
    assert "# calibrated today" in text
    assert re.search(r'(?m)^enc_gbps = \{ value = 2.5, source = "measured", stderr = 0.1, '
                     r'note = "here" \}$', text)
    again = load_profile(out)
    assert again.field("enc_gbps") == d["enc_gbps"]
    with pytest.raises(ConfigError, match="unknown profile field 'nope'"):
        write_profile({**d, "nope": 1}, tmp_path / "q.toml")


def test_calibrate_fast_writes_a_profile_load_profile_accepts(tmp_path, capsys):
    out, js = tmp_path / "local.toml", tmp_path / "cal.json"
    assert main(["calibrate", "--fast", "--out", str(out), "--json", str(js)]) == 0
    hw = load_profile(str(out))
    assert hw.name == "local" and hw.host_cores >= 1
    assert hw.enc_gbps > 0 and hw.link_gbps > 0 and hw.reduce_gbps > 0
    text = out.read_text()
    for f in FIELDS:
        if f.name not in ("name", "description"):
            # each field is a record saying where its value came from
            assert re.search(rf'(?m)^{f.name} = {{ value = .*, source = "(measured|derived|'
                             rf'assumed)"', text), f.name
    assert hw.field("crypto_op_us").source is Source.MEASURED
    assert hw.field("crypto_op_us").stderr is not None and hw.envelope_chains >= 1
    # The sealed call's fixed cost, from the paired small all-reduce (issue 42).
    assert hw.field("op_fixed_us").source is Source.MEASURED and hw.op_fixed_us >= 0
    data = json.loads(js.read_text())
    small = data["measurements"]["p2p"]["small"]
    assert small["bytes"] == 4096 and small["secure_s"] > 0 and small["gloo_s"] > 0
    assert data["schema"] == "ccddp.calibrate/2" and data["fast"] is True
    assert data["profile"]["mac_gbps"]["value"] == "inf"
    assert {r["impl"] for r in data["checks"]} == {"gloo", "ring", "secure-naive", "secure"}
    # How loaded the machine was, recorded and said under the model check.
    assert data["load"]["cores"] >= 1 and "load_before" in data["load"]
    stdout = capsys.readouterr().out
    assert "wrote" in stdout
    assert re.search(r"(?m)^The model check ran (under load|on a quiet machine): ", stdout), stdout[-2000:]


def test_calibrate_user_errors(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["calibrate", "--out", str(tmp_path / "x.toml"), "--world-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "ccddp: error:" in err and "Traceback" not in err


def test_a_device_sweep_fills_the_same_crypto_fields():
    """A GPU engine's sweep in calibrate's row format (bytes, seal_s, open_s; chains,
    gbps) turns a GPU profile's assumed crypto into measured values with their errors."""
    from ccddp.bench.calibrate_fit import crypto_records

    sizes = [64 << 10, 1 << 20, 16 << 20, 64 << 20]
    rows = [{"bytes": b, "seal_s": 8e-6 + b / 200e9 * (1 + 0.01 * (-1) ** i),
             "open_s": 9e-6 + b / 180e9} for i, b in enumerate(sizes)]
    chains = {"rows": [{"chains": c, "gbps": 50.0 * min(c, 64) ** 0.5} for c in (1, 64, 256)]}
    rec = crypto_records(crypto_lines(rows), sizes, chains, how="CUDA engine, one GPU",
                         chains_are_threads=False)
    hw = load_profile("h100-cc").replace(**rec)
    assert hw.enc_gbps == pytest.approx(200, rel=0.02) and hw.dec_gbps == pytest.approx(180, rel=1e-3)
    assert hw.crypto_op_us == pytest.approx(8.5, rel=0.05)
    assert hw.field("enc_gbps").stderr > 0 and hw.field("dec_gbps").stderr < 1e-6
    assert hw.envelope_chains == 256 and hw.envelope_min_bytes == 64 << 10
    assert not {"enc_gbps", "dec_gbps", "crypto_op_us"} & set(hw.assumed())
    assert not hw.chains_scale_enc


def test_calibrate_fills_a_gpu_profile_from_device_channel_results(tmp_path, capsys):
    """`ccddp calibrate --device-sweep` turns `ccddp bench channel --device cuda --json`
    results at several sizes into a GPU profile whose crypto is measured (no GPU here:
    results in that format, written by hand)."""
    paths = []
    for b in (1 << 20, 16 << 20, 64 << 20):
        res = {"bytes": b, "device": "cuda:0", "rows": {
            "seal": {"median_s": 20e-6 + b / 150e9, "gbps": b / (20e-6 + b / 150e9) / 1e9},
            "open": {"median_s": 22e-6 + b / 140e9, "gbps": 0.0},
            "seal_pad": {"median_s": 0.0, "gbps": 900.0}}}
        p = tmp_path / f"ch{b}.json"
        p.write_text(json.dumps(res))
        paths.append(str(p))
    out = tmp_path / "h100-measured.toml"
    assert main(["calibrate", "--device-sweep", *paths, "--base", "h100-cc", "--out",
                 str(out)]) == 0
    hw = load_profile(str(out))
    assert hw.name == "h100-cc" and hw.device_link == "fenced"
    assert hw.enc_gbps == pytest.approx(150, rel=1e-3) and hw.crypto_op_us == pytest.approx(21, rel=1e-3)
    assert hw.xor_gbps == 900 and hw.envelope_max_bytes == 64 << 20
    assert not {"enc_gbps", "dec_gbps", "crypto_op_us", "xor_gbps"} & set(hw.assumed())
    assert main(["calibrate", "--device-sweep", paths[0], "--out", str(out)]) == 2
    assert "two or more sizes" in capsys.readouterr().err


# -- calibrate --device cuda: the device engine, host OpenSSL and pinned staging ---------------

STAGING_FIELDS = ("staging_d2h_gbps", "staging_h2d_gbps", "staging_copy_us")


def _device_channel_result(b: int) -> dict:
    """A `ccddp bench channel --device cuda --json` result at ``b`` bytes, in round numbers."""
    return {"bytes": b, "device": "cuda:0", "rows": {
        "seal": {"median_s": 20e-6 + b / 150e9, "gbps": 0.0},
        "open": {"median_s": 22e-6 + b / 140e9, "gbps": 0.0},
        "seal_pad": {"median_s": 0.0, "gbps": 900.0},
        "openssl_seal": {"median_s": 1e-6 + b / 4e9, "gbps": 0.0},
        "openssl_open": {"median_s": 1e-6 + b / 5e9, "gbps": 0.0}}}


def test_device_records_measure_the_engine_the_host_and_the_staging_copies():
    from ccddp.bench.calibrate_fit import device_profile, device_records

    sizes = (64 << 10, 1 << 20, 16 << 20)
    staging = [{"bytes": b, "d2h_s": 10e-6 + b / 25e9, "h2d_s": 12e-6 + b / 50e9} for b in sizes]
    rec = device_records([_device_channel_result(b) for b in sizes], staging=staging)
    assert set(rec) == {"enc_gbps", "dec_gbps", "crypto_op_us", "envelope_min_bytes", "envelope_max_bytes",
                        "xor_gbps", "cpu_crypto_gbps", *STAGING_FIELDS}
    assert all(r.source is Source.MEASURED and r.note for r in rec.values())
    assert rec["staging_d2h_gbps"].value == pytest.approx(25, rel=1e-3)
    assert rec["staging_h2d_gbps"].value == pytest.approx(50, rel=1e-3)
    assert rec["staging_copy_us"].value == pytest.approx(11, rel=1e-3)
    assert rec["cpu_crypto_gbps"].value == pytest.approx(4, rel=1e-3)
    assert rec["enc_gbps"].value == pytest.approx(150, rel=1e-3)
    hw = validate_profile(device_profile(load_profile("h100-cc"), [_device_channel_result(b) for b in sizes],
                                         staging=staging))
    assert not set(STAGING_FIELDS) & set(hw.assumed()) and hw.device_link == "fenced"


def test_the_staging_fields_are_in_every_profile_and_older_profiles_still_load(tmp_path):
    for name in ("h100-cc", "h200-cc", "b300-cc", "paper-h100", "local"):
        hw = load_profile(name)
        assert all(getattr(hw, f) >= 0 for f in STAGING_FIELDS)
        assert "not in this profile" not in hw.field("staging_h2d_gbps").note, name
    # A profile written before the staging fields existed: the CC-off input rate and the
    # launch cost stand in for them, marked assumed.
    old = {k: v for k, v in load_profile("h100-cc").as_records().items() if k not in STAGING_FIELDS}
    hw = validate_profile(old)
    assert hw.staging_d2h_gbps == hw.staging_h2d_gbps == hw.pcie_gbps
    assert hw.staging_copy_us == hw.kernel_launch_us
    assert set(STAGING_FIELDS) <= set(hw.assumed())
    assert "written before the field existed" in hw.field("staging_d2h_gbps").note


def test_the_staging_fields_decide_where_a_frame_is_sealed():
    from ccddp.sim.placement import cheaper_placement, placement_us

    hw = load_profile("h100-cc").replace(enc_gbps=200.0, dec_gbps=200.0, crypto_op_us=20.0, kernel_launch_us=5.0,
                                         cc_launch_toll=1.0, cpu_crypto_gbps=5.0, staging_d2h_gbps=25.0,
                                         staging_h2d_gbps=25.0, staging_copy_us=2.0)
    small, big = 1 << 10, 64 << 20
    assert cheaper_placement(hw, small) == "staged" and cheaper_placement(hw, big) == "device"
    cost = placement_us(hw, big)
    assert cost["staged"] == pytest.approx(4 + big / 25e3 * 2 + 2 * big / 5e3)
    assert cost["device"] == pytest.approx(2 * (5 + 20) + 2 * big / 200e3)
    assert cheaper_placement(hw.replace(staging_h2d_gbps=1e4, staging_d2h_gbps=1e4, cpu_crypto_gbps=1e4),
                             big) == "staged"


def test_device_frames_over_gloo_pay_the_copies_to_host_and_back():
    """Two ranks on one GPU (the gloo wire): a device-sealed frame's ciphertext is copied to
    host memory and back, which can hand the choice to the staged placement."""
    from ccddp.sim.placement import cheaper_placement, placement_us

    # The device engine slower than two host cores' AES-GCM, faster than that plus the copies.
    hw = load_profile("h100-cc").replace(enc_gbps=30.0, dec_gbps=30.0, crypto_op_us=20.0, kernel_launch_us=5.0,
                                         cc_launch_toll=1.0, cpu_crypto_gbps=40.0, staging_d2h_gbps=25.0,
                                         staging_h2d_gbps=25.0, staging_copy_us=2.0)
    big = 64 << 20
    nccl, gloo = placement_us(hw, big), placement_us(hw, big, "gloo")
    assert gloo["device"] == pytest.approx(nccl["device"] + 4 + 2 * big / 25e3)
    assert gloo["staged"] == nccl["staged"]
    assert cheaper_placement(hw, big) == "device" and cheaper_placement(hw, big, "gloo") == "staged"
    with pytest.raises(ValueError, match="wire must be one of"):
        placement_us(hw, big, "pcie")


PROBE = """
import json, sys
from ccddp.cli import main
code = main(json.loads(sys.argv[1]))
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


def test_calibrate_on_a_gpu_without_one_is_one_line_before_torch_loads(tmp_path):
    """No CUDA device (hidden here, so the check runs on a GPU machine too): exit 2, one line,
    torch never imported, nothing written."""
    import os
    import subprocess
    import sys

    out = tmp_path / "gpu.toml"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["calibrate", "--device", "cuda", "--out", str(out)])],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert p.stdout.split() == ["NO-TORCH", "2"], p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: calibrate --device cuda: no CUDA device"), p.stderr
    assert not out.exists()


def test_device_sweep_takes_no_device(tmp_path, capsys):
    path = tmp_path / "ch.json"
    path.write_text(json.dumps(_device_channel_result(1 << 20)))
    assert main(["calibrate", "--device", "cuda", "--device-sweep", str(path), "--out", str(tmp_path / "x.toml")]) == 2
    assert "leave out --device" in capsys.readouterr().err


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="no CUDA device here")
def test_calibrate_device_cuda_measures_the_engine_and_the_staging(tmp_path, capsys):
    out, js = tmp_path / "gpu.toml", tmp_path / "gpu.json"
    assert main(["calibrate", "--device", "cuda", "--fast", "--base", "h100-cc", "--out", str(out),
                 "--json", str(js)]) == 0
    hw = load_profile(str(out))
    data = json.loads(js.read_text())
    assert data["schema"] == "ccddp.calibrate-device/1" and data["base"] == "h100-cc"
    measured = set(data["measured_fields"])
    assert set(STAGING_FIELDS) | {"enc_gbps", "dec_gbps", "crypto_op_us", "cpu_crypto_gbps"} <= measured
    for name in data["measured_fields"]:
        assert hw.field(name).source is Source.MEASURED, name
    assert hw.staging_h2d_gbps > 0 and hw.staging_d2h_gbps > 0 and hw.enc_gbps > 0
    assert all(r["checked_frames"] > 0 for r in data["measurements"]["sweep"])


def test_op_fixed_us_is_what_the_model_leaves_of_a_paired_small_all_reduce():
    """Issue 42: the sealed call's fixed cost is the measured small sealed-minus-gloo
    all-reduce less what the model's seals, tags and messages explain; fed back, the model
    reproduces the measured difference. Measurements saved before it load with 0."""
    from ccddp.bench.calibrate_fit import fit_op_fixed
    from ccddp.sim.collective import plain_allreduce, secure_allreduce
    from ccddp.sim.hierarchy import allreduce_cost
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    local, p2p = fake_measurements()
    old = derive_profile(local, p2p)["profile"]["op_fixed_us"]
    assert old.value == 0.0 and old.source is Source.ASSUMED
    small = {"bytes": 4096, "segment_bytes": 4 * MIB, "chains": 1, "pairs": 100,
             "secure_s": 1200e-6, "gloo_s": 320e-6}
    p2p["small"] = small
    hw = validate_profile(derive_profile(local, p2p)["profile"])
    rec = hw.field("op_fixed_us")
    assert rec.source is Source.MEASURED and "1200 us" in rec.note and "320 us" in rec.note
    assert 0 < hw.op_fixed_us < 880.0
    assert fit_op_fixed(hw, small, 2) == pytest.approx(hw.op_fixed_us, abs=0.01)
    sched = Schedule("pipelined", segment_bytes=small["segment_bytes"], chains=1)
    sealed = allreduce_cost(hw, sched, Rates.resolve(hw, sched, 2, True), 2, 4096, cc=True).ms
    plain = plain_allreduce(Rates.resolve(hw, sched, 2, False), 2, 4096, False).ms
    assert sealed - plain == pytest.approx(0.880, abs=1e-4)
    assert secure_allreduce(Rates.resolve(hw, sched, 2, True), sched, 2, 4096).ms < sealed
    # Where the model explains more than was measured, nothing is left: 0, not negative.
    assert fit_op_fixed(hw, {**small, "secure_s": small["gloo_s"]}, 2) == 0.0
