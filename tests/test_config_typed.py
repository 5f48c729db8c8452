"""Configuration is typed (issue 37, finding 5): ``CCDDP_SETTINGS``, ``CCDDP_PROFILE``,
``--trust-domains``, a profile file and a secret file -- set by whoever starts the process
-- end in one :class:`ConfigError` naming the field for deep nesting, huge integers,
bytes that are not UTF-8, oversize input and values of the wrong shape; never in
``RecursionError``, ``OverflowError``, ``UnicodeDecodeError`` or a silently different
value."""

from __future__ import annotations

import os
import tomllib
from importlib import resources

import pytest

from ccddp.errors import ConfigError

DEEP = "[" * 5000 + "]" * 5000     # past the recursion limits of json and tomllib, under size caps
HUGE = "1" + "0" * 400            # parses as an int; float() of it overflows
LONG = "1" + "0" * 5000           # more digits than int() converts


# --- CCDDP_SETTINGS ---------------------------------------------------------------

@pytest.mark.parametrize("text, field", [pytest.param(*case, id=case[1] + f"-{i}") for i, case in enumerate([
    ('{"trust_domains": ' + DEEP + "}", "nested deeper"),
    ('{"segment_bytes": ' + HUGE + "}", "segment_bytes"),
    ('{"rotate_after": ' + LONG + "}", "CCDDP_SETTINGS"),
    ('{"timeout_s": 1e400}', "CCDDP_SETTINGS"),
    ('{"timeout_s": ' + HUGE + "}", "timeout_s"),
    ('{"trust_domains": ["01"]}', "trust_domains"),
    ('{"trust_domains": [[0.0, 1.0]]}', "trust_domains"),
    ('{"trust_domains": [[true, 1]]}', "trust_domains"),
    ('{"trust_domains": {"0": [0, 1]}}', "trust_domains"),
    ('{"segment_bytes": "4096"}', "segment_bytes"),
    ('{"chains": 2.5}', "chains"),
    ('{"check_descriptors": 1}', "check_descriptors"),
    ('{"impl": ["secure"]}', "impl"),
    ('{"no_such_setting": 1}', "no_such_setting"),
    ('{"chains": 1, "chains": 2}', "twice"),
    ('["impl", "secure"]', "JSON object"),
    ('{"impl": "secure"' + " " * 70_000 + "}", "bytes"),
])])
def test_bad_settings_are_one_config_error_naming_the_field(text, field):
    from ccddp.comm.settings import settings_from_json

    with pytest.raises(ConfigError, match=field) as e:
        settings_from_json(text)
    assert str(e.value).startswith("CCDDP_SETTINGS")
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_settings_that_are_not_utf8_are_refused(monkeypatch):
    """An environment string holds the bytes that are not UTF-8 as surrogates."""
    from ccddp.comm.settings import settings_from_json

    os.environb[b"CCDDP_SETTINGS"] = b'{"impl": "secure\xff"}'
    try:
        with pytest.raises(ConfigError, match="CCDDP_SETTINGS is not UTF-8"):
            settings_from_json(os.environ["CCDDP_SETTINGS"])
    finally:
        del os.environb[b"CCDDP_SETTINGS"]


def test_good_settings_still_read():
    from ccddp.comm.settings import settings_from_json

    s = settings_from_json('{"trust_domains": [[0, 1], [2, 3]], "segment_bytes": 65536, "timeout_s": 5}',
                           timeout_s=30)
    assert s.trust_domains == ((0, 1), (2, 3)) and s.segment_bytes == 65536 and s.timeout_s == 5
    assert settings_from_json("", timeout_s=30).timeout_s == 30
    assert settings_from_json('{"trust_domains": "node"}').trust_domains == "node"


