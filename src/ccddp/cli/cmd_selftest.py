"""``ccddp selftest``: attack this machine's secure collectives and show what was caught.

Example::

    $ ccddp selftest --world-size 2 --json selftest.json
    $ ccddp selftest --world-size 4 --faults        # also kill / silence / misconfigure a rank
    $ ccddp selftest --world-size 4 --trust-domains '[[0,1],[2,3]]'   # attack the links across domains
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from ccddp.errors import CCDDPError, ConfigError

SUMMARY = "attack the secure collectives of local ranks on this machine and show that every attack is caught"


def register(sub) -> None:
    from ccddp.bench.selftest_options import build_parser

    p = sub.add_parser("selftest", parents=[build_parser(add_help=False)], help=SUMMARY,
                       description="Launch N local ranks, run every attack of the adversarial link layer against "
                                   "secure all-reduce, reduce-scatter, all-gather, broadcast (and a DDP step), and "
                                   "print attack / collective / expected / observed / passed. Exit status 0 only "
                                   "if every row passed.")
    p.add_argument("--world-size", type=int, default=2, help="local ranks to launch (>= 2)")
    p.add_argument("--faults", action="store_true",
                   help="also kill, silence and misconfigure a rank (one launch each, slower)")
    p.set_defaults(func=run)


def _fault_rows(world_size: int, timeout_s: float) -> list[dict]:
    from ccddp.bench.launch import torchrun
    from ccddp.bench.selftest_options import FAULTS

    rows = []
    # Start-up (imports, rendezvous) is part of the wall time; detection is bounded by timeout_s.
    budget = timeout_s + 60.0
    for name, (what, error) in FAULTS.items():
        t0 = time.monotonic()
        try:
            torchrun("ccddp.bench.selftest", ["--fault", name, "--timeout", str(timeout_s)], nproc=world_size,
                     quiet=True, timeout_s=budget + 60)
            observed, ok = "every rank exited 0 (fault not detected)", False
        except CCDDPError as e:
            secs = time.monotonic() - t0
            reason = str(e).split(": ", 1)[-1]
            observed = f"non-zero exit after {secs:.1f}s: {reason}"
            ok = error in reason and secs <= budget
        rows.append({"attack": name, "collective": "all_reduce", "world_size": world_size,
                     "expected": f"{what}: job exits non-zero, reason {error}", "observed": observed[:300],
                     "passed": ok})
    return rows


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.launch import torchrun
    from ccddp.bench.selftest_options import ROW_KEYS, parse_lists
    from ccddp.report.tables import print_table

    attacks, collectives = parse_lists(args)
    if args.world_size < 2:
        raise ConfigError(f"--world-size must be >= 2 (an attack needs a link), got {args.world_size}")
    from ccddp.cli.preflight import check_group_secret, warn_oversubscribed

    check_group_secret()
    warn_oversubscribed(args.world_size, "ccddp selftest")
    print(start_line(args, attacks, collectives), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "selftest.json")
        forwarded = ["--attacks", ",".join(attacks), "--collectives", ",".join(collectives), "--impl", args.impl,
                     "--trust-domains", args.trust_domains, "--timeout", str(args.timeout),
                     "--stall-timeout", str(args.stall_timeout), "--json", out]
        failure = None
        try:
            torchrun("ccddp.bench.selftest", forwarded, nproc=args.world_size, quiet=True,
                     timeout_s=600 + 20 * len(attacks) * len(collectives))
        except CCDDPError as e:
            failure = e
        if not os.path.exists(out):
            raise failure or CCDDPError("selftest wrote no result")
        with open(out) as f:
            result = json.load(f)
    rows = result["rows"]
    if args.faults:
        rows += _fault_rows(args.world_size, args.stall_timeout + 3.0)
    keys = "X25519 + allowlist" if os.environ.get("CCDDP_IDENTITY") else "pre-shared secret"
    domains = result.get("trust_domains")
    where = f", trust domains {domains}" if domains else ""
    print_table(selftest_table(rows, f"ccddp selftest, world size {args.world_size}, impl {args.impl}{where}, "
                                     f"keys: {keys}"))
    if result.get("plaintext_links"):
        print_table(plaintext_table(result["plaintext_links"]))
    passed = sum(r["passed"] for r in rows)
    print(f"{passed} of {len(rows)} cases passed")
    if failure is not None and passed == len(rows):
        # The verdict is the AND over ranks: rank 0's rows passed, but another rank stopped
        # (e.g. a report that failed authentication there).
        print(f"ccddp: error: a rank failed: {failure}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "rows": [{k: r[k] for k in ROW_KEYS} for r in rows]}, f, indent=2)
        print(f"wrote {args.json}")
    return 0 if passed == len(rows) and failure is None else 1


def start_line(args: argparse.Namespace, attacks: list[str], collectives: list[str]) -> str:
    """What selftest is about to do, printed before the ranks start."""
    from ccddp.bench.selftest_options import FAULTS

    faults = f", then {len(FAULTS)} fault launches (--faults)" if args.faults else ""
    return (f"ccddp selftest: {len(attacks)} attack{'s' * (len(attacks) != 1)} against "
            f"{len(collectives)} collective{'s' * (len(collectives) != 1)} on {args.world_size} local ranks, "
            f"impl {args.impl}{faults}; starting the ranks (the table comes when every case has run)")


def selftest_table(rows: list[dict], title: str = ""):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title)
    for col in ("attack", "collective", "world", "expected", "observed", "passed"):
        t.add_column(col, overflow="fold")
    for r in rows:
        # Escaped: a row's notes and problems are in square brackets, which rich reads as markup.
        t.add_row(r["attack"], r["collective"], str(r["world_size"]), escape(r["expected"]), escape(r["observed"]),
                  "yes" if r["passed"] else "[bold red]NO[/]")
    return t


def plaintext_table(links: list[dict]):
    """The links inside trust domains: stated, not attacked."""
    from rich.table import Table

    t = Table(title="links inside a trust domain (not attacked)")
    for col in ("domain", "links", "status", "why"):
        t.add_column(col, overflow="fold")
    for d in links:
        t.add_row(str(d["domain"]), ", ".join(d["links"]), d["status"], d["why"])
    return t
