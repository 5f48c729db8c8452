"""The command line a first-time user meets: help and mistakes answer without importing
torch (checked in the import graph of a fresh interpreter, not with a clock), every
command is described in the user's words with its defaults, world sizes that mean
nothing are refused, and tables fit the terminal without cutting a name."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ccddp.cli import build_parser, commands, main

ROOT = Path(__file__).resolve().parents[1]

# Runs ccddp's CLI in a fresh interpreter and prints whether torch was imported.
PROBE = """
import json, sys
from ccddp.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as e:
    code = e.code
print("\\nTORCH" if "torch" in sys.modules else "\\nNO-TORCH", code,
      " ".join(m for m in ("ccddp.sim", "ccddp.crypto", "ccddp.bench", "ccddp.report") if m in sys.modules))
"""


def _probe(argv: list[str], cwd: Path | None = None) -> tuple[str, str]:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=cwd)
    return p.stdout.strip().splitlines()[-1], p.stdout + p.stderr


@pytest.mark.parametrize("argv", [
    ["--help"], [], ["no-such-command"], ["train", "--help"], ["train", "--workload"],
    ["train", "--no-such-option"], ["characterize", "--help"], ["characterize"],
    ["bench", "collectives", "--help"], ["bench", "collectives", "--iters"], ["report", "--help"],
    ["keygen", "--help"], ["simulate", "--help"], ["tune", "--help"], ["selftest", "--help"],
    ["selftest", "--no-such-option"], ["attest", "--help"], ["attest", "verify", "--help"],
])
def test_help_and_argument_errors_do_not_import_torch(argv):
    last, out = _probe(argv)
    assert last.startswith("NO-TORCH"), out[-3000:]


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"]])
def test_the_command_list_loads_no_command_machinery(argv):
    # Only the chosen command's options are built: the list of commands needs none of the
    # model, crypto, benchmark or report packages.
    last, out = _probe(argv)
    assert last.split()[2:] == [], out[-3000:]


def test_report_does_not_import_torch(tmp_path):
    from test_report import make_results

    (tmp_path / "results.json").write_text(json.dumps(make_results(workloads=("resnet50",), world_sizes=(2,))))
    last, out = _probe(["report", str(tmp_path)])
    assert last.split()[:2] == ["NO-TORCH", "0"], out[-3000:]
    assert (tmp_path / "report.md").is_file()


def _help(parser) -> str:
    return parser.format_help()


def _all_parsers():
    """(name, parser) of every command and sub-command, each fully registered."""
    for name in commands():
        top = build_parser([name])
        sub = next(a for a in top._actions if a.dest == "command").choices[name]
        yield name, sub
        for action in sub._actions:
            if isinstance(action.choices, dict) and action.dest != "command":
                for inner, p in action.choices.items():
                    yield f"{name} {inner}", p


def test_every_command_is_described_in_the_users_words_with_defaults():
    top = _help(build_parser(["--help"]))
    seen = 0
    for name, parser in _all_parsers():
        assert name.split()[0] in top
        assert parser.description, f"{name} has no description"
        text = _help(parser)
        for word in (r"\bseed \d", r"\bissue\b", r"#\d", r"\bccddp\.[a-z]"):
            assert not re.search(word, text, re.I), f"{name} --help says {re.search(word, text, re.I)[0]!r}"
        formatter = parser._get_formatter()
        for action in parser._actions:
            assert not action.option_strings or action.help, f"{name} {action.option_strings} has no help"
            if action.option_strings and action.help != argparse.SUPPRESS and \
                    action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in formatter._get_help_string(action), f"{name} {action.option_strings}"
        seen += 1
    assert seen >= len(commands())


def test_world_sizes_below_two_are_refused(capsys):
    for argv in (["characterize", "--out", "x", "--world-sizes", "1,2"],
                 ["train", "--workload", "graphsage", "--cc", "off", "--world-size", "1"],
                 ["bench", "collectives", "--world-size", "1"],
                 ["simulate", "--workload", "gpt2-xl", "--gpus", "1,4"],
                 ["tune", "--workload", "gpt2-xl", "--gpus", "1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "2" in err, err


def test_option_defaults_match_the_library():
    from ccddp.bench.options import DEFAULT_SEGMENT_MB
    from ccddp.comm import CommSettings

    assert DEFAULT_SEGMENT_MB * (1 << 20) == CommSettings().segment_bytes
    assert CommSettings().chains == 0


# -- tables -------------------------------------------------------------------------------

ROWS = [{"impl": impl, "op": "all_reduce", "bytes": 67108864, "count": 16777216, "type": "float32",
         "redop": "sum", "time_us": t, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wrong": 0, "cpu_us_per_rank": 9.0,
         "seals_per_rank": 2, "opens_per_rank": 2, "tag_granularity": "segment 4MiB",
         "paired_ratios": {"gloo": t / 100000.0}, "bytes_sealed_per_rank": sealed, "bytes_opened_per_rank": sealed}
        for impl, t, sealed in (("gloo", 100000.0, 0), ("ring", 110000.0, 0),
                                ("secure-naive", 190000.0, 64 << 20), ("secure", 150000.0, 64 << 20))]


def test_the_collectives_table_fits_80_columns_and_keeps_implementation_names():
    from ccddp.report.tables import add_additive_floor, print_collectives

    rows = [dict(r) for r in ROWS]
    aes = {"bytes": 4 << 20, "seal_gbps": 2.0, "open_gbps": 1.0}
    add_additive_floor(rows, aes)
    # floor = gloo's time + sealed bytes at 2 GB/s + opened bytes at 1 GB/s
    assert rows[3]["additive_floor_us"] == pytest.approx(100000.0 + (64 << 20) / 2e3 + (64 << 20) / 1e3)
    assert rows[3]["vs_additive_floor"] == pytest.approx(150000.0 / rows[3]["additive_floor_us"])
    assert "additive_floor_us" not in rows[1]
    out = io.StringIO()
    print_collectives(rows, title="t", aes=aes, width=80, stream=out, wide=True)
    text = out.getvalue()
    table = [ln for ln in text.splitlines() if ln[:1] in "┏┃┡│└"]
    assert table and max(len(ln) for ln in table) <= 80
    for impl in ("secure-naive", "secure ", "gloo", "ring"):
        assert any(f"│ {impl}" in ln for ln in table), impl
    assert "…" not in text
    assert "¹ vs gloo: the row's time / gloo's time in the same iteration" in text and "² additive floor" in text
    assert "Left out to fit 80 columns:" in text
    assert all(len(ln) <= 80 for ln in text.splitlines())
    # Off a terminal (no width): every column, one row per line.
    out = io.StringIO()
    print_collectives(rows, title="t", aes=aes, stream=out, wide=True)
    assert "redop" in out.getvalue() and "Left out" not in out.getvalue()


# -- progress off a terminal ---------------------------------------------------------------

def test_characterize_prints_one_line_records_off_a_terminal():
    from test_report import make_results

    from ccddp.bench.characterize import Plan
    from ccddp.cli.cmd_characterize import PlainProgress

    plan = Plan(["resnet50"], [2], ["naive", "pipelined"], 10, 2)
    out = io.StringIO()
    progress = PlainProgress(plan, out)
    progress(0, 2, "resnet50", 2, None)
    progress(1, 2, "resnet50", 2, make_results(workloads=("resnet50",), world_sizes=(2,), failed=()))
    first, second = out.getvalue().splitlines()
    assert first.startswith("characterize [1/2] resnet50, 2 ranks: started (0:00 elapsed)")
    assert re.match(r"characterize \[1/2\] resnet50, 2 ranks: done in \d+ s; naive/off 1\.\d\d× \(1\.\d\d–1\.\d\d\), "
                    r"pipelined/off no measurable difference \(0\.\d\d–1\.\d\d\); 8 rounds$", second), second



@pytest.mark.parametrize("argv, says", [
    (["train", "--workload", "graphsage", "--size", "small"], "argument --size: invalid choice: 'small'"),
    (["trian"], "argument COMMAND: invalid choice: 'trian'"),
    (["tune", "--workload", "gpt2-xl", "--gpus", "2,4"], "argument --gpus: invalid int value: '2,4'"),
    (["bench", "collectives", "--no-such-flag"], "unrecognized arguments: --no-such-flag (see ccddp bench --help)"),
    ([], "the following arguments are required: COMMAND"),
])
def test_a_usage_error_is_one_line_naming_the_help_to_read(argv, says, capsys):
    """README: "A mistyped option or name is answered in one line, ``ccddp: error: ...``"
    -- argparse's own choice and type errors included (it prints its usage block first)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ccddp: error: {says}") and "--help)" in err, err


def test_launch_help_says_ccddps_own_options_and_what_it_refuses_before_torchruns(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["launch", "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    ours = out[:out.index("usage: ccddp launch [-h]")]   # torchrun's own help follows
    for option in ("--trust-domains MAP", "--attestation-policy PATH", "--attestation-certs DIR"):
        assert f"\n  {option} " in ours, option
    assert "refuses --standalone" in ours and "--nproc-per-node" in out
