"""Hardware profiles: built-ins load, every field is documented, required and carries its
source, bad values are rejected with a message naming the field, and write_profile
round-trips."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tomllib
from dataclasses import fields
from importlib import resources

import pytest

from ccddp.errors import ConfigError
from ccddp.sim import FIELDS, HardwareProfile, builtin_names, load_profile, write_profile
from ccddp.sim.profile import FieldValue, Source, describe_fields

BUILTINS = ("paper-h100", "h100-cc", "h200-cc", "b300-cc", "local")


def profile_text(name: str) -> str:
    return (resources.files("ccddp.sim") / "profiles" / f"{name}.toml").read_text()


def test_builtins_are_shipped_and_load():
    assert set(BUILTINS) <= set(builtin_names())
    for name in BUILTINS:
        hw = load_profile(name)
        assert hw.name == name


def test_schema_and_dataclass_agree():
    schema = {f.name for f in FIELDS}
    data = {f.name for f in fields(HardwareProfile)} - {"workloads", "source", "provenance"}
    assert schema == data
    assert all(f.doc and f.section for f in FIELDS)
    assert len(describe_fields().splitlines()) >= len(FIELDS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_files_state_every_field_with_its_source(name):
    data = tomllib.loads(profile_text(name))
    flat = {k: v for sec, t in data.items() if sec != "workloads" for k, v in t.items()}
    assert set(flat) == {f.name for f in FIELDS}
    for f in FIELDS:
        if f.recorded:          # every value a record naming where it came from
            assert isinstance(flat[f.name], dict) and "source" in flat[f.name], f.name
    hw = load_profile(name)
    for f in FIELDS:
        rec = hw.field(f.name)
        if f.recorded and rec.source is not Source.ASSUMED and f.name not in (
                "tag_bytes",):
            assert rec.note, f"{name}.{f.name}: a {rec.source.value} value needs a note"


def test_paper_profile_fits_exactly_four_constants_each_citing_its_number():
    hw = load_profile("paper-h100")
    fitted = {f.name: hw.field(f.name) for f in FIELDS if f.recorded
              and hw.field(f.name).source is Source.FITTED}
    assert set(fitted) == {"crypto_op_us", "mac_gbps", "op_bucket_share", "cpu_crypto_gbps"}
    for rec in fitted.values():
        assert re.search(r"\((Sec|Fig)\. [\w-]+\)", rec.note), rec.note
    assert hw.device_link == "untrusted" and hw.cc_exchange_toll_us == 0


def test_production_profiles_are_the_systems_as_measured():
    hopper, b300 = load_profile("h200-cc"), load_profile("b300-cc")
    assert hopper.device_link == "fenced" and hopper.cc_nvls and not hopper.sealed_inside_node
    assert b300.device_link == "encrypted" and b300.nvls and not b300.cc_nvls
    assert hopper.cc_bandwidth_kept == 0.94 and b300.cc_bandwidth_kept == 0.89
    assert 9 <= hopper.cc_exchange_toll_us <= 13 and 10 <= b300.cc_exchange_toll_us <= 15
    assert b300.cc_launch_toll > hopper.cc_launch_toll > 1
    for hw in (hopper, b300):
        for name in ("cc_exchange_toll_us", "cc_bandwidth_kept", "cc_launch_toll"):
            assert hw.field(name).source is Source.MEASURED
        # Nothing GPU is measured here: the device's own crypto and compute stay assumed.
        for name in ("enc_gbps", "mac_gbps", "crypto_op_us", "compute_tflops"):
            assert hw.field(name).source is Source.ASSUMED
        assert {"enc_gbps", "compute_tflops"} <= set(hw.assumed())


def test_records_bare_values_and_replace(tmp_path):
    text = profile_text("h100-cc")
    p = tmp_path / "p.toml"
    p.write_text(re.sub(r"(?m)^enc_gbps = .*$", "enc_gbps = 123.0", text))
    hw = load_profile(p)
    assert hw.enc_gbps == 123.0 and hw.field("enc_gbps").source is Source.ASSUMED
    for bad, msg in (('{ value = 1.0, source = "guessed" }', "source must be one of"),
                     ('{ value = 1.0, origin = "x" }', "keys value, source"),
                     ('{ source = "measured" }', "'value' is missing"),
                     ('{ value = 1.0, source = "measured", stderr = -1 }', "stderr")):
        p.write_text(re.sub(r"(?m)^enc_gbps = .*$", f"enc_gbps = {bad}", text))
        with pytest.raises(ConfigError, match=msg):
            load_profile(p)
    h = load_profile("h100-cc")
    assert h.field("cc_exchange_toll_us").source is Source.MEASURED
    changed = h.replace(cc_exchange_toll_us=20.0)
    assert changed.field("cc_exchange_toll_us") == FieldValue(20.0, Source.ASSUMED,
                                                              "set by the caller")
    kept = h.replace(enc_gbps=FieldValue(300.0, Source.MEASURED, "a GPU sweep", stderr=4.0))
    assert kept.field("enc_gbps").stderr == 4.0 and "enc_gbps" not in kept.assumed()


def _without(text: str, field: str) -> str:
    return re.sub(rf"(?m)^{re.escape(field)} = .*$", "", text)


@pytest.mark.parametrize("field", [f.name for f in FIELDS if not f.fallback and f.default is None])
def test_missing_field_is_named(tmp_path, field):
    p = tmp_path / "p.toml"
    p.write_text(_without(profile_text("h100-cc"), field))
    with pytest.raises(ConfigError, match=rf"'{field}' is missing"):
        load_profile(p)


@pytest.mark.parametrize("field", [f.name for f in FIELDS if f.fallback])
def test_a_field_added_later_may_be_missing_and_takes_its_fallback(tmp_path, field):
    """Profiles saved before such a field existed still load: the field it falls back on
    gives the value, marked assumed."""
    p = tmp_path / "p.toml"
    p.write_text(_without(profile_text("h100-cc"), field))
    hw = load_profile(p)
    fallback = next(f.fallback for f in FIELDS if f.name == field)
    assert getattr(hw, field) == getattr(hw, fallback) and field in hw.assumed()


NUMERIC = [f.name for f in FIELDS if f.kind in ("float", "int")]


@pytest.mark.parametrize("field", NUMERIC)
def test_negative_field_is_named(tmp_path, field):
    p = tmp_path / "p.toml"
    p.write_text(re.sub(rf"(?m)^{field} = .*$", f"{field} = -1", profile_text("h100-cc")))
    with pytest.raises(ConfigError, match=rf"'{field}' must not be negative"):
        load_profile(p)


@pytest.mark.parametrize("field,value,message", [
    ("link_gbps", "0", "must be > 0"),
    ("cc_bandwidth_kept", "1.5", r"must be in \(0, 1\]"),
    ("overlap_efficiency", "2", r"must be in \[0, 1\]"),
    ("mac_chains", "2.5", "must be an integer"),
    ("nvls", "1", "must be true or false"),
    ("device_link", '"plaintext"', "must be one of untrusted, fenced, encrypted"),
    ("op_bucket_share", "1.5", r"must be in \[0, 1\]"),
    ("enc_gbps", '"fast"', "must be a number"),
    ("link_gbps", "inf", "must be finite"),
])
def test_bad_values_are_named(tmp_path, field, value, message):
    p = tmp_path / "p.toml"
    p.write_text(re.sub(rf"(?m)^{field} = .*$", f"{field} = {value}", profile_text("h100-cc")))
    with pytest.raises(ConfigError, match=rf"'{field}' {message}"):
        load_profile(p)


def test_unknown_field_and_bad_workload_override(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(profile_text("h100-cc").replace("[link]", "[link]\nlink_gbs = 3"))
    with pytest.raises(ConfigError, match="unknown profile field 'link_gbs'"):
        load_profile(p)
    p.write_text(profile_text("h100-cc") + "\n[workloads.x]\nforward_ms = -3\n")
    with pytest.raises(ConfigError, match="'workloads.x.forward_ms'"):
        load_profile(p)


def test_unknown_name_and_missing_file():
    with pytest.raises(ConfigError, match="unknown profile 'h900'.*paper-h100"):
        load_profile("h900")
    with pytest.raises(ConfigError, match="not found"):
        load_profile("/nonexistent/p.toml")


def test_invalid_toml_is_a_config_error(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("link_gbps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profile(p)


@pytest.mark.parametrize("name", BUILTINS)
def test_write_profile_round_trips(tmp_path, name):
    hw = load_profile(name)
    out = write_profile(hw.as_records(), tmp_path / f"{name}.toml")
    again = load_profile(out)
    assert again == hw and again.workloads == hw.workloads
    assert all(again.field(f.name) == hw.field(f.name) for f in FIELDS)
    assert "# " in out.read_text()        # documented, field by field


def test_write_profile_keeps_infinite_mac_rate_and_validates(tmp_path):
    d = load_profile("local").as_records()
    assert math.isinf(d["mac_gbps"].value)
    d.update(enc_gbps=2.31)
    assert load_profile(write_profile(d, tmp_path / "l.toml")).enc_gbps == 2.31
    d.pop("link_gbps")
    with pytest.raises(ConfigError, match="'link_gbps' is missing"):
        write_profile(d, tmp_path / "bad.toml")
    assert not (tmp_path / "bad.toml").exists()


def test_replace_validates():
    with pytest.raises(ConfigError, match="'enc_gbps' must not be negative"):
        load_profile("h100-cc").replace(enc_gbps=-2)


def test_sim_and_its_commands_never_import_torch_or_comm(tmp_path):
    """Neither the model nor `ccddp simulate` / `ccddp tune` running on the paper's
    workloads imports torch or ccddp.comm (the workloads come from the shipped table).
    Only these two commands are registered: other commands are not this test's subject."""
    code = ("import argparse, sys, ccddp.sim, ccddp.sim.tune, ccddp.sim.fidelity\n"
            "from ccddp.cli import cmd_simulate, cmd_tune\n"
            "p = argparse.ArgumentParser(); sub = p.add_subparsers()\n"
            "cmd_simulate.register(sub); cmd_tune.register(sub)\n"
            "for argv in (['simulate', '--workload', 'all', '--gpus', '8', '--profile', "
            "'b300-cc'], ['tune', '--workload', 'graphsage', '--gpus', '4']):\n"
            "    a = p.parse_args(argv); assert a.func(a) == 0\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
            " or m.startswith('ccddp.comm')]\n"
            "print('BAD', ','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "BAD"
