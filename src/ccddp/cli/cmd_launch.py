"""``ccddp launch``: run an unmodified torch.distributed script with its CPU process groups
served by the ``ccddp`` backend.

It is ``torchrun`` with every rank started through ``ccddp.backend.intercept``, which
registers the backend and turns the backend the script asks for (``"gloo"``, or none)
into ``"ccddp"`` before running the script. Without key material in the environment, a
single-node launch gets a fresh group secret; a multi-node one must set
``CCDDP_GROUP_SECRET`` (or identity keys) on every node.

Rendezvous: torchrun's static rendezvous only. The dynamic ones (``c10d``, ``etcd``, and
the ``c10d`` rendezvous torchrun picks by itself for ``--standalone`` or a single node
without ``--master-port``) keep their state in the rendezvous store as a pickle and
unpickle what they read back; the store belongs to the host, so a host that writes a
crafted pickle there would run code in the agent. What is checked is what torchrun will
do, not how the options were spelled: the final argument list is parsed with torchrun's
own parser, which accepts any unambiguous prefix (``--stand`` is ``--standalone``) and
takes every option's default from a ``PET_<OPTION>`` variable. Every ``PET_*`` variable
is turned into the option it stands for (so it is checked like one) and none reaches
torchrun. A single-node launch is given ``--master-addr 127.0.0.1`` and a free
``--master-port``; a multi-node launch names them itself, with ``--nnodes N --node-rank
R``; ``--standalone``, a dynamic backend, or a range of nodes (which only a dynamic
rendezvous serves) is refused before anything starts. ``--max-restarts`` works: a
restarted attempt builds new links and a new session.

The group secret (made here, or ``CCDDP_GROUP_SECRET`` from the caller's environment)
reaches the ranks in a sealed in-memory file of this process (``memfd``), which the
ranks open through ``/proc/<this pid>/fd/N`` (named by ``CCDDP_GROUP_SECRET_FILE``): it is
never in the environment block of the agent, the ranks or anything they start, where
``/proc/<pid>/environ`` would show it for the process's lifetime.

Three options are ccddp's own, given before torchrun's in any order: ``--trust-domains
MAP`` (``rank``, ``node`` or a JSON list of rank lists) sets the ranks' ``trust_domains``
setting, merged into ``CCDDP_SETTINGS`` (whatever else that names stays); which ranks
really share a domain is still proven by the ranks themselves
(:mod:`ccddp.backend.local_links`). ``--attestation-policy PATH`` and
``--attestation-certs DIR`` turn on hardware attestation: the policy is parsed and the
certificates read here (:mod:`ccddp.crypto.attest.options`), then the ranks get
``CCDDP_ATTESTATION_POLICY`` / ``CCDDP_ATTESTATION_CERTS`` and agree on their keys by
attested establishment (no group secret is made or handed over). A policy given only by
the environment (``CCDDP_ATTESTATION_POLICY`` set, no option) is checked the same way.

Example::

    $ ccddp launch --nproc-per-node 2 examples/ddp_tutorial.py --steps 5
    $ ccddp launch --trust-domains node --nproc-per-node 4 train.py   # plaintext only among proven local ranks
    $ ccddp launch --attestation-policy policy.toml --attestation-certs amd-certs/ --nproc-per-node 2 train.py
    $ ccddp launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \
          --nproc-per-node 4 train.py          # the same on the other node with --node-rank 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ccddp.errors import ConfigError
from ccddp.launched import ENV_WORLD_SIZE

INTERCEPT = "ccddp.backend.intercept"

USAGE = ("ccddp launch [--trust-domains MAP] [--attestation-policy PATH [--attestation-certs DIR]] "
         "[torchrun options] SCRIPT [ARGS]")

SUMMARY = "run an unmodified DDP script (torchrun arguments) with ccddp as its backend"


def register(sub) -> None:
    # Every argument, dashes included, is torchrun's (``--help`` too), but ccddp's own
    # leading options (:func:`own_options`).
    p = sub.add_parser("launch", prefix_chars="\0", add_help=False,
                       help=SUMMARY,
                       description="torchrun, with every rank's CPU process groups served by the ccddp backend: "
                                   f"{USAGE}. The script's init_process_group('gloo') (or no backend) becomes "
                                   "'ccddp'; nothing else changes.")
    p.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="[torchrun options] SCRIPT [ARGS]")
    p.set_defaults(func=run)


TRUST_DOMAINS = "--trust-domains"
ATTESTATION_POLICY = "--attestation-policy"
ATTESTATION_CERTS = "--attestation-certs"
#: ccddp's own options, each taking one value, given before torchrun's in any order.
OWN = {TRUST_DOMAINS: "trust_domains", ATTESTATION_POLICY: "attestation_policy",
       ATTESTATION_CERTS: "attestation_certs"}


@dataclass(frozen=True)
class OwnOptions:
    """ccddp's own leading options of ``ccddp launch`` (None: not given)."""

    trust_domains: object = None
    attestation_policy: str | None = None
    attestation_certs: str | None = None


