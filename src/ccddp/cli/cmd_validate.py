"""``ccddp validate``: the performance model against this machine's measured runs.

For every measured CC-on run (``ccddp train --json``, or ``ccddp characterize``'s
results.json) that has a CC-off run of the same workload, shapes and world size, the
model predicts the CC-on iteration from the hardware profile (``ccddp calibrate``) and
compute times of the CC-off run only, and the table says whether the prediction is within
10 % of the measured CC-on time and the predicted CC-on/CC-off ratio within 10 % of the
measured one. Where the variants took turns in one launch (``--cc off,on``), the errors
are paired round by round, with their 95 % intervals.

Example::

    ccddp calibrate --out local.toml
    ccddp train --workload resnet50 --batch-size 2 --image-size 112 --cc off --json runs/off.json
    ccddp train --workload resnet50 --batch-size 2 --image-size 112 --cc on --json runs/on.json
    ccddp validate --profile local.toml --measured runs/ --json validation.json
"""

from __future__ import annotations

import argparse

SUMMARY = "compare the model's CC-on predictions with measured training runs"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help=SUMMARY,
        description="Predict measured CC-on training runs from a hardware profile and the "
                    "CC-off runs' compute times; report the errors against the 10 % (time) "
                    "/ 10 % (CC-on/CC-off ratio) targets.")
    p.add_argument("--profile", default="local",
                   help="hardware profile: built-in name or TOML path from `ccddp calibrate` "
                        "(default: local)")
    p.add_argument("--measured", nargs="+", required=True, metavar="PATH",
                   help="`ccddp train --json` files, characterize results.json, or "
                        "directories holding them")
    p.add_argument("--json", metavar="PATH", help="write the rows and the verdict as JSON")
    p.add_argument("--wide", action="store_true",
                   help="the table at the terminal's full width (default: at most 120 columns, headers wrapped)")
    p.add_argument("--markdown", metavar="PATH",
                   help="write the table as markdown (e.g. for BENCHMARKS.md)")
    p.set_defaults(func=run)


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _err(r: dict, key: str) -> str:
    """An error with its 95 % interval where the rounds were paired."""
    iv = (r.get("paired") or {}).get(f"{key}_interval")
    return _pct(r[key]) + (f" ({iv[0]:+.1%} to {iv[1]:+.1%})" if iv else "")


def _how(r: dict) -> str:
    return f"{r['paired']['rounds']} rounds" if r.get("paired") else "pooled"


#: Under every table: how a row's errors are computed.
METHOD_NOTE = ("errors: where CC-off and CC-on took turns in one launch, each round's prediction "
               "against the CC-on iteration measured beside the CC-off one it came from "
               "(Hodges-Lehmann estimate over the rounds, 95 % Wilcoxon signed-rank interval); "
               "otherwise the medians of all iterations (pooled)")


def table(rows: list[dict], title: str):
    from rich.table import Table

    t = Table(title=title, title_justify="left", caption=METHOD_NOTE, caption_justify="left")
    for col in ("workload", "n", "schedule", "meas. off ms", "meas. on ms", "pred. on ms",
                "error (95 %)", "meas. ratio", "pred. ratio", "ratio error (95 %)", "pairs",
                "pass"):
        t.add_column(col, justify="left" if col in ("workload", "schedule", "pass") else "right")
    for r in rows:
        t.add_row(r["workload"], str(r["world_size"]), r["schedule"],
                  f"{r['measured_cc_off_ms']:.0f}", f"{r['measured_cc_on_ms']:.0f}",
                  f"{r['predicted_cc_on_ms']:.0f}", _err(r, "cc_on_error"),
                  f"{r['measured_ratio']:.3f}", f"{r['predicted_ratio']:.3f}",
                  _err(r, "ratio_error"), _how(r),
                  "yes" if r["pass"] else ("no (time)" if not r["pass_time"] else "no (ratio)"))
    return t


def markdown(rows: list[dict]) -> str:
    """The validation table as GitHub markdown."""
    head = ("| workload | n | schedule | measured CC-off ms | measured CC-on ms | predicted "
            "CC-on ms | error (95 %) | measured ratio | predicted ratio | ratio error (95 %) | "
            "pairs | pass |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        verdict = "yes" if r["pass"] else ("no (time)" if not r["pass_time"] else "no (ratio)")
        out.append(f"| {r['workload']} | {r['world_size']} | {r['schedule']} | "
                   f"{r['measured_cc_off_ms']:.0f} | {r['measured_cc_on_ms']:.0f} | "
                   f"{r['predicted_cc_on_ms']:.0f} | {_err(r, 'cc_on_error')} | "
                   f"{r['measured_ratio']:.3f} | {r['predicted_ratio']:.3f} | "
                   f"{_err(r, 'ratio_error')} | {_how(r)} | {verdict} |")
    return "\n".join(out) + f"\n\n({METHOD_NOTE}.)\n"


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.validate import (RATIO_TOLERANCE, SCHEMA, TIME_TOLERANCE, load_runs,
                                      validate, verdict)
    from ccddp.cli.cmd_simulate import console, write_json
    from ccddp.sim import load_profile

    hw = load_profile(args.profile)
    runs = load_runs(args.measured)
    rows = validate(hw, runs)
    v = verdict(rows)
    console(args.wide).print(table(rows, f"ccddp validate: profile {hw.name} ({hw.source}); targets: "
                                f"CC-on time within {TIME_TOLERANCE:.0%}, ratio within "
                                f"{RATIO_TOLERANCE:.0%}"))
    print(f"{v['rows_passing']}/{v['rows']} rows pass; workloads passing at world sizes 2 and "
          f"4 ({v['schedule']}): {', '.join(v['workloads_passing_ws2_and_ws4']) or 'none'} -> "
          f"{'ACCEPTED' if v['accepted'] else 'NOT accepted'} (needs 3)")
    if args.json:
        from ccddp.cli.cmd_calibrate import _finite

        write_json(args.json, _finite({"schema": SCHEMA,
                                       "profile": hw.as_dict() | {"source": hw.source},
                                       "verdict": v, "rows": rows}))
        print(f"wrote {args.json}")
    if args.markdown:
        from ccddp.errors import ConfigError

        try:
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(markdown(rows))
        except OSError as e:
            raise ConfigError(f"cannot write {args.markdown}: {e.strerror}") from None
        print(f"wrote {args.markdown}")
    return 0
