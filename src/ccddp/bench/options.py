"""Command lines of the measuring commands: ``ccddp train`` (and the variants, CC-off and
CC-on with a schedule, it compares) and ``ccddp bench collectives``.

Nothing here imports torch, so ``ccddp train --help`` and a mistyped option answer at
once; :mod:`ccddp.bench.train` and :mod:`ccddp.bench.collectives` run what these describe.

Example::

    args = build_parser().parse_args(["--workload", "bert-base", "--cc", "off,on"])
    [v.label for v in variants_of(args)]      # ['off', 'on:pipelined']
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ccddp.errors import ConfigError

#: CC-on schedule -> the secure collective implementation it runs.
SCHEDULES = {"naive": "secure-naive", "pipelined": "secure"}
#: Per-iteration phases, in the order they happen.
PHASES = ("data_ms", "bounce_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms")
#: How variants take turns: one iteration each, or (when their models do not fit in memory
#: together) a block of iterations each, the model rebuilt for every block.
ALTERNATIONS = ("auto", "iteration", "block")
#: The secure collectives' own pipelining segment (MiB), the default of --segment-mb. A
#: test checks it against ``CommSettings``, which this module cannot import without torch.
DEFAULT_SEGMENT_MB = 4.0
#: Set by ``ccddp train`` for its ranks: rank 0 prints a line per iteration, flushed, so a
#: terminal or a pipe shows progress (``ccddp characterize`` runs the ranks quietly).
PROGRESS_ENV = "CCDDP_TRAIN_PROGRESS"
#: ``ccddp bench collectives``: operations and element types it can time.
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
DTYPE_NAMES = ("bfloat16", "float16", "float32")
#: The workloads' names, in the registry's order, so a mistyped name is refused before
#: torch and the models load. A test keeps it equal to ``ccddp.workloads.WORKLOADS``.
WORKLOAD_NAMES = ("graphsage", "resnet50", "resnet101", "bert-base", "bert-large", "gpt2-large", "gpt2-xl")
#: The library (of the ``bench`` extra) each workload's model is built with, by import name,
#: so a launch can say it is missing before any rank starts. A test keeps it equal to what
#: each workload's model imports.
WORKLOAD_LIBRARY = {"graphsage": "torch_geometric", **{name: "transformers" for name in WORKLOAD_NAMES[1:]}}
#: Collective implementations a benchmark can time: gloo's own (the CC-off reference) and
#: the engine's schedules (``ccddp.bench.reference.IMPLS``, which imports torch; a test
#: keeps the two equal).
IMPL_NAMES = ("gloo", "ring", "secure-naive", "secure")
#: ``ccddp bench collectives``' name for the ccddp backend itself, hierarchical over
#: ``--trust-domains`` (not an engine implementation: what a user's dist.all_reduce runs).
BACKEND_IMPL = "secure-domains"
#: Where a run's tensors live (``--device``), and where CC-on seals a CUDA tensor's frames
#: (``--placement``: ``ccddp.comm.settings.PLACEMENTS``, which imports torch; a test keeps
#: the two equal).
DEVICES = ("cpu", "cuda")
PLACEMENTS = ("auto", "device", "staged")
#: ``ccddp bench collectives --impl`` when none is given, per device: on CUDA tensors the
#: engine's plaintext ring (host memory only) does not run.
DEFAULT_IMPLS = {"cpu": "gloo,ring,secure-naive,secure", "cuda": "gloo,secure"}
#: Implementations that take CUDA tensors: torch.distributed groups (gloo, the ccddp backend).
CUDA_IMPLS = ("gloo", "secure-naive", "secure", BACKEND_IMPL)
#: ``ccddp train --steps`` when it is not given and one variant is measured.
DEFAULT_STEPS = 3
#: A comparison (``--cc off,on``) given none of --steps, --budget, --precision measures
#: this: the fewest rounds with a 95 % interval (``ccddp.stats.MIN_SAMPLES``; a test keeps
#: them equal), then until every ratio is within ±10 % (as ``characterize --quick``
#: stops) or the budget's seconds of measuring have passed.
COMPARE_DEFAULTS = {"steps": 6, "precision": 0.1, "budget": 10.0}


@dataclass(frozen=True)
class Variant:
    """One configuration compared in a launch: ``cc`` is ``"off"`` or ``"on"``;
    ``schedule`` is the CC-on schedule (``None`` for CC-off)."""

    cc: str
    schedule: str | None = None

    @property
    def label(self) -> str:
        """``off``, ``on:naive`` or ``on:pipelined``."""
        return "off" if self.cc == "off" else f"on:{self.schedule}"

    def key(self, workload: str, world_size: int) -> str:
        return variant_key(workload, world_size, self.cc, self.schedule)


def variant_key(workload: str, world_size: int, cc: str, schedule: str | None) -> str:
    """``resnet50/ws2/cc-off`` or ``resnet50/ws2/cc-on/pipelined``: a run's name in results."""
    return f"{workload}/ws{world_size}/cc-{cc}" + (f"/{schedule}" if cc == "on" else "")


