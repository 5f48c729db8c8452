"""Model projection of one all-reduce, CC-off against the naive and pipelined secure
schedules, on a hardware profile with fields changed (``--set FIELD=VALUE``).

For questions a measurement on this machine cannot answer, e.g. "would the pipelined
schedule beat naive by 1.3x if transfers did not run on the ranks' cores?" Every number
it prints is a model projection, not a measurement.

Usage::

    python scripts/project_collective.py --profile benchmarks/validation-zen5/local.toml \\
        --size 64M --world-sizes 2,4 --set link_cpu_gbps=inf --set link_gbps=2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib

from ccddp.bench.collectives import parse_size
from ccddp.errors import ConfigError
from ccddp.sim import Schedule, load_profile
from ccddp.sim.collective import domains_allreduce, plain_allreduce, secure_allreduce
from ccddp.sim.rates import Rates


def parse_set(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` with VALUE in TOML syntax (``2``, ``inf``, ``true``, ``"x"``), as
    in a profile file; the field and its range are checked by ``HardwareProfile.replace``."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError(f"--set takes FIELD=VALUE, got {text!r}")
    try:
        return name.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"--set {name}: {value!r} is not a TOML value") from None


def project(hw, n: int, nbytes: int, domain_size: int | None = None) -> dict:
    """CC-off and both secure schedules' modelled time (ms) of one all-reduce on ``n`` ranks
    (and, with ``domain_size``, the backend's hierarchical schedule over ``n / domain_size``
    trust domains of that many ranks)."""
    off = plain_allreduce(Rates.resolve(hw, Schedule("naive"), n=n, cc=False), n, nbytes, hw.nvls)
    row = {"world_size": n, "bytes": nbytes, "cc_off_ms": off.ms}
    for s in ("naive", "pipelined"):
        row[f"{s}_ms"] = secure_allreduce(Rates.resolve(hw, Schedule(s), n=n, cc=True), Schedule(s), n, nbytes).ms
    row["naive_over_pipelined"] = row["naive_ms"] / row["pipelined_ms"]
    row["pipelined_over_off"] = row["pipelined_ms"] / row["cc_off_ms"]
    if domain_size:
        if n % domain_size:
            raise ConfigError(f"--domain-size {domain_size} does not divide world size {n}")
        sched = Schedule("pipelined")
        row["domain_size"] = domain_size
        row["domains_ms"] = domains_allreduce(Rates.resolve(hw, sched, n=n, cc=True), sched, n // domain_size,
                                              domain_size, nbytes).ms
        row["domains_over_off"] = row["domains_ms"] / row["cc_off_ms"]
        row["pipelined_over_domains"] = row["pipelined_ms"] / row["domains_ms"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="local", help="built-in profile or TOML path")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="change a profile field (repeatable), e.g. link_cpu_gbps=inf")
    ap.add_argument("--domain-size", type=int, default=None,
                    help="also the ccddp backend's hierarchical all-reduce over trust domains of this many ranks")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    try:
        hw = load_profile(args.profile)
        sets = dict(map(parse_set, args.set))
        hw = hw.replace(**sets)
        changes = {name: getattr(hw, name) for name in sets}   # as validated (2 -> 2.0)
        rows = [project(hw, int(n), parse_size(args.size), args.domain_size) for n in args.world_sizes.split(",")]
    except (ConfigError, ValueError) as e:
        print(f"project_collective: {e}", file=sys.stderr)
        return 2
    for r in rows:
        print(f"model, {args.profile} {changes or ''}: n={r['world_size']} {r['bytes']} B  "
              f"off {r['cc_off_ms']:.1f} ms  naive {r['naive_ms']:.1f}  pipelined {r['pipelined_ms']:.1f}  "
              f"naive/pipelined {r['naive_over_pipelined']:.2f}  pipelined/off {r['pipelined_over_off']:.2f}"
              + (f"  domains of {r['domain_size']} {r['domains_ms']:.1f} ms (pipelined/domains "
                 f"{r['pipelined_over_domains']:.2f}, domains/off {r['domains_over_off']:.2f})" if "domains_ms" in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": args.profile, "changes": changes, "model_projection": True,
                       "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