def own_options(argv: list[str]) -> tuple[OwnOptions, list[str]]:
    """ccddp's own options at the head of ``argv``, in any order (``--trust-domains MAP``,
    ``--attestation-policy PATH``, ``--attestation-certs DIR``; each also as
    ``--option=VALUE``), and the rest, which is torchrun's. Only whole names count (none
    is an abbreviation: torchrun has no option these could abbreviate, and an abbreviation
    of ours would be passed on and refused by torchrun's parser). The first argument that
    is not one of them ends ccddp's options, so the same names after it are torchrun's or
    the script's. A value is checked for its form here (the trust-domain map); the
    attestation files are checked by :func:`run`, before anything starts."""
    values: dict[str, object] = {}
    rest = list(argv)
    while rest:
        head, eq, value = rest[0].partition("=")
        if head not in OWN:
            break
        if OWN[head] in values:
            # Given twice: which one wins would be a guess.
            raise ConfigError(f"{head} is given twice")
        rest = rest[1:]
        if not eq:
            if not rest:
                raise ConfigError(f"{head} needs a value: " + ("rank, node or a JSON list of rank lists"
                                                               if head == TRUST_DOMAINS else "a path"))
            value, rest = rest[0], rest[1:]
        if head == TRUST_DOMAINS:
            from ccddp.bench.options import trust_domains_setting

            values[OWN[head]] = trust_domains_setting(value)
        else:
            if not value:
                raise ConfigError(f"{head} needs a path")
            values[OWN[head]] = value
    return OwnOptions(**values), rest


def settings_with(environ: Mapping[str, str], trust_domains) -> str:
    """``CCDDP_SETTINGS`` for the ranks: the caller's (checked here, so a mistake is one line
    before anything starts), with ``trust_domains`` set."""
    import json

    from ccddp.comm.settings import SETTINGS_ENV, settings_from_json

    text = environ.get(SETTINGS_ENV, "")
    settings_from_json(text)                        # bounded, typed: refused here if wrong
    fields = json.loads(text) if text.strip() else {}
    fields["trust_domains"] = trust_domains
    settings_from_json(json.dumps(fields))          # the merged settings are valid too
    return json.dumps(fields)


STATIC_HOW = "--nnodes N --node-rank R --master-addr HOST --master-port PORT"


def _refuse_usage(message: str):
    if "required" in message:       # no script
        raise ConfigError("usage: ccddp launch [torchrun options] SCRIPT [ARGS]")
    raise ConfigError(f"torchrun's options: {message}")