@pytest.mark.parametrize("fields, field", [pytest.param(*case, id=case[1] + f"-{i}") for i, case in enumerate([
    ({"segment_bytes": 10 ** 400}, "segment_bytes"),
    ({"timeout_s": 10 ** 400}, "timeout_s"),
    ({"timeout_s": float("inf")}, "timeout_s"),
    ({"rotate_after": 1 << 64}, "rotate_after"),
    ({"pad_budget_bytes": 1 << 60}, "pad_budget_bytes"),
    ({"chains": True}, "chains"),
    ({"trust_domains": ["01"]}, "trust_domains"),
    ({"trust_domains": "01"}, "trust_domains"),
    ({"trust_domains": [[0, 1 << 40]]}, "trust_domains"),
])])
def test_comm_settings_are_typed_and_bounded_however_they_arrive(fields, field):
    """``CommSettings(...)`` itself (pg_options, the CLI): the same checks."""
    from ccddp.comm import CommSettings

    with pytest.raises(ConfigError, match=field):
        CommSettings(**fields)


def test_a_string_is_not_a_list_of_ranks():
    """``["01"]`` used to be read as ``[[0, 1]]`` (a string iterated as characters)."""
    from ccddp.comm.domains import check_setting

    for bad in (["01"], "01", [[0, "1"]], [[0.0, 1.0]], [[False, 1]], [], [[]], [[-1]], 7, {"a": [0]}):
        with pytest.raises(ConfigError, match="trust_domains"):
            check_setting(bad)
    assert check_setting([[0, 1], [2, 3]]) == ((0, 1), (2, 3)) == check_setting(((0, 1), (2, 3)))
    assert check_setting("node") == "node"


def test_the_backend_reads_ccddp_settings_bounded(monkeypatch):
    from ccddp.backend.registration import settings_from_env

    monkeypatch.setenv("CCDDP_SETTINGS", '{"trust_domains": ' + DEEP + "}")
    with pytest.raises(ConfigError, match="CCDDP_SETTINGS"):
        settings_from_env()


# --- --trust-domains ----------------------------------------------------------------

@pytest.mark.parametrize("text", [DEEP, "[[0, 1], " + DEEP + "]", "[[" + LONG + "]]", "[[" + HUGE + "]]",
                                  '["01"]', "[[0, 1.0]]", "[[0" + " " * 70_000 + "]]"],
                         ids=["deep", "deep-inside", "long-int", "huge-int", "string", "float", "oversize"])
def test_trust_domains_option_is_bounded(text):
    from ccddp.bench.options import trust_domains_setting

    with pytest.raises(ConfigError, match="--trust-domains"):
        trust_domains_setting(text)
    assert trust_domains_setting("[[0,1],[2,3]]") == [[0, 1], [2, 3]]


# --- CCDDP_PROFILE and profile files --------------------------------------------------

MEASURED = ("enc_gbps", "dec_gbps", "staging_d2h_gbps", "staging_h2d_gbps", "cpu_crypto_gbps")


def _calibrated(value: str = "10.0") -> str:
    rows = [f'{name} = {{ value = {value if name == "enc_gbps" else "10.0"}, source = "measured" }}'
            for name in MEASURED]
    return "[device]\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("content, field", [pytest.param(*case, id=case[1] + f"-{i}") for i, case in enumerate([
    (("x = " + DEEP).encode(), "nested deeper"),
    (("x = " + "{a = " * 3000 + "1" + "}" * 3000).encode(), "nested deeper"),
    (("a" + ".a" * 50_000 + " = 1").encode(), "nested deeper"),
    (_calibrated(HUGE).encode(), "enc_gbps"),
    (_calibrated(LONG).encode(), "not valid TOML"),
    (b'[device]\nnote = "caf\xe9"\n', "not UTF-8"),
    (b"# padding\n" * 200_000, "larger than"),
])])
def test_a_bad_calibrated_profile_is_one_config_error(tmp_path, monkeypatch, content, field):
    from ccddp.backend.placement import rates_from_profile

    path = tmp_path / "profile.toml"
    path.write_bytes(content)
    monkeypatch.setenv("CCDDP_PROFILE", str(path))
    with pytest.raises(ConfigError, match=field) as e:
        rates_from_profile()
    assert "CCDDP_PROFILE" in str(e.value)


def test_a_good_calibrated_profile_still_decides():
    from ccddp.backend.placement import rates_from_profile

    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(_calibrated())
    try:
        rates = rates_from_profile(f.name)
    finally:
        os.unlink(f.name)
    assert rates is not None and rates.device_s_per_byte > 0


