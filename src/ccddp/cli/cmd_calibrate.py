"""``ccddp calibrate``: measure this machine with micro-benchmarks and write a hardware
profile (the ``local`` profile of the performance model) that any ``--profile`` takes.

Only micro-benchmarks run (crypto per-call cost and per-byte rate fitted separately
over a sweep of sizes, with their standard errors, and a sweep of chains; gloo P2P latency and
bandwidth, reduction, copy, optimizer and matmul rates, the pipelined engine's
per-message cost); training runs never feed the profile, so ``ccddp validate`` can test
the model against them honestly.

With ``--device cuda`` it measures a GPU instead: the device engine's per-call cost and
per-byte rate (a sweep of sizes through the code of ``ccddp bench channel --device cuda``,
fitted as ``--device-sweep`` fits saved results), OpenSSL on the same machine's host
(``cpu_crypto_gbps``), and the pinned staging copies (``staging_d2h_gbps``,
``staging_h2d_gbps``, ``staging_copy_us``) from which ``ccddp.sim.placement`` tells
whether a frame is cheaper sealed on the device or staged through host OpenSSL. Every
other field is ``--base``'s; the JSON lists the fields measured (``measured_fields``).

Example::

    ccddp calibrate --out local.toml --json calibrate.json
    ccddp simulate --profile local.toml --workload resnet50 --gpus 2,4
    ccddp calibrate --device cuda --base h100-cc --out gpu.toml --json gpu.json
"""

from __future__ import annotations

import argparse
import json
import math

from ccddp.errors import ConfigError

SUMMARY = "micro-benchmark this machine and write a hardware profile (TOML)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help=SUMMARY,
        description="Run micro-benchmarks on this machine (crypto, P2P, reduction, copy, "
                    "optimizer, compute, engine overhead) and write a complete hardware "
                    "profile for the performance model.")
    p.add_argument("--out", required=True, metavar="PATH", help="profile to write (.toml)")
    p.add_argument("--world-size", type=int, default=2,
                   help="local ranks for the P2P micro-benchmarks (default: 2)")
    p.add_argument("--name", default="local", help="profile name (default: local)")
    p.add_argument("--fast", action="store_true",
                   help="fewer sizes and repetitions (seconds, less accurate; for tests)")
    p.add_argument("--json", metavar="PATH",
                   help="also write every measurement and the model checks as JSON")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: this host's micro-benchmarks; cuda: this GPU's AES-GCM engine and "
                        "pinned host staging copies, other fields from --base")
    p.add_argument("--device-sweep", nargs="+", metavar="JSON",
                   help="instead of measuring this host: fill a GPU profile's crypto fields "
                        "from `ccddp bench channel --device cuda --size S --json` results at "
                        "two or more sizes (with --base)")
    p.add_argument("--base", default="h100-cc",
                   help="with --device cuda or --device-sweep: the profile whose other fields "
                        "are kept (default: h100-cc)")
    p.set_defaults(func=run)


def run_device_sweep(args: argparse.Namespace) -> int:
    from ccddp.config import MAX_RESULTS_BYTES, RESULTS_DEPTH, read_json
    from ccddp.bench.calibrate_fit import device_profile
    from ccddp.sim.profile import load_profile, write_profile

    results = []
    for path in args.device_sweep:
        results.append(read_json(path, what=f"{path}", max_bytes=MAX_RESULTS_BYTES, max_depth=RESULTS_DEPTH))
    for path, r in zip(args.device_sweep, results):
        if not isinstance(r, dict) or "seal" not in (r.get("rows") or {}):
            raise ConfigError(f"{path} is not a `ccddp bench channel --device cuda --json` result")
    base = load_profile(args.base)
    d = device_profile(base, results)
    d["name"] = args.name if args.name != "local" else base.name
    try:
        write_profile(d, args.out, header=[f"{d['name']}: {base.name} with its crypto measured "
                                           f"by a device sweep ({len(results)} sizes)."])
    except OSError as e:
        raise ConfigError(f"cannot write {args.out}: {e.strerror}") from None
    for key in ("crypto_op_us", "enc_gbps", "dec_gbps", "xor_gbps"):
        rec = d[key]
        print(f"{key} = {rec.value:g}" + (f" +- {rec.stderr:g}" if rec.stderr else "")
              + f"  ({rec.source.value})")
    print(f"wrote {args.out}")
    return 0


def check_cuda_present() -> None:
    """Refuse ``--device cuda`` in one line where the driver reports no CUDA device, before
    torch and the benchmarks load."""
    from ccddp.bench.machine import cuda_device_count

    if cuda_device_count() == 0:
        raise ConfigError("calibrate --device cuda: no CUDA device here (no driver, no GPU, or "
                          "CUDA_VISIBLE_DEVICES hides them); run it on the GPU machine, or fit saved "
                          "results with --device-sweep")