#: What ``ccddp launch --help`` says before torchrun's own help.
HELP = f"""usage: {USAGE}

torchrun, with every rank's process groups served by the ccddp backend: the script's
init_process_group("gloo"), ("nccl") or no backend becomes "ccddp"; nothing else changes.

ccddp's own options (before torchrun's, in any order):
  {TRUST_DOMAINS} MAP         rank, node or a JSON list of rank lists: plaintext only among
                              ranks that prove they share a machine (default: every link sealed)
  {ATTESTATION_POLICY} PATH   hardware attestation: the TOML policy the ranks' evidence must meet
  {ATTESTATION_CERTS} DIR     the directory of AMD's ASK/ARK certificates (SEV-SNP policies)

torchrun's options follow. ccddp launch refuses --standalone, an --rdzv-backend other than
static and a range of --nnodes: each is a rendezvous that unpickles what the host's store
holds. One node gets the static rendezvous on 127.0.0.1 by itself; across nodes give
{STATIC_HOW} on every node.

"""


def _parser() -> argparse.ArgumentParser:
    """torchrun's own parser as torchrun will build it under :func:`child_environment`:
    with no ``PET_*`` variable.

    torchrun's option actions read ``PET_<OPTION>`` from ``os.environ`` when the parser is
    built (``argparse_util.env``/``check_env``), so those variables are set aside for that
    moment (this is the CLI's main thread; nothing else runs) and put back after.
    """
    from torch.distributed.run import get_args_parser

    from ccddp.bench.launch import PET_PREFIX

    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith(PET_PREFIX)]}
    try:
        parser = get_args_parser()
    finally:
        os.environ.update(saved)
    # A usage error is one line from ccddp (exit 2), not torchrun's usage text.
    parser.error = _refuse_usage  # type: ignore[method-assign]
    parser.prog = "ccddp launch"
    torchrun_help = parser.format_help
    parser.format_help = lambda: HELP + torchrun_help()  # type: ignore[method-assign]
    return parser


def pet_options(environ: Mapping[str, str]) -> list[str]:
    """The torchrun options the ``PET_*`` variables of ``environ`` stand for, e.g.
    ``PET_NPROC_PER_NODE=2`` -> ``--nproc-per-node=2``, ``PET_STANDALONE=1`` ->
    ``--standalone``. Given before the user's options, they lose to an option the user
    spelled, as torchrun's defaults do. A ``PET_*`` name torchrun has no option for is
    dropped (torch reads ``PET_*`` nowhere else)."""
    from torch.distributed.argparse_util import check_env, env

    from ccddp.bench.launch import PET_PREFIX

    pet = {k: v for k, v in environ.items() if k.startswith(PET_PREFIX)}
    out: list[str] = []
    for action in _parser()._actions:
        value = pet.get(f"{PET_PREFIX}{action.dest.upper()}")
        if value is None or not action.option_strings:
            continue
        option = max(action.option_strings, key=len)
        if isinstance(action, check_env):
            try:
                on = bool(int(value))
            except ValueError:
                raise ConfigError(f"{PET_PREFIX}{action.dest.upper()}={value[:40]!r}: torchrun reads it as a flag, "
                                  "0 or 1") from None
            out += [option] if on else []
        elif isinstance(action, env):
            out.append(f"{option}={value}")
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` as torchrun will read it, with no ``PET_*`` variable (none reaches it)."""
    return _parser().parse_args(argv)


def _node_range(ns: argparse.Namespace) -> tuple[int, int]:
    from torch.distributed.run import parse_min_max_nnodes

    try:
        return tuple(parse_min_max_nnodes(str(ns.nnodes)))
    except (ValueError, RuntimeError) as e:
        raise ConfigError(f"--nnodes {ns.nnodes!r} is not a number of nodes: {e}") from None


def _check_backend(ns: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` if ``ns`` asks torchrun for a dynamic rendezvous:
    ``--standalone`` (torch/distributed/run.py ``run`` turns it into c10d), another
    backend, or a range of nodes."""
    if ns.standalone:
        raise ConfigError("ccddp launch does not use --standalone (however it is spelled or set, PET_STANDALONE "
                          "included): it is torchrun's c10d rendezvous, which unpickles what it reads from the "
                          "rendezvous store. Leave it out: a one-node launch gets the static rendezvous on "
                          f"127.0.0.1 by itself; across nodes use {STATIC_HOW}")
    if ns.rdzv_backend != "static":
        raise ConfigError(f"ccddp launch does not use the {ns.rdzv_backend} rendezvous: it unpickles what it reads "
                          f"from the rendezvous store, which the host controls. Use the static rendezvous: "
                          f"{STATIC_HOW} on every node")
    low, high = _node_range(ns)
    if low != high:
        raise ConfigError(f"--nnodes {ns.nnodes}: a range of nodes needs a dynamic rendezvous, which ccddp launch "
                          f"does not use (it unpickles what the host's store holds); give a fixed count: {STATIC_HOW}")


def job_size(ns: argparse.Namespace) -> int:
    """The number of ranks the launch ``ns`` asks for (``--nnodes`` times each node's
    ``--nproc-per-node``, as torchrun reads it); :class:`ConfigError` for a value
    torchrun's parser takes but torchrun then fails on with a traceback
    (``--nproc-per-node two``, ``0``, ``--nnodes 0``)."""
    from torch.distributed.run import determine_local_world_size

    try:
        nproc = determine_local_world_size(str(ns.nproc_per_node))
    except ValueError as e:
        raise ConfigError(f"--nproc-per-node {ns.nproc_per_node}: {e} (give a number of ranks per node, or auto, "
                          "cpu or gpu)") from None
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node {ns.nproc_per_node}: a node needs at least one rank")
    nodes = _node_range(ns)[0]
    if nodes < 1:
        raise ConfigError(f"--nnodes {ns.nnodes}: a launch needs at least one node")
    if ns.max_restarts < 0:
        raise ConfigError(f"--max-restarts {ns.max_restarts}: give 0 or more")
    return nodes * nproc


def check_static(ns: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` unless torchrun, given ``ns``, uses the static rendezvous
    (a one-node launch without a port or endpoint is switched to c10d by torchrun too)."""
    _check_backend(ns)
    if ns.master_port is None and not ns.rdzv_endpoint:
        raise ConfigError(f"without --master-port torchrun would pick the c10d rendezvous: {STATIC_HOW}")