def variants_of(args: argparse.Namespace) -> list[Variant]:
    """The variants ``--cc`` and ``--schedule`` ask for: CC-off first, then CC-on with each
    schedule, e.g. ``--cc off,on --schedule naive,pipelined`` -> off, on:naive, on:pipelined."""
    modes = _split(args.cc, "--cc", ("off", "on"))
    schedules = _split(args.schedule, "--schedule", tuple(SCHEDULES))
    out = [Variant("off")] if "off" in modes else []
    if "on" in modes:
        out += [Variant("on", s) for s in schedules]
    return out


def _split(text: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in allowed:
            raise ConfigError(f"{flag} {text!r}: {x!r} is not one of {', '.join(allowed)}")
    if not items or len(set(items)) != len(items):
        raise ConfigError(f"{flag} {text!r}: give each of {', '.join(allowed)} at most once")
    return items


def add_device_options(p: argparse.ArgumentParser) -> None:
    """``--device`` and ``--placement``, the same on every measuring command."""
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="where models, batches and buffers live: cpu (host memory, gloo), or cuda (rank r on "
                        "GPU r %% GPUs; several ranks may share one GPU)")
    p.add_argument("--placement", default="auto", choices=PLACEMENTS,
                   help="with --device cuda, where CC-on seals a CUDA tensor's frames: device (in device "
                        "memory, by the Triton engine; the ciphertext goes on NCCL where every rank has a GPU of "
                        "its own, else through host memory), staged "
                        "(copied to pinned host memory and sealed there by OpenSSL), or auto (ccddp "
                        "chooses)")


def min_world_size(device: str) -> int:
    """The fewest ranks a training comparison runs on: 2 on CPU ranks (a gradient must
    cross a link to cost anything), 1 on a GPU (CC-on and CC-off then differ by the input
    batch's bounce path alone, sealed on the host and opened on the device)."""
    return 1 if device == "cuda" else 2