def run_device(args: argparse.Namespace) -> int:
    """``--device cuda``: measure the engine and staging, write the profile (and JSON)."""
    from rich.console import Console

    from ccddp.bench.calibrate import calibrate_device
    from ccddp.bench.calibrate_fit import records_json
    from ccddp.sim.profile import write_profile

    name = args.name if args.name != "local" else None
    with Console(stderr=True).status("calibrating the device") as status:
        result = calibrate_device(args.device, fast=args.fast, base=args.base, name=name,
                                  progress=lambda m: status.update(f"calibrating: {m}"))
    try:
        write_profile(result["profile"], args.out, header=result["header"])
    except OSError as e:
        raise ConfigError(f"cannot write {args.out}: {e.strerror}") from None
    print(f"{result['gpu']}: measured {len(result['measured_fields'])} fields of {result['base']} "
          f"in {result['seconds']:.0f} s")
    for key in result["measured_fields"]:
        rec = result["profile"][key]
        print(f"  {key} = {rec.value:g}" + (f" +- {rec.stderr:g}" if rec.stderr else ""))
    print(f"wrote {args.out}")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(_finite({**result, "profile": records_json(result["profile"])}), f, indent=2)
        except OSError as e:
            raise ConfigError(f"cannot write {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}")
    return 0


#: Other processes taking this share of the CPU (or, without that measure, a 1-minute load
#: average of this share of the cores before calibrate started) make a run "under load".
LOADED_SHARE = 0.10


def load_line(load: dict | None, checks: list[dict]) -> str | None:
    """Whether the model check ran under load, with the numbers (``load``: a
    :class:`ccddp.bench.machine.LoadMeter` record), in one line; None without a record."""
    if not load:
        return None
    cores, share, before = load.get("cores") or 1, load.get("others_share"), load.get("load_before")
    errors = [r["error"] for r in checks if isinstance(r.get("error"), (int, float))]
    span = f" ({min(errors):+.0%} to {max(errors):+.0%})" if errors else ""
    numbers = ", ".join(x for x in (
        f"other processes took {share:.0%} of the CPU" if share is not None else None,
        f"load average {before[0]:g} (1 min) on {cores} cores before it started" if before else None) if x)
    loaded = share >= LOADED_SHARE if share is not None else bool(before) and before[0] >= LOADED_SHARE * cores
    if loaded:
        return (f"The model check ran under load: {numbers}. The measured times include that contention, so its "
                f"errors{span} say as much about the load as about the model: calibrate again on a quiet machine.")
    return f"The model check ran on a quiet machine: {numbers or 'no load measure available'}."


def _finite(x):
    """JSON has no infinity: write it as a string."""
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    if not str(args.out).endswith(".toml"):
        raise ConfigError(f"--out must name a .toml file, got {args.out!r}")
    if args.device_sweep:
        if args.device != "cpu":
            raise ConfigError("--device-sweep fits saved results and measures nothing: leave out --device")
        return run_device_sweep(args)
    if args.device == "cuda":
        check_cuda_present()
        return run_device(args)
    from rich.console import Console
    from rich.table import Table

    from ccddp.bench.calibrate import calibrate
    from ccddp.bench.calibrate_fit import records_json
    from ccddp.sim.profile import write_profile

    err = Console(stderr=True)
    with err.status("calibrating") as status:
        result = calibrate(args.world_size, fast=args.fast, name=args.name,
                           progress=lambda m: status.update(f"calibrating: {m}"))
    try:
        write_profile(result["profile"], args.out, header=result["header"])
    except OSError as e:
        raise ConfigError(f"cannot write {args.out}: {e.strerror}") from None
    p = {k: getattr(v, "value", v) for k, v in result["profile"].items()}
    t = Table(title=f"ccddp calibrate: {args.world_size} local ranks, "
                    f"{result['seconds']:.0f} s", title_justify="left")
    t.add_column("field")
    t.add_column("value", justify="right")
    rec = result["profile"]

    def shown(key: str, unit: str) -> str:
        se = getattr(rec[key], "stderr", None)
        return f"{p[key]:g}" + (f" +- {se:g}" if se else "") + f" {unit}".rstrip()

    for key, unit in (("enc_gbps", "GB/s"), ("dec_gbps", "GB/s"), ("crypto_op_us", "us"),
                      ("link_gbps", "GB/s"), ("link_latency_us", "us"),
                      ("reduce_gbps", "GB/s"), ("segment_overhead_us", "us"),
                      ("pcie_gbps", "GB/s"), ("optimizer_gbps", "GB/s"),
                      ("compute_tflops", "TFLOP/s"), ("envelope_chains", "chains"),
                      ("host_cores", "")):
        t.add_row(key, shown(key, unit))
    Console(width=120).print(t)
    c = Table(title="model check: measured all-reduces vs the calibrated model "
                    "(fitted: a profile field was solved from that number)", title_justify="left")
    for col in ("impl", "bytes", "measured ms", "model ms", "error", "measured CPU ms",
                "model CPU ms", "fitted"):
        c.add_column(col, justify="left" if col in ("impl", "fitted") else "right")
    for row in result["checks"]:
        c.add_row(row["impl"], str(row["bytes"]), f"{row['measured_ms']:.1f}",
                  f"{row['model_ms']:.1f}", f"{row['error']:+.0%}",
                  f"{row['measured_cpu_ms']:.1f}", f"{row['model_cpu_ms']:.1f}", row["fitted"])
    Console(width=120).print(c)
    line = load_line(result.get("load"), result["checks"])
    if line:
        print(line)
    print(f"wrote {args.out}")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(_finite({**result, "profile": records_json(result["profile"])}),
                          f, indent=2)
        except OSError as e:
            raise ConfigError(f"cannot write {args.json}: {e.strerror}") from None
        print(f"wrote {args.json}")
    return 0
