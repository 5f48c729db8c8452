"""Fit paper-h100's constants to the paper's numbers and write them into the profile.

Solves every fitted constant of ``ccddp/sim/profiles/paper-h100.toml`` (per-op crypto
cost, GHASH chain rate, the share of a naive op's cost that scales with the bucket, the
CPU's AES-GCM rate) and every workload's compute time, each against the published number
:mod:`ccddp.sim.fidelity` names for it, and rewrites those values in the file (comments
and every other field untouched). Prints the fidelity summary afterwards.

Usage::

    python scripts/fit_paper_profile.py            # rewrite the profile
    python scripts/fit_paper_profile.py --check    # exit 1 if the file is not the fit
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources

from ccddp.sim.fidelity import evaluate, fit_paper, summary
from ccddp.sim.profile import _toml_record


# What the fit solves per workload; input bytes are data, not fitted.
FITTED_KEYS = ("forward_ms", "backward_ms", "data_ms")


def _sig(x: float) -> float:
    return float(f"{x:.5g}")


def rewrite(text: str, fit: dict) -> str:
    for name, rec in fit["fields"].items():
        rec = type(rec)(_sig(rec.value), rec.source, rec.note, rec.stderr)
        text, count = re.subn(rf"(?m)^{name} = \{{.*\}}$", f"{name} = {_toml_record(rec)}", text)
        if count != 1:
            raise SystemExit(f"paper-h100.toml: field {name} not found once")
    for w, values in fit["workloads"].items():
        m = re.search(rf'(?ms)^\[workloads\.{re.escape(w)}\]\n(.*?)(?=^\[|\Z)', text)
        if not m:
            raise SystemExit(f"paper-h100.toml: [workloads.{w}] not found")
        body = m.group(1)
        for k, v in values.items():
            if k not in FITTED_KEYS:
                continue
            line = f"{k} = {_sig(v)!r}"
            body, count = re.subn(rf"(?m)^{k} = .*$", line, body)
            if count == 0:
                body = body.rstrip("\n") + f"\n{line}\n"
        text = text[:m.start(1)] + body + text[m.end(1):]
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = ap.parse_args()
    path = resources.files("ccddp.sim") / "profiles" / "paper-h100.toml"
    text = path.read_text(encoding="utf-8")
    fit = fit_paper()
    new = rewrite(text, fit)
    if args.check:
        print("paper-h100.toml is the fit" if new == text else "paper-h100.toml differs from the fit")
        return 0 if new == text else 1
    with open(str(path), "w", encoding="utf-8") as f:
        f.write(new)
    print(f"wrote {path} (converged: {fit['converged']}, at a bound: {fit['at_bound'] or 'none'})")
    print(summary(evaluate()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
