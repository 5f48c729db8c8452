"""Hardware profiles: built-ins load, every field is documented and required, bad values
are rejected with a message naming the field, and write_profile round-trips."""

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
from ccddp.sim.profile import describe_fields

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
    data = {f.name for f in fields(HardwareProfile)} - {"workloads", "source"}
    assert schema == data
    assert all(f.doc and f.section for f in FIELDS)
    assert len(describe_fields().splitlines()) >= len(FIELDS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_files_state_every_field_explicitly(name):
    data = tomllib.loads(profile_text(name))
    flat = {k for sec, v in data.items() if sec != "workloads" for k in v}
    assert flat == {f.name for f in FIELDS}


def test_builtins_cite_sources():
    assert "seed 003" in profile_text("h100-cc") and "MEASURED" in profile_text("h100-cc")
    assert "FITTED" in profile_text("paper-h100")
    b300 = load_profile("b300-cc")
    assert b300.link_encrypted and b300.nvls and b300.cc_bandwidth_kept == 0.89
    h100 = load_profile("h100-cc")
    assert not h100.link_encrypted and h100.cc_bandwidth_kept == 0.94
    assert 9 <= h100.cc_exchange_toll_us <= 13 and 10 <= b300.cc_exchange_toll_us <= 15


def _without(text: str, field: str) -> str:
    return re.sub(rf"(?m)^{re.escape(field)} = .*$", "", text)


@pytest.mark.parametrize("field", [f.name for f in FIELDS])
def test_missing_field_is_named(tmp_path, field):
    p = tmp_path / "p.toml"
    p.write_text(_without(profile_text("h100-cc"), field))
    with pytest.raises(ConfigError, match=rf"'{field}' is missing"):
        load_profile(p)


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
    ("crypto_unit", '"segment"', "must be one of chunk, bucket"),
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
    out = write_profile(hw.as_dict(), tmp_path / f"{name}.toml")
    again = load_profile(out)
    assert again == hw and again.workloads == hw.workloads
    assert "# " in out.read_text()        # documented, field by field


def test_write_profile_keeps_infinite_mac_rate_and_validates(tmp_path):
    d = load_profile("local").as_dict()
    assert math.isinf(d["mac_gbps"])
    d.update(enc_gbps=2.31)
    assert load_profile(write_profile(d, tmp_path / "l.toml")).enc_gbps == 2.31
    d.pop("link_gbps")
    with pytest.raises(ConfigError, match="'link_gbps' is missing"):
        write_profile(d, tmp_path / "bad.toml")
    assert not (tmp_path / "bad.toml").exists()


def test_replace_validates():
    with pytest.raises(ConfigError, match="'enc_gbps' must not be negative"):
        load_profile("h100-cc").replace(enc_gbps=-2)


def test_sim_imports_neither_torch_distributed_nor_comm():
    code = ("import sys, ccddp.sim, ccddp.sim.tune, ccddp.sim.hierarchy\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
            " or m.startswith('ccddp.comm')]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
