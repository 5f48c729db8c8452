"""What a new user reads first from the measuring commands: ``bench collectives`` fits 120
columns by default (nccl-tests' columns and the paired ratio with its interval; the rest
with --wide and in the JSON), ``bench channel`` gives its channel/raw ratio an interval,
and ``tune`` says when the settings tie instead of crowning one of them."""

from __future__ import annotations

import io
import json
import re

from ccddp.cli import main


def _rows() -> list[dict]:
    rows = []
    for op in ("all_reduce", "all_gather"):
        for impl, t, sealed in (("gloo", 1_234_567.8, 0), ("ring", 1_300_000.0, 0),
                                ("secure-naive", 2_500_000.0, 1 << 30), ("secure", 1_900_000.0, 1 << 30)):
            rows.append({"impl": impl, "op": op, "bytes": 1 << 30, "count": 268435456, "type": "bfloat16",
                         "redop": "sum", "time_us": t, "algbw_gbps": 0.869, "busbw_gbps": 1.303, "wrong": 0,
                         "cpu_us_per_rank": 1_500_000.0, "seals_per_rank": 12, "opens_per_rank": 12,
                         "tag_granularity": "segment 4MiB",
                         "paired_ratios": {"gloo": t / 1_234_567.8},
                         "paired_ratio_intervals": {"gloo": [t / 1_234_567.8, t / 1_300_000.0, t / 1_100_000.0, 10]},
                         "bytes_sealed_per_rank": sealed, "bytes_opened_per_rank": sealed})
    return rows


def test_bench_collectives_fits_120_columns_and_keeps_the_rest_for_wide():
    from ccddp.report.tables import add_additive_floor, print_collectives

    rows = _rows()
    add_additive_floor(rows, {"bytes": 4 << 20, "seal_gbps": 2.0, "open_gbps": 1.0})
    out = io.StringIO()
    print_collectives(rows, title="ccddp bench collectives, world size 4", aes={"bytes": 4 << 20,
                      "seal_gbps": 2.0, "open_gbps": 1.0}, stream=out)   # a pipe: no terminal width
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120, max(text.splitlines(), key=len)
    for header in ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "vs gloo"):
        assert header in text, header
    assert "1.54× (1.46–1.73)" in text and "secure-naive" in text     # the ratio with its interval
    assert "additive floor" not in text.split("--wide")[0] and "--wide" in text
    wide = io.StringIO()
    print_collectives(rows, title="t", aes={"bytes": 4 << 20, "seal_gbps": 2.0, "open_gbps": 1.0}, stream=wide,
                      wide=True)
    assert "additive floor" in wide.getvalue() and "seals/rank" in wide.getvalue()


def test_bench_channel_gives_its_ratio_an_interval(capsys):
    assert main(["bench", "channel", "--size", "64K", "--reps", "12"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("channel / raw rate, paired per repetition (95 % interval): seal ")
    # e.g. "seal no measurable difference (0.91–1.04); open 0.92× (0.90–0.95)"
    assert len(re.findall(r"\(\d+\.\d\d–\d+\.\d\d\)", line)) == 2, line


def test_channel_ratio_text_says_when_the_interval_holds_one():
    from ccddp.cli.cmd_bench import channel_ratio_text

    assert channel_ratio_text([1.2, 0.95, 1.4, 20]) == "no measurable difference (0.95–1.40)"
    assert channel_ratio_text([0.9, 0.85, 0.95, 20]) == "0.90× (0.85–0.95)"


def test_tune_says_the_settings_tie_and_keeps_the_default(tmp_path, capsys):
    # On production Hopper CC, graphsage's settings all predict the same time within 0.5 %.
    out = tmp_path / "tune.json"
    assert main(["tune", "--workload", "graphsage", "--gpus", "2", "--profile", "h100-cc", "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "best: the default. The settings tie:" in text and "keep the default" in text
    assert "faster)" not in text and "the gain rests on" not in text
    result = json.loads(out.read_text())
    assert result["tie"] is True and result["chosen"] == "default"
    # A real gain is still reported as one.
    assert main(["tune", "--workload", "graphsage", "--gpus", "2", "--profile", "paper-h100"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "x faster)" in text and "The settings tie" not in text
