"""The ``ccddp selftest`` command line and the names it accepts: the attacks, the
collectives they strike, the faults. Nothing here imports torch, so ``ccddp selftest
--help`` and a mistyped option answer at once; :mod:`ccddp.bench.selftest` runs the cases.

Example::

    args = build_parser().parse_args(["--attacks", "flip,replay", "--collectives", "all_reduce,setup"])
    parse_lists(args)        # (['flip', 'replay'], ['all_reduce', 'setup'])
"""

from __future__ import annotations

import argparse

from ccddp.bench.options import trust_domains_setting
from ccddp.errors import ConfigError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "ddp_step", "setup", "attestation")
# What runs hierarchically over trust domains (the ccddp backend's schedules): under
# ``--trust-domains`` their attacks strike the sealed shard rings across domains. The
# others are sealed end to end under any map, and are attacked as without domains.
HIERARCHICAL = ("all_reduce", "reduce_scatter", "broadcast")
INTEGRITY_ATTACKS = ("flip", "truncate", "replay", "reorder", "drop", "splice-step", "splice-bucket", "splice-link")
DATA_ATTACKS = INTEGRITY_ATTACKS + ("delay", "stall")
# Attacks on the setup's messages, and the exchange each one strikes (0: the ranks'
# contributions, 1: their key confirmations).
SETUP_ATTACKS = {"flip": 1, "swap": 1, "replay": 0, "drop": 0, "reorder": 1}
# Attacks on attested setup (SEV-SNP evidence from the TEST chain of
# ccddp.testing.snp_chain, trusted by the self-test alone), and the claim each must be
# refused by on every rank: rank 1 presents its own evidence of an earlier group
# (replay), rank 0's evidence of this group (swap), or evidence of a launch image the
# policy does not list (policy-miss).
ATTESTATION_ATTACKS = {"replay": "report_data", "swap": "report_data", "policy-miss": "measurement"}
ATTACKS = DATA_ATTACKS + ("swap", "policy-miss")
ROW_KEYS = ("attack", "collective", "world_size", "expected", "observed", "passed")


def applies(attack: str, collective: str) -> bool:
    """Whether ``attack`` is a case for ``collective`` (setup attacks strike the setup)."""
    if collective == "attestation":
        return attack in ATTESTATION_ATTACKS
    return attack in SETUP_ATTACKS if collective == "setup" else attack in DATA_ATTACKS


def cases(attacks: list[str], collectives: list[str]) -> list[tuple[str, str]]:
    """Every (attack, collective) pair that is a case, collectives outermost."""
    return [(a, c) for c in collectives for a in attacks if applies(a, c)]


def check_lists(attacks: list[str], collectives: list[str]) -> None:
    """Refuse unknown names, and lists that make no case, with a one-line ``ConfigError``."""
    for a in attacks:
        if a not in ATTACKS:
            raise ConfigError(f"unknown attack {a!r}; choose from {', '.join(ATTACKS)}")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ConfigError(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    if not cases(attacks, collectives):
        raise ConfigError(f"no case: {', '.join(attacks)} against {', '.join(collectives)} "
                          f"(the setup takes {', '.join(SETUP_ATTACKS)}; attestation takes {', '.join(ATTESTATION_ATTACKS)}; "
                          f"collectives take {', '.join(DATA_ATTACKS)})")


def plaintext_links(domains: list[list[int]]) -> list[dict]:
    """The links inside each trust domain of ``domains`` (an explicit map): plaintext by
    design, so the self-test states them instead of attacking them.

    Example::

        plaintext_links([[0, 1], [2, 3]])[0]["links"]     # ["0<->1"]
    """
    return [{"domain": list(d), "links": [f"{a}<->{b}" for i, a in enumerate(d) for b in d[i + 1:]],
             "status": "plaintext by design, not attacked",
             "why": "ranks of one trust domain proved they share a machine (AF_UNIX links answered under the "
                    "session key, never TCP) and carry only the phases of the hierarchical collectives inside "
                    "the domain"}
            for d in domains if len(d) > 1]


# -- faults (one torchrun job each): what each does and the error that must end the job

FAULTS = {
    "tampered-frame": ("a frame on link 0->1 is tampered with", "IntegrityError"),
    "killed-rank": ("rank 1 is killed (SIGKILL) in the middle of an all-reduce", "PeerTimeoutError"),
    "silent-peer": ("rank 1 stops responding in the middle of an all-reduce", "PeerTimeoutError"),
    "other-settings": ("rank 1 is started with another segment size", "ConfigError"),
    "other-key": ("rank 1 holds another group secret", "ConfigError"),
    "other-length": ("rank 1 all-reduces a tensor of another length", "ConfigError"),
    "other-dtype": ("rank 1 all-reduces float64, the others float32", "ConfigError"),
}


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """Options of ``python -m ccddp.bench.selftest`` (and, without ``--help``, of ``ccddp selftest``)."""
    p = argparse.ArgumentParser(prog="ccddp selftest", description=__doc__.splitlines()[0], add_help=add_help)
    p.add_argument("--attacks", default=",".join(ATTACKS),
                   help=f"comma list of {', '.join(ATTACKS)} (the setup takes {', '.join(SETUP_ATTACKS)}; "
                        f"attestation takes {', '.join(ATTESTATION_ATTACKS)})")
    p.add_argument("--collectives", default=None,
                   help=f"comma list of {', '.join(COLLECTIVES)} (default: all of them; setup: the messages "
                        "that set a secure group up; attestation: attested setup with SEV-SNP evidence from a test chain)")
    p.add_argument("--impl", default="secure", choices=["secure", "secure-naive"],
                   help="secure collective implementation under attack: pipelined (secure) or the paper's (secure-naive)")
    p.add_argument("--trust-domains", default="rank", metavar="MAP",
                   help="which ranks share a trust boundary: rank (every rank its own, the default), node, or a "
                        "JSON list of rank lists such as [[0,1],[2,3]] (at least two domains). "
                        f"{', '.join(HIERARCHICAL)} then run the backend's hierarchical schedules, and their "
                        "attacks strike the sealed links across domains; links inside a domain are plaintext by "
                        "design and listed, not attacked")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a rank may wait on a peer")
    p.add_argument("--stall-timeout", type=float, default=2.0,
                   help="timeout of the cases that must end in a timeout (stall, a dropped last frame)")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    p.add_argument("--fault", default=None, choices=sorted(FAULTS), help=argparse.SUPPRESS)
    p.add_argument("--fault-attack", default="flip", help=argparse.SUPPRESS)
    return p


def parse_lists(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The attacks and collectives ``args`` asks for, checked."""
    attacks = [a for a in args.attacks.split(",") if a]
    collectives = [c for c in args.collectives.split(",") if c] if args.collectives else list(COLLECTIVES)
    check_lists(attacks, collectives)
    if args.timeout <= 0 or args.stall_timeout <= 0:
        raise ConfigError("timeouts must be positive")
    trust_domains_setting(args.trust_domains)
    return attacks, collectives