def _local_profile() -> str:
    return (resources.files("ccddp.sim") / "profiles" / "local.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("edit, field", [pytest.param(*case, id=case[1] + f"-{i}") for i, case in enumerate([
    (lambda t: t.replace("max_chains = { value = 2,", f"max_chains = {{ value = {HUGE},", 1), "max_chains"),
    (lambda t: t.replace("max_chains = { value = 2,", f"max_chains = {{ value = {LONG},", 1), "not valid TOML"),
    (lambda t: t + "\nx = " + DEEP + "\n", "nested deeper"),
    (lambda t: t + "\n# caf\udce9\n", "not UTF-8"),
])])
def test_a_bad_profile_file_is_one_config_error(tmp_path, edit, field):
    from ccddp.sim import load_profile

    text = edit(_local_profile())
    assert text != _local_profile()
    path = tmp_path / "mine.toml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=field):
        load_profile(str(path))


def test_a_profile_given_as_data_is_bounded_too():
    from ccddp.sim.profile import validate_profile

    data = tomllib.loads(_local_profile())
    data["max_chains"] = 10 ** 400
    with pytest.raises(ConfigError, match="max_chains"):
        validate_profile(data)


def test_the_shipped_profiles_parse_as_tomllib_parses_them():
    from ccddp.config import parse_toml
    from ccddp.sim import builtin_names

    for name in builtin_names():
        raw = (resources.files("ccddp.sim") / "profiles" / f"{name}.toml").read_bytes()
        assert parse_toml(raw, what=name) == tomllib.loads(raw.decode("utf-8"))


def test_brackets_in_strings_and_comments_are_not_nesting():
    from ccddp.config import toml_nesting

    text = ('a = "[[[[[[[[[[[[[[[[[[[[[[" # [[[[[[[[[[[[[[[[[[[[[[[[\n'
            "b = '[[[[[[[[[[[[[[[[[[[[[[[[[[['\n"
            'c = """\n[[[[[[[[[[[[[[[[[[[[[[\\""" """\n'
            "d = '''[[[[[[[[[[[[[[[[[[[[[[[[[['''\n"
            "e = [[[1]]]\n")
    assert toml_nesting(text, 16) == 3
    assert toml_nesting('"a"."b"' + '."c"' * 20 + " = 1", 16) == 17, "quoted parts of a dotted key count"


# --- the group secret file --------------------------------------------------------------

@pytest.mark.parametrize("content, reason", [(b"\xff" * 64, "not a hex digit"), (b"a" * 5000, "larger than")],
                         ids=["not-ascii", "oversize"])
def test_a_bad_secret_file_is_one_config_error(tmp_path, content, reason):
    from ccddp.crypto.keys import GroupSecret

    path = tmp_path / "secret"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=reason):
        GroupSecret.from_file(path)


def test_python_311_is_required_for_tomllib():
    """tomllib (Python 3.11) is imported on the product path (the backend's placement)."""
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"


# --- JSON files ccddp reads: workload profiles, results ---------------------------------

def _workload_profile(path):
    from ccddp.sim.workload import load_workload_profile

    return load_workload_profile(path)


def _measured_runs(path):
    from ccddp.runs import load_runs

    return load_runs([str(path)])


def _report_results(path):
    from ccddp.report.results import load_results

    return load_results(path)


def _collective_results(path):
    from ccddp.report.collective_runs import load_results

    return load_results([path])


LOADERS = {"workload profile": _workload_profile, "measured runs": _measured_runs,
           "characterize results": _report_results, "collective results": _collective_results}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("content, reason", [
    (("[" * 5000 + "]" * 5000).encode(), "nested deeper"),
    ('{"schema": "x", "n": ' .encode() + HUGE.encode() + b"}", "integer of 401 digits"),
    (b'{"schema": "caf\xe9"}', "not UTF-8"),
], ids=["deep", "huge-int", "not-utf8"])
def test_a_bad_json_file_is_one_config_error(tmp_path, loader, content, reason):
    path = tmp_path / "results.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=reason):
        LOADERS[loader](path)


def test_an_oversize_identity_file_is_refused_before_it_is_read_whole(tmp_path):
    from ccddp.crypto.establish import Identity

    path = tmp_path / "rank0.pem"
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\n" + b"A" * (1 << 20))
    with pytest.raises(ConfigError, match="identity key file .* larger than"):
        Identity.from_file(path)
