"""The README's measured numbers, from one place: ``docs/numbers.json``.

Every test count, test time and main-job time in README.md sits in a span
``<!--n:KEY-->text<!--/n-->`` (the markers do not show on a rendered page); this script
renders each span's text from the JSON, so the numbers cannot disagree with each other.

    python scripts/readme_numbers.py                   # rewrite README.md's spans from docs/numbers.json
    python scripts/readme_numbers.py --check           # exit 1 if README.md disagrees with the JSON
    # after a measured run: update the JSON, then the README
    python -m pytest -q --junitxml=/tmp/suite.xml
    python scripts/readme_numbers.py --junit /tmp/suite.xml --date 2026-12-01
    /usr/bin/time -f %e ccddp characterize --quick --out runs/quick     # its seconds:
    python scripts/readme_numbers.py --main-job-s 314 --date 2026-12-01
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "docs" / "numbers.json"
README = ROOT / "README.md"
SPAN = re.compile(r"<!--n:([a-z_]+)-->(.*?)<!--/n-->", re.S)


class NumbersError(Exception):
    """A README span or a measured run this script cannot use."""


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def _about(seconds: float) -> str:
    return f"~{max(1, round(seconds / 60))} min"


def spans(n: dict) -> dict[str, str]:
    """Every span's text, from the numbers ``n``."""
    suite, fast, job = n["suite"], n["fast_tier"], n["main_job"]
    runs = job["seconds"]
    return {
        "main_job_about": _about(sum(runs) / len(runs)),
        "main_job_runs": (" and ".join(_clock(s) for s in runs)
                          + (f" in {len(runs)} runs" if len(runs) > 1 else " in one run")
                          + f" on {job['machine']} ({job['date']})"),
        "suite_about": _about(suite["seconds"]),
        "suite_run": (f"all {suite['tests']:,} tests in {_clock(suite['seconds'])} -- {suite['passed']:,} pass, "
                      f"{suite['failed']:,} fail, {suite['skipped']:,} skip (the CUDA variants, without a GPU) -- "
                      f"({suite['machine']}, {suite['date']})"),
        "suite_counts": f"{suite['tests']:,} tests, {suite['skipped']:,} of them skipping without a GPU",
        "fast_tier": (f"{fast['tests']:,} of {fast['of']:,} on {fast['date']}, {_clock(fast['seconds'])}, "
                      f"the {fast['skipped']:,} CUDA variants skipping"),
    }


def render(text: str, n: dict) -> str:
    """``text`` with every span rendered from ``n``; :class:`NumbersError` for an unknown key."""
    known = spans(n)

    def one(m: re.Match) -> str:
        if m.group(1) not in known:
            raise NumbersError(f"README span <!--n:{m.group(1)}--> has no number; known: {', '.join(known)}")
        return f"<!--n:{m.group(1)}-->{known[m.group(1)]}<!--/n-->"

    return SPAN.sub(one, text)


def from_junit(path: str) -> dict:
    """Counts and seconds of a ``pytest --junitxml`` report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise NumbersError(f"cannot read the JUnit report {path}: {e}") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise NumbersError(f"{path} holds no <testsuite>: write it with python -m pytest --junitxml={path}")
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {"tests": tests, "failed": failed, "skipped": skipped, "passed": tests - failed - skipped,
            "seconds": round(sum(float(s.get("time", 0)) for s in suites))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render README.md's measured numbers from docs/numbers.json, "
                                            "after updating the JSON from a measured run if one is given.")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if README.md disagrees")
    p.add_argument("--junit", metavar="XML", help="a whole-suite run's pytest --junitxml report")
    p.add_argument("--main-job-s", type=float, nargs="+", metavar="SECONDS",
                   help="the main job's wall time, one number per run")
    p.add_argument("--date", help="when the run was measured (default: keep the JSON's)")
    p.add_argument("--machine", help="where, e.g. 'a quiet 2-core machine' (default: keep the JSON's)")
    p.add_argument("--numbers", default=str(NUMBERS), help="the numbers file")
    p.add_argument("--readme", default=str(README), help="the README to render")
    args = p.parse_args(argv)
    try:
        numbers = json.loads(Path(args.numbers).read_text())
        where = {k: v for k, v in (("date", args.date), ("machine", args.machine)) if v}
        if args.junit:
            numbers["suite"].update(from_junit(args.junit), **where)
        if args.main_job_s:
            numbers["main_job"].update(seconds=[round(s) for s in args.main_job_s], **where)
        readme = Path(args.readme)
        old = readme.read_text()
        new = render(old, numbers)
    except (NumbersError, OSError, KeyError, ValueError) as e:
        print(f"readme_numbers: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != old:
            changed = [m.group(1) for m, o in zip(SPAN.finditer(new), SPAN.finditer(old)) if m.group(2) != o.group(2)]
            print(f"README.md disagrees with {args.numbers} in: {', '.join(changed)}; run "
                  "python scripts/readme_numbers.py", file=sys.stderr)
            return 1
        return 0
    if args.junit or args.main_job_s:
        Path(args.numbers).write_text(json.dumps(numbers, indent=2) + "\n")
    if new != old:
        readme.write_text(new)
    print(f"README.md: {len(SPAN.findall(new))} numbers from {args.numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
