"""``ccddp train``: DDP training CC-off and/or CC-on, launched through torchrun."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from ccddp.errors import ConfigError

SUMMARY = "train a workload CC-off and/or CC-on and time every phase; --cc off,on compares them in turns"


def register(sub) -> None:
    from ccddp.bench.options import build_parser

    parent = build_parser(add_help=False)
    p = sub.add_parser("train", parents=[parent], help=SUMMARY, description=parent.description)
    p.add_argument("--world-size", type=int, default=2, help="local ranks to launch on this node")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (run one ccddp train on each)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes-1")
    p.add_argument("--wide", action="store_true",
                   help="every column at the terminal's width, or off a terminal the table's natural width "
                        "(default: at most 120 columns; columns left out are named under the table)")
    p.add_argument("--master-addr", default=None, metavar="HOST",
                   help="node 0's address, reachable from every node, the same on every node (needed with "
                        "--nnodes > 1; default 127.0.0.1 on one node)")
    p.add_argument("--master-port", type=int, default=None,
                   help="rendezvous port on node 0, the same on every node (needed with --nnodes > 1)")
    p.add_argument("--attestation-policy", default=None, metavar="PATH",
                   help="turn on hardware attestation (SEV-SNP / TDX): every CC-on rank must present evidence this "
                        "policy TOML accepts, bound to its key exchange; checked before anything starts")
    p.add_argument("--attestation-certs", default=None, metavar="DIR",
                   help="the vendor certificates the policy's evidence is verified with (AMD's ASK/ARK, Intel "
                        "CRLs); needed for an [snp] policy unless CCDDP_ATTESTATION_CERTS names them")
    p.set_defaults(func=run)


def forwarded_args(args: argparse.Namespace, json_path: str) -> list[str]:
    out = ["--workload", args.workload, "--size", args.size, "--cc", args.cc, "--schedule", args.schedule,
           "--warmup", str(args.warmup), "--alternate", args.alternate,
           "--block", str(args.block), "--seed", str(args.seed), "--lr", str(args.lr),
           "--segment-mb", str(args.segment_mb), "--chains", str(args.chains), "--tag", args.tag,
           "--trust-domains", args.trust_domains, "--device", args.device, "--placement", args.placement,
           "--timeout", str(args.timeout), "--json", json_path]
    for flag, value in (("--steps", args.steps), ("--batch-size", args.batch_size), ("--seq-len", args.seq_len),
                        ("--image-size", args.image_size), ("--dtype", args.dtype),
                        ("--bucket-cap-mb", args.bucket_cap_mb), ("--budget", args.budget),
                        ("--precision", args.precision)):
        if value is not None:
            out += [flag, str(value)]
    return out


def check_request(args: argparse.Namespace) -> None:
    """Fail before launching anything when the request cannot work here: every argument
    first, without torch (an answer in well under a second), then what needs the model."""
    variants = check_arguments(args)
    from ccddp.bench.options import WORKLOAD_LIBRARY
    from ccddp.cli import require_modules

    # The ranks' model library and the summary's statistics: a missing extra is one line
    # here, not a failure of every rank.
    require_modules(WORKLOAD_LIBRARY[args.workload], "scipy")
    if not loads_model_to_check(args):
        return
    from ccddp.bench.memory import check_fits
    from ccddp.bench.options import workload_from

    wl = workload_from(args)
    # Variants that do not fit together take turns one model at a time: each must fit alone.
    for v in variants:
        check_fits(wl, args.world_size, args.world_size * args.nnodes, v.schedule)


def loads_model_to_check(args: argparse.Namespace) -> bool:
    """Whether the memory check needs the model (torch and the model's library, 2-5 s): not
    for ``--size tiny``, whose parameters (fixed by the size: no option changes them) take
    under :data:`ccddp.bench.memory.TINY_BYTES_PER_RANK` per rank, less than torch alone."""
    return args.size != "tiny"


def check_arguments(args: argparse.Namespace):
    """Every argument, without torch or a model: returns the variants."""
    from ccddp.bench.options import check, min_world_size

    variants = check(args)
    if args.world_size < 1 or args.nnodes < 1:
        raise ConfigError("--world-size and --nnodes must be >= 1")
    if args.world_size * args.nnodes < min_world_size(args.device):
        what = "CC-on training needs" if any(v.cc == "on" for v in variants) else "DDP training needs"
        raise ConfigError(f"{what} at least 2 ranks to exchange gradients: use --world-size 2 or more "
                          "(one rank runs with --device cuda, where CC-on differs by the input's bounce path)")
    if args.nnodes > 1 and (args.master_port is None or not args.master_addr):
        raise ConfigError("with --nnodes > 1 give every node node 0's address and a port, the same on every node: "
                          "--master-addr HOST --master-port PORT")
    if args.master_addr is not None and (not args.master_addr.strip() or any(c.isspace() for c in args.master_addr)):
        raise ConfigError(f"--master-addr must be a host name or IP address, got {args.master_addr!r}")
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE  # the crypto stack: only when checking

    # Attested ranks agree on their keys by key establishment: no shared secret is needed.
    attested = getattr(args, "attestation_policy", None) is not None
    if args.nnodes > 1 and any(v.cc == "on" for v in variants) and not attested and \
            not (os.environ.get(ENV_SECRET) or os.environ.get(ENV_SECRET_FILE)):
        raise ConfigError(f"with --nnodes > 1 every node needs the same group secret: set {ENV_SECRET} "
                          f"or {ENV_SECRET_FILE} on each node (or give --attestation-policy)")
    if args.budget is not None and args.warmup < 1:
        raise ConfigError("--budget needs --warmup >= 1: the warm-up times the budget")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise ConfigError(f"--master-port must be a TCP port, 1 .. 65535, got {args.master_port}")
    if not 0 <= args.node_rank < args.nnodes:
        raise ConfigError(f"--node-rank must be in 0 .. {args.nnodes - 1}, got {args.node_rank}")
    return variants


def launch_line(args: argparse.Namespace, variants) -> str:
    """What ``ccddp train`` is about to run, in one line (printed before torch loads)."""
    where = f"{args.world_size} rank{'' if args.world_size == 1 else 's'}" + (f" on each of {args.nnodes} nodes (this is node {args.node_rank})"
                                          if args.nnodes > 1 else "")
    if args.budget and args.precision:
        plan = (f"{args.warmup} warm-up iterations per variant, then rounds until every ratio's 95 % interval is "
                f"within ±{args.precision * 100:g} % (at least {args.steps}, at most {args.budget:g} s measured)")
    elif args.budget:
        plan = f"{args.warmup} warm-up + at least {args.steps}, up to {args.budget:g} s measured iterations per variant"
    else:
        plan = f"{args.warmup} warm-up + {args.steps} measured iterations per variant"
    if args.device == "cuda":
        where += f" on CUDA (CC-on placement {args.placement})"
    return (f"ccddp train: {args.workload}" + (" (tiny)" if args.size == "tiny" else "") + f" on {where}, "
            f"cc {', '.join(v.label for v in variants)}; {plan}; "
            f"results: {args.json or 'printed, not kept (--json PATH keeps them)'}")


def run(args: argparse.Namespace) -> int:
    from ccddp.cli.preflight import check_group_secret, require_gpu_device, warn_oversubscribed

    variants = check_arguments(args)
    from ccddp.crypto.attest.options import attestation_environment

    # The policy parsed and the certificates read here: a mistake is one line, before torch.
    attestation = attestation_environment(args.attestation_policy, args.attestation_certs)
    check_group_secret()
    if args.device == "cuda":
        require_gpu_device("ccddp train")   # no GPU device at all: answered before torch loads
    print(launch_line(args, variants), flush=True)
    if args.device == "cuda":
        from ccddp.bench.devices import require_cuda  # torch: after every argument is checked

        require_cuda("ccddp train")
    from ccddp.bench.launch import job_env, torchrun
    from ccddp.bench.options import PROGRESS_ENV

    if loads_model_to_check(args):
        print(f"checking that {args.workload} fits in memory (loads torch and the model)", flush=True)
    check_request(args)
    if args.device == "cpu":   # after the checks that refuse: a warning, not a refusal, before torchrun starts
        warn_oversubscribed(args.world_size, "ccddp train")
    shown = "each iteration" if args.budget is None else f"each of the first {args.steps} rounds, then a line a second"
    print(f"starting {args.world_size} local rank{'s' * (args.world_size != 1)} (each loads torch and builds the "
          f"model first); rank 0 prints {shown}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.json or os.path.join(tmp, "train.json")
        timeout = args.timeout * 4 + 600 + 2 * (args.budget or 0)
        torchrun("ccddp.bench.train", forwarded_args(args, out), nproc=args.world_size, nnodes=args.nnodes,
                 node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port, timeout_s=timeout,
                 env=job_env({PROGRESS_ENV: "1", **attestation}))
        if args.node_rank == 0 and os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
            print_summary(result.get("runs", [result]), wide=args.wide)
    if args.json and args.node_rank == 0:
        print(f"wrote {args.json}")
    return 0


def print_summary(results: list[dict], wide: bool = False, stream=None) -> None:
    """One variant: every iteration; several: each variant's medians and the paired ratios.
    At most 120 columns unless ``wide``; every column explained once under the table."""
    import sys
    import textwrap

    from ccddp.bench.options import PHASES
    from ccddp.report.tables import Col, default_width, print_rows

    stream = stream or sys.stdout
    width = default_width(stream, wide)

    first = results[0]
    head = f"{first['workload']}, world size {first['world_size']}"
    phases = ("total_ms",) + PHASES + ("crypto_busy_ms",)
    if len(results) == 1:
        cols = [Col("step", lambda it: f"{it['step']}{' (warm-up)' if it['warmup'] else ''}")]
        cols += [Col(_header(k), lambda it, k=k: f"{it[k]:.1f}", drop=len(phases) - i)
                 for i, k in enumerate(phases) if k != "total_ms"]
        cols.insert(1, Col("total (ms)", lambda it: f"{it['total_ms']:.1f}"))
        print_rows(cols, first["iterations"], title=f"{head}, {first['variant']}", notes=[PHASE_NOTE],
                   width=width, stream=stream, wide=wide)
    else:
        _print_comparison(results, head, phases, width, stream, wide)
    for r in results:
        line = (f"{r['variant']}: all-reduce calls/iter {r['allreduce_calls_per_iteration']}, seals/rank "
                f"{r['seals_per_rank']}, opens/rank {r['opens_per_rank']}, broadcast seals/iter "
                f"{r['broadcast_seals_per_iteration']}, bounce seals/iter {r['bounce_seals_per_iteration']}, "
                f"params sha256 {r['param_sha256'][:16]}…")
        print(textwrap.fill(line, width, subsequent_indent="  ") if width else line, file=stream)


#: Every phase column of the train tables, explained once under the table.
PHASE_NOTE = ("Phases, ms per iteration: data (the batch made), bounce (the input batch's sealed copy through "
              "the bounce buffer, CC-on), forward, backward (until DDP's last gradient bucket is ready), exposed "
              "comm (waiting for the all-reduces after that), optimizer; total: the whole iteration; crypto busy: "
              "time spent sealing and opening, overlapped with the rest or not.")


def _header(key: str) -> str:
    return key.removesuffix("_ms").replace("_", " ") + " (ms)"


def _print_comparison(results: list[dict], head: str, phases: tuple[str, ...], width: int | None = None,
                      stream=None, wide: bool = False) -> None:
    from ccddp.report.results import round_ms
    from ccddp.stats import METHOD, MIN_SAMPLES, median_interval, paired_ratio, ratio_text
    from ccddp.report.tables import Col, print_rows

    def total(r: dict) -> str:
        iv = median_interval([it["total_ms"] for it in r["iterations"] if not it["warmup"]])
        return f"{iv.estimate:.1f}" + (f" ({iv.low:.0f}–{iv.high:.0f})" if iv.known else "")

    base = results[0]
    rows = [{**r, "ratio": None if r is base else paired_ratio(round_ms(r), round_ms(base))} for r in results]
    cols = [Col("variant", lambda r: r["variant"], "left"), Col("measured", lambda r: str(r["steps"])),
            Col("total (ms), 95 % interval", total),
            Col(f"/ {base['variant']} ¹", lambda r: "1" if r["ratio"] is None else ratio_text(r["ratio"]))]
    cols += [Col(_header(k), lambda r, k=k: f"{r['summary'][k]:.1f}", drop=len(phases) - i)
             for i, k in enumerate(phases) if k != "total_ms"]
    how = base["pairing"]["alternation"]
    notes = [f"measured: rounds each variant was measured; total: median iteration time with its 95 % interval. "
             f"¹ {METHOD}; not the ratio of the medians in the total column. {PHASE_NOTE} (medians)"]
    short = [r["ratio"].n for r in rows if r["ratio"] is not None and not r["ratio"].known]
    if short:
        notes.append(f"No interval from {min(short)} rounds: a 95 % interval needs at least {MIN_SAMPLES}. Leave out "
                     f"--steps (the default measures until the interval is within ±10 %) or give --steps "
                     f"{MIN_SAMPLES} or more.")
    print_rows(cols, rows, title=f"{head}: variants in turns ({'one iteration' if how == 'iteration' else 'blocks'} "
                                 f"each), medians over measured iterations", notes=notes, width=width, stream=stream,
               wide=wide)
