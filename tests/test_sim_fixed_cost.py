"""The sealed collective call's fixed software cost (``op_fixed_us``, issue 42): the model
adds it once per sealed all-reduce, so a workload of many small buckets grows by
calls x op_fixed_us; a profile written before the field existed loads with 0."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from ccddp.sim import load_profile
from ccddp.sim.predict import predict
from ccddp.sim.profile import FieldValue, Source
from ccddp.sim.schedule import Schedule
from ccddp.sim.workload import WorkloadProfile


def _small_buckets(k: int) -> WorkloadProfile:
    """``k`` buckets of 4 KiB after a short backward: communication-bound, small ops."""
    return WorkloadProfile(name="small-ops", bucket_bytes=(4096,) * k,
                    forward_ms=1.0, backward_ms=1.0, optimizer_ms=0.1)


@pytest.mark.parametrize("name,n", [("h100-cc", 2), ("h100-cc", 8), ("local", 2)])
def test_many_small_collectives_grow_by_calls_times_op_fixed_us(name, n):
    hw = load_profile(name)
    wl = _small_buckets(200)
    sched = Schedule("pipelined")
    zero = predict(hw.replace(op_fixed_us=0.0), wl, sched, n)
    us = 250.0
    with_it = predict(hw.replace(op_fixed_us=us), wl, sched, n)
    calls = with_it["ops"]["allreduces"]
    assert calls == 200
    # The exposed communication after backward is the whole stream here: every call
    # adds its fixed cost to it (the local host's two shared cores add it to core time
    # the same way: two ranks on two cores, no stretch).
    assert with_it["cc_on_ms"] - zero["cc_on_ms"] == pytest.approx(calls * us * 1e-3,
                                                                   rel=1e-6)
    # Software, not crypto: the breakdown books it as communication; CC off is unchanged.
    assert with_it["breakdown"]["crypto"] == pytest.approx(zero["breakdown"]["crypto"])
    assert with_it["cc_off_ms"] == zero["cc_off_ms"]


def test_native_schedule_pays_no_sealed_call_cost():
    hw = load_profile("h100-cc")
    wl = _small_buckets(50)
    a = predict(hw.replace(op_fixed_us=0.0), wl, Schedule("native"), 8)
    b = predict(hw.replace(op_fixed_us=500.0), wl, Schedule("native"), 8)
    assert a["cc_on_ms"] == b["cc_on_ms"]


def test_a_profile_without_the_field_reads_as_zero(tmp_path):
    text = (resources.files("ccddp.sim") / "profiles" / "h100-cc.toml").read_text()
    old = re.sub(r"(?m)^op_fixed_us = .*$", "", text)
    assert "op_fixed_us" not in old
    p = tmp_path / "old.toml"
    p.write_text(old)
    hw = load_profile(p)
    assert hw.op_fixed_us == 0.0
    assert hw.field("op_fixed_us").source is Source.ASSUMED and "op_fixed_us" in hw.assumed()
    wl = _small_buckets(20)
    assert predict(hw, wl, Schedule("pipelined"), 2)["cc_on_ms"] == pytest.approx(
        predict(load_profile("h100-cc").replace(op_fixed_us=0.0), wl, Schedule("pipelined"),
                2)["cc_on_ms"])


def test_builtin_profiles_say_where_op_fixed_us_comes_from():
    for name, src in [("local", Source.DERIVED), ("h100-cc", Source.DERIVED),
                      ("h200-cc", Source.ASSUMED), ("b300-cc", Source.ASSUMED),
                      ("paper-h100", Source.DERIVED)]:
        rec: FieldValue = load_profile(name).field("op_fixed_us")
        assert rec.source is src and rec.note, name
    # The paper's fit keeps its per-call costs in crypto_op_us.
    assert load_profile("paper-h100").op_fixed_us == 0.0