def check_device_options(args: argparse.Namespace) -> None:
    """``--placement`` says where a CUDA tensor's frames are sealed: with host tensors it
    would silently do nothing, so it is refused."""
    if args.device != "cuda" and args.placement != "auto":
        raise ConfigError(f"--placement {args.placement} places CUDA tensors' frames: it needs --device cuda")


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccddp train", add_help=add_help,
        description="Train a workload with DistributedDataParallel, CC-off (plain gloo all-reduce) "
                    "and/or CC-on (every gradient exchange sealed with AES-GCM), and time every phase "
                    "of every iteration. With --cc off,on the variants take turns iteration by "
                    "iteration in one launch, so a change in the machine's load falls on both, and "
                    "each CC-on/CC-off ratio comes with a 95 % interval.")
    p.add_argument("--workload", required=True, help=", ".join(WORKLOAD_NAMES[:-1]) + " or " + WORKLOAD_NAMES[-1])
    p.add_argument("--size", default="default", choices=["default", "tiny"],
                   help="tiny: the same model with a few layers, for quick checks")
    p.add_argument("--cc", default="on", help="off, on, or off,on to compare them in one launch")
    p.add_argument("--schedule", default="pipelined",
                   help="CC-on all-reduce schedule(s), comma list: naive (seal a whole chunk, send, open, "
                        "reduce) and/or pipelined (segments sealed while earlier ones travel)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"measured iterations per variant (with --budget: the fewest). Default: {DEFAULT_STEPS} for one "
                        f"variant; for a comparison (--cc off,on) {COMPARE_DEFAULTS['steps']}, the fewest rounds "
                        "with a 95 %% interval, and unless --budget or --precision is given, measuring goes on "
                        "until every CC-on/CC-off ratio's interval is within "
                        f"±{round(COMPARE_DEFAULTS['precision'] * 100)} %% or {COMPARE_DEFAULTS['budget']:g} s "
                        "have been measured; a --steps given measures exactly that many (no adaptive stop)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="pick the number of measured iterations that fits this many seconds, timed "
                        "from the warm-up (default: exactly --steps)")
    p.add_argument("--precision", type=float, default=None, metavar="FRACTION",
                   help="with --cc off,on and --budget: stop measuring once every CC-on/CC-off ratio's "
                        "95 %% interval is within this fraction of it (0.1: ±10 %%), after --steps "
                        "rounds at least; --budget is then the most it measures (default: measure "
                        "the whole budget)")
    p.add_argument("--warmup", type=int, default=2,
                   help="iterations per variant before measuring (DDP rebuilds its buckets in the "
                        "forward of iteration 1)")
    p.add_argument("--alternate", default="auto", choices=ALTERNATIONS,
                   help="how variants take turns: one iteration each (all models in memory at once), "
                        "or blocks of --block iterations, one model at a time; auto: iteration when "
                        "the models fit in memory together")
    p.add_argument("--block", type=int, default=3, help="iterations per variant per turn with --alternate block")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default: the workload's)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample (language models)")
    p.add_argument("--image-size", type=int, default=None, help="image side in pixels (vision models)")
    p.add_argument("--dtype", default=None, help="parameter dtype: float32, bfloat16 or float16 "
                                                 "(default: the workload's)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the model and the data")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket cap in MiB (default: DDP's 25 MiB, 1 MiB first bucket)")
    p.add_argument("--segment-mb", type=float, default=DEFAULT_SEGMENT_MB,
                   help="pipelining segment of the secure all-reduce, MiB")
    p.add_argument("--chains", type=int, default=0,
                   help="crypto threads per rank (0: CPU cores / local ranks)")
    p.add_argument("--tag", default="segment", choices=["segment", "message"],
                   help="one authentication tag per segment or per ring message")
    p.add_argument("--trust-domains", default="rank", metavar="MAP",
                   help="which ranks share a trust boundary (CC-on: all-reduces plaintext inside a domain, "
                        "sealed across): rank (default: every rank its own), node, or a JSON list of rank lists")
    add_device_options(p)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any rank may wait on a peer")
    p.add_argument("--json", default=None, help="write the results here")
    return p


def check_workload_name(name: str) -> str:
    """``name`` if it is a workload, else :class:`ConfigError` (without importing torch)."""
    if name not in WORKLOAD_NAMES:
        raise ConfigError(f"unknown workload '{name}'; choose one of: {', '.join(WORKLOAD_NAMES)}")
    return name


def workload_from(args: argparse.Namespace):
    """The workload ``args`` ask for (torch and the model's library load here, not at
    import: the command's parent process checks the request with it and launches)."""
    from ccddp.workloads import get_workload

    overrides = {"batch_size": args.batch_size, "seq_len": args.seq_len, "image_size": args.image_size,
                 "dtype": args.dtype, "seed": args.seed}
    return get_workload(args.workload, size=args.size, **{k: v for k, v in overrides.items() if v is not None})


def is_comparison(variants: list[Variant]) -> bool:
    """Whether a launch measures CC-on/CC-off ratios: CC-off and at least one CC-on."""
    return any(v.cc == "off" for v in variants) and len(variants) > 1


def fill_in_steps(args: argparse.Namespace, variants: list[Variant]) -> None:
    """Give ``--steps`` (and, for a comparison, ``--budget`` and ``--precision``) their
    defaults when none of them was given: one variant measures DEFAULT_STEPS iterations; a
    comparison enough rounds for a 95 % interval, then stops once it is within ±10 % or
    the budget is spent. Anything the user gave is kept as given."""
    if args.steps is not None:
        return
    if not is_comparison(variants) or args.budget is not None or args.precision is not None:
        args.steps = COMPARE_DEFAULTS["steps"] if is_comparison(variants) else DEFAULT_STEPS
        return
    args.steps = COMPARE_DEFAULTS["steps"]
    if args.warmup >= 1:   # the budget is timed from the warm-up
        args.budget, args.precision = COMPARE_DEFAULTS["budget"], COMPARE_DEFAULTS["precision"]


def check(args: argparse.Namespace) -> list[Variant]:
    """Refuse what cannot be measured, in the user's words; return the variants. Imports
    nothing heavy: every argument is checked before torch or a model loads."""
    check_workload_name(args.workload)
    if args.dtype is not None and args.dtype not in DTYPE_NAMES:
        raise ConfigError(f"unsupported dtype '{args.dtype}'; choose one of: {', '.join(DTYPE_NAMES)}")
    for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len),
                        ("--image-size", args.image_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    variants = variants_of(args)
    fill_in_steps(args, variants)
    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0")
    if args.budget is not None and args.budget <= 0:
        raise ConfigError("--budget must be a positive number of seconds")
    if args.precision is not None:
        if not 0 < args.precision < 1:
            raise ConfigError(f"--precision is a fraction of the ratio between 0 and 1 (0.1 = ±10 %), "
                              f"got {args.precision:g}")
        if args.budget is None or not any(v.cc == "off" for v in variants) or len(variants) < 2:
            raise ConfigError("--precision needs --budget (the most to measure) and --cc off,on "
                              "(the ratios it watches)")
    if args.block < 1:
        raise ConfigError("--block must be >= 1")
    trust_domains_setting(args.trust_domains)
    check_device_options(args)
    return variants


# -- ccddp bench collectives ---------------------------------------------------------------------

def parse_size(text: str) -> int:
    """``64M`` -> 67108864 bytes (K, M, G are powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in "KMG" else t)
    except ValueError:
        raise ConfigError(f"cannot read size {text!r}; use e.g. 4096, 1M, 64M") from None
    if value <= 0:
        raise ConfigError(f"size must be positive, got {text!r}")
    return int(value * mult)


#: ``--sizes sweep``: 4 KiB to 64 MiB in powers of 4, so the fixed cost of a small op and the
#: bandwidth floor of a large one show in one table (issue 42).
SWEEP_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
SIZE_PRESETS = {"sweep": SWEEP_SIZES}


def expand_sizes(text: str) -> str:
    """``--sizes`` with its presets spelled out (``sweep`` -> :data:`SWEEP_SIZES`); a
    preset may stand beside sizes (``sweep,128M``)."""
    return ",".join(SIZE_PRESETS.get(part.strip().lower(), part.strip()) for part in text.split(","))


def build_collectives_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ccddp bench collectives", add_help=add_help,
        description="Time each collective implementation nccl-tests style: gloo (torch.distributed's "
                    "own, plaintext), ring (plaintext ring), secure-naive (the paper's emulation: seal "
                    "whole chunks) and secure (pipelined AES-GCM ring). The implementations take turns "
                    "call by call; every result is checked; each row shows its paired ratio to the first "
                    "implementation and, for secure rows, the additive floor: the first's time plus the "
                    "row's AES-GCM bytes at this machine's measured rate.")
    p.add_argument("--sizes", default="1M,64M",
                   help=f"comma list of buffer sizes, e.g. 1M,64M; 'sweep' is {SWEEP_SIZES} (the latency "
                        "curve and the bandwidth floor in one table)")
    p.add_argument("--impl", default=None,
                   help="comma list of implementations; the first is the reference of the ratio columns "
                        f"(default: {DEFAULT_IMPLS['cpu']}; {DEFAULT_IMPLS['cuda']} with --device cuda, where "
                        "secure and secure-naive run through the ccddp backend and gloo takes CUDA tensors)")
    p.add_argument("--ops", default="all_reduce", help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES, help="element type")
    p.add_argument("--algorithm", default="ring", choices=["ring", "tree"], help="secure/ring algorithm")
    p.add_argument("--segment-mb", type=float, default=DEFAULT_SEGMENT_MB,
                   help="pipelining and tag unit of 'secure', MiB")
    p.add_argument("--tag", default="segment", choices=["segment", "message"],
                   help="one authentication tag per segment or per ring message")
    p.add_argument("--chains", type=int, default=0, help="crypto threads per rank (0: CPU cores / local ranks)")
    p.add_argument("--allgather", default="per-link", choices=["per-link", "group-key"],
                   help="all-gather keys: per link, or one group key (ciphertext forwarded)")
    p.add_argument("--trust-domains", default="rank", metavar="MAP",
                   help="which ranks share a trust boundary, for the implementation 'secure-domains' (the "
                        "ccddp backend, hierarchical over the domains): rank (every rank its own), node, or a "
                        "JSON list of rank lists such as [[0,1],[2,3]]")
    add_device_options(p)
    p.add_argument("--iters", type=int, default=10, help="measured calls per implementation and size")
    p.add_argument("--warmup", type=int, default=2, help="calls before measuring")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any rank may wait on a peer")
    p.add_argument("--json", default=None, help="write the rows here")
    return p


def trust_domains_setting(text: str):
    """``--trust-domains``: a name (``rank``, ``node``) or a JSON list of rank lists (the
    shape is checked here, without torch; coverage of the group where it is created)."""
    # Bounded before it is parsed (size, nesting, UTF-8: ccddp.crypto.wirejson); no torch.
    from ccddp.crypto.wirejson import parse_json

    text = text.strip()
    if not text.startswith("["):
        if text not in ("rank", "node"):
            raise ConfigError(f"--trust-domains must be rank, node or a JSON list of rank lists, got {text[:40]!r}")
        return text
    try:
        data = text.encode("utf-8", "surrogateescape")   # argv holds non-UTF-8 bytes as surrogates
    except UnicodeEncodeError:
        raise ConfigError("--trust-domains is not UTF-8 text") from None
    value = parse_json(data, what="--trust-domains", max_bytes=1 << 16, max_depth=2)
    if not (isinstance(value, list) and value and all(isinstance(d, list) and d and all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 1 << 31 for r in d) for d in value)):
        raise ConfigError(f"--trust-domains {text[:60]!r} must be a list of non-empty lists of ranks (integers "
                          "from 0), e.g. [[0,1],[2,3]]")
    return value


def check_collectives(args: argparse.Namespace) -> None:
    """``ccddp bench collectives``' arguments, checked without torch (the workers check
    them again with :func:`ccddp.bench.collectives.validate`); fills in ``--impl``'s
    default for ``--device``."""
    check_device_options(args)
    if args.impl is None:
        args.impl = DEFAULT_IMPLS[args.device]
    for op in args.ops.split(","):
        if op not in OPS:
            raise ConfigError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    impls = args.impl.split(",")
    for impl in impls:
        if impl not in (*IMPL_NAMES, BACKEND_IMPL):
            raise ConfigError(f"impl must be one of {', '.join((*IMPL_NAMES, BACKEND_IMPL))}, got {impl!r}")
    if len(set(impls)) != len(impls):
        raise ConfigError(f"--impl lists an implementation twice: {args.impl}")
    if args.device == "cuda":
        for impl in impls:
            if impl not in CUDA_IMPLS:
                raise ConfigError(f"--impl {impl} takes host tensors only; with --device cuda choose from "
                                  f"{', '.join(CUDA_IMPLS)}")
    args.sizes = expand_sizes(args.sizes)
    for size in args.sizes.split(","):
        parse_size(size)
    if args.iters < 1 or args.warmup < 0:
        raise ConfigError("--iters must be >= 1 and --warmup >= 0")
    if args.segment_mb <= 0:
        raise ConfigError(f"--segment-mb must be positive, got {args.segment_mb:g}")
    trust_domains_setting(args.trust_domains)