def static_rendezvous(ns: argparse.Namespace) -> list[str]:
    """The options to add so torchrun uses the static rendezvous (nothing it reads from the
    store is unpickled); raises :class:`ConfigError` for a launch that needs a dynamic one."""
    _check_backend(ns)
    if ns.master_port is not None or ns.rdzv_endpoint:
        return []
    if _node_range(ns)[1] > 1:
        raise ConfigError(f"a multi-node launch needs the address of node 0: {STATIC_HOW}")
    # Without a port torchrun would switch a one-node launch to the c10d rendezvous.
    from ccddp.bench.launch import free_port

    return ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def torchrun_argv(argv: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """torchrun's arguments for ``ccddp launch ARGV`` in ``environ`` (default: this
    process's): the ``PET_*`` variables as options, the static rendezvous, and the script
    (or ``-m MODULE``) started through the interceptor. The result is checked with
    torchrun's own parser as torchrun will see it (no ``PET_*`` variable: see
    :func:`child_environment`)."""
    environ = os.environ if environ is None else environ
    argv = [*pet_options(environ), *argv]
    ns = _parse(argv)
    if ns.no_python:
        raise ConfigError("ccddp launch runs Python scripts: --no-python is not supported")
    if ns.run_path:
        raise ConfigError("ccddp launch starts every rank through its interceptor: --run-path is not supported")
    rest = list(ns.training_script_args)
    at = len(argv) - len(rest) - 1
    if at < 0 or argv[at] != ns.training_script:
        raise ConfigError(f"cannot find the script {ns.training_script!r} among the arguments")
    head = [a for a in argv[:at] if a not in ("-m", "--module")]
    target = ["-m", ns.training_script] if ns.module else [ns.training_script]
    final = [*head, *static_rendezvous(ns), "-m", INTERCEPT, *target, *rest]
    # What torchrun will do with exactly these arguments (its parser, no PET_* variable).
    done = _parse(final)
    check_static(done)
    job_size(done)
    if not done.module or done.training_script != INTERCEPT:
        raise ConfigError(f"cannot start the script through {INTERCEPT} with these torchrun options")
    return final


def check_script(final: list[str]) -> None:
    """A script that is not there is one line now, not a failure of every rank after
    torchrun has started them; so is a ``-m`` module whose top-level package is on none of
    the paths the ranks import from (this directory, then this Python's path: its
    submodules are left to the ranks' own import, which would run the package's code)."""
    rest = list(_parse(final).training_script_args)
    if rest and rest[0] != "-m" and not os.path.isfile(rest[0]):
        raise ConfigError(f"the script {rest[0]!r} does not exist (from {os.getcwd()})")
    if len(rest) > 1 and rest[0] == "-m":
        import importlib.machinery
        import importlib.util

        top = rest[1].split(".")[0]
        found = importlib.util.find_spec(top) if top in sys.builtin_module_names else \
            importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]])
        if found is None:
            raise ConfigError(f"no module named {top!r} for -m {rest[1]} (from {os.getcwd()} and this Python's path)")


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's environment: ``environ`` without ``PET_*`` variables (each is an option in
    :func:`torchrun_argv` already, checked there) and without the group secret (handed
    over by :func:`ccddp.bench.launch.secret_handoff`)."""
    from ccddp.bench.launch import agent_environment
    from ccddp.crypto.keys import ENV_SECRET

    return {k: v for k, v in agent_environment(environ).items() if k != ENV_SECRET}


def run(args: argparse.Namespace) -> int:
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret

    own, argv = own_options(list(args.torchrun_args))
    if not argv:
        raise ConfigError(f"usage: {USAGE}")
    # The attestation files first: a wrong policy is one line before torch is imported.
    from ccddp.crypto.attest.options import attestation_environment
    from ccddp.crypto.establish import ENV_ATTESTATION_POLICY

    policy = own.attestation_policy
    if policy is None and os.environ.get(ENV_ATTESTATION_POLICY, "").strip():
        # The policy given by the environment only (the ranks read it there): checked the
        # same way, here, rather than by every rank after torch loaded.
        policy = os.environ[ENV_ATTESTATION_POLICY]
    attestation = attestation_environment(policy, own.attestation_certs)
    final = torchrun_argv(argv)
    check_script(final)
    from ccddp.bench.launch import AGENT, secret_handoff, supervised

    cmd = [sys.executable, "-m", AGENT, *final]
    env = child_environment(os.environ)
    env.update(attestation)
    env[ENV_WORLD_SIZE] = str(job_size(_parse(final)))     # each rank checks its WORLD_SIZE against it
    from ccddp.comm.settings import SETTINGS_ENV, settings_from_json

    if own.trust_domains is not None:
        env[SETTINGS_ENV] = settings_with(os.environ, own.trust_domains)
    else:
        settings_from_json(os.environ.get(SETTINGS_ENV, ""))   # a bad setting: one line here, before any rank
    if os.environ.get(ENV_SECRET):
        secret = GroupSecret.from_hex(os.environ[ENV_SECRET])   # refused here, not in every rank
    elif os.environ.get(ENV_SECRET_FILE) or os.environ.get("CCDDP_IDENTITY") or attestation:
        # A path, identity keys, or attestation (the ranks agree on keys by attested
        # establishment, which takes precedence over a group secret): nothing to hand over.
        secret = None
    elif _node_range(_parse(final))[1] > 1:
        raise ConfigError(f"a multi-node launch needs the same key material on every node: set {ENV_SECRET} "
                          f"(or CCDDP_IDENTITY and CCDDP_ALLOWLIST, or {ATTESTATION_POLICY})")
    else:
        secret = GroupSecret.generate()

    with contextlib.ExitStack() as stack:
        if secret is not None:
            env[ENV_SECRET_FILE] = stack.enter_context(secret_handoff(secret))
        # torchrun in a session of its own: Ctrl-C or SIGTERM to this command ends every rank.
        return supervised(cmd, env).returncode
