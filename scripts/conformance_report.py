"""Compares PyTorch's backend suite on gloo and on ccddp (JUnit XML from
scripts/torch_conformance.sh): every test that passes on gloo must pass on ccddp or be
listed, with its reason, in conformance/ccddp_exceptions.toml. Exit status 1 if one is
neither.

    python scripts/conformance_report.py gloo.xml ccddp.xml conformance/ccddp_exceptions.toml [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    """test name -> passed / failed / skipped, from JUnit XML or, for a run that has not
    finished, from its ``pytest -v`` log."""
    if not path.endswith(".xml"):
        with open(path) as f:
            found = re.findall(r"::(test\w+) (PASSED|FAILED|SKIPPED|ERROR)", f.read())
        return {name: {"PASSED": "passed", "SKIPPED": "skipped"}.get(s, "failed") for name, s in found}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
            elif child.tag == "skipped" and status == "passed":
                status = "skipped"
        out[case.get("name")] = status
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gloo")
    p.add_argument("ccddp")
    p.add_argument("exceptions")
    p.add_argument("--json")
    a = p.parse_args(argv)
    gloo, ccddp = outcomes(a.gloo), outcomes(a.ccddp)
    with open(a.exceptions, "rb") as f:
        listed = {name: entry["reason"] for name, entry in tomllib.load(f).get("tests", {}).items()}
    gloo_passed = sorted(t for t, s in gloo.items() if s == "passed")
    both = [t for t in gloo_passed if ccddp.get(t) == "passed"]
    justified = {t: listed[t] for t in gloo_passed if ccddp.get(t) != "passed" and t in listed}
    unexplained = [t for t in gloo_passed if ccddp.get(t) != "passed" and t not in listed]
    stale = sorted(t for t in listed if ccddp.get(t) == "passed")
    report = {"tests": len(gloo), "gloo_passed": len(gloo_passed), "ccddp_passed_of_those": len(both),
              "justified": justified, "unexplained": {t: ccddp.get(t, "missing") for t in unexplained},
              "listed_but_passing": stale,
              "ccddp_only_passed": sorted(t for t, s in ccddp.items() if s == "passed" and gloo.get(t) != "passed")}
    print(f"{len(gloo)} tests; gloo passed {len(gloo_passed)}; ccddp passed {len(both)} of those; "
          f"{len(justified)} listed with a reason; {len(unexplained)} unexplained; "
          f"{len(report['ccddp_only_passed'])} pass on ccddp only")
    for t in unexplained:
        print(f"  unexplained: {t} ({ccddp.get(t, 'missing')} on ccddp)")
    for t in stale:
        print(f"  listed but passing now: {t}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
