"""The Python half of scripts/gpu_check.sh: what the shell does not do well.

    python3 scripts/gpu_check_tools.py env --out env.json [--dry-run] [--site DIR]
        print and write this machine's environment (GPU, driver, CUDA, NCCL, torch, Triton,
        cryptography, Python); exit 2 with one line naming what is missing for the check
        (no GPU, no Triton, cryptography not importable, torch older than 2.11, ...).
    python3 scripts/gpu_check_tools.py arch env.json
        the CUDA compute capability to compile the kernels for (90 without a GPU).
    python3 scripts/gpu_check_tools.py bench --dir DIR --out bench.json
        merge the per-size results of ``ccddp bench channel --device cuda`` into one file,
        with the 64 MiB rows set against the engine's targets.
    python3 scripts/gpu_check_tools.py runs --dir DIR --out cuda-runs.json [--step NAME]
        merge what the collectives-*, train and calibrate steps left in DIR (exit code, last
        line, JSON result, calibrated profile) into one file; print step NAME's results.
    python3 scripts/gpu_check_tools.py has-option COMMAND NAME
        exit 0 if ``ccddp COMMAND`` takes the option --NAME itself (not a longer option that
        starts with it, which argparse would also accept), else 1.
    python3 scripts/gpu_check_tools.py no-gpu -- COMMAND...
        a dry run's stand-in for a command that needs a GPU: run it; its one-line refusal
        for want of a GPU (exit 2) passes, as does exit 0; anything else keeps its status.
    python3 scripts/gpu_check_tools.py summary --steps steps.tsv --out summary.json ...
        every step's command, status, exit code and seconds, as JSON, with the one-line
        command that reruns just the steps that did not pass ("rerun").
    python3 scripts/gpu_check_tools.py plan --sizes 4K,64K,...
        the budget and every step's cap (PLAN: each step's estimate and cap).

Standard library only at module level: it runs before anything else is known to work.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

#: The oldest torch the check is written for (the lent image's).
TORCH_MIN = (2, 11)
#: Rates the engine is meant to reach at 64 MiB on an H100 (GB/s of plaintext).
TARGETS_64M = {"seal": 50.0, "open": 50.0, "seal_pad": 100.0, "open_pad": 100.0}
#: The steps whose results cuda-runs.json gathers, each with the files it writes.
RUN_STEPS = ("collectives-device", "collectives-staged", "train", "calibrate")
#: How a command refuses --device cuda without a GPU (ccddp.bench.devices.require_cuda).
NO_GPU_LINE = re.compile(r"needs a CUDA GPU|no CUDA (GPU|device)", re.IGNORECASE)

#: Per step, on the lent GPU machine (one H100, cold Triton cache): (estimate, cap) in
#: seconds. Not measured (no GPU has run the check yet): estimated from the work each step
#: does (BENCHMARKS.md, "The GPU check's time plan"). A cap is its estimate with a margin
#: of at least 1.5x; the tests step's cap is at least 240 s (35-45 JIT compiles, two
#: 3-process launches, a `ccddp launch`, an NCCL subprocess).
PLAN = {
    "wheels": (5, 30),                 # pip install --no-index of three wheels
    "env": (10, 30),                   # torch import, CUDA init, one AES-GCM round trip
    "kernels": (35, 60),               # 9 kernel variants compiled for the GPU's arch
    "tests": (135, 240),               # the CUDA cases (calibrate and bench 1M: own steps)
    "collectives-device": (25, 45),    # 2 ranks, 64 MiB, gloo beside ccddp
    "collectives-staged": (20, 45),
    "train": (30, 60),                 # bert-base, 1 rank, CC off/on, 8 steps each
    "calibrate": (30, 60),             # calibrate --device cuda --fast
    "bench-4K": (8, 30),               # a process: torch + CUDA init, kernels cached
    "bench-64K": (8, 30),
    "bench-1M": (10, 30),
    "bench-16M": (12, 30),
    "bench-64M": (20, 45),
}
#: A bench size outside the plan (CCDDP_GPU_CHECK_SIZES): the largest bench step's.
PLAN_OTHER_BENCH = PLAN["bench-64M"]
#: What the whole check aims at, and the budget that bounds it: the budget is the sum of
#: the estimates plus a minute of overall slack, which the tests step's margin draws on
#: first (steps run in order; what the budget no longer holds is "not run: out of time",
#: and summary.json's rerun line picks it up).
TARGET_S = 360
BUDGET_S = 420


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:2])


def _try(fn, default=None):
    try:
        return fn()
    except Exception:                          # a probe: any failure is "unknown"
        return default


def _module(name: str) -> tuple[object | None, str | None]:
    """(module, None) or (None, the one-line reason it does not import)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:                     # ImportError, or a broken build raising anything
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def _driver() -> str | None:
    if shutil.which("nvidia-smi"):
        r = _try(lambda: subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20))
        if r is not None and r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    nvml, _ = _module("pynvml")
    if nvml is not None:
        def query():
            nvml.nvmlInit()
            v = nvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        return _try(query)
    return None


def cmd_env(args: argparse.Namespace) -> int:
    env: dict = {"schema": "ccddp.gpu-check-env/1", "dry_run": args.dry_run,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "hostname": platform.node(), "cores": os.cpu_count(), "os": platform.platform(),
                 "python": platform.python_version(), "python_executable": sys.executable,
                 "triton_interpret": os.environ.get("TRITON_INTERPRET"), "wheel_site": args.site}
    stop: list[str] = []            # what makes the check impossible: one line in the end
    warn: list[str] = []            # what makes one step fail, named here first

    torch, why = _module("torch")
    if torch is None:
        stop.append(f"torch is not importable ({why})")
    else:
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if _version_tuple(torch.__version__) < TORCH_MIN:
            stop.append(f"torch {torch.__version__} is older than {'.'.join(map(str, TORCH_MIN))}")
        cuda = _try(torch.cuda.is_available, False)
        env["cuda_available"] = cuda
        env["gpus"] = _try(torch.cuda.device_count, 0) if cuda else 0
        if cuda:
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = props.name
            env["capability"] = f"{props.major}.{props.minor}"
            env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
            env["multiprocessors"] = props.multi_processor_count
            nccl = _try(torch.cuda.nccl.version)      # a tuple; an int in older builds
            env["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
            env["driver"] = _driver()
        elif not args.dry_run:
            stop.append("no CUDA GPU visible to torch (rehearse without one: --dry-run)")
        else:
            env["gpu"] = None
            env["driver"] = _driver()

    triton, why = _module("triton")
    if triton is None:
        stop.append(f"Triton is not importable ({why})")
    else:
        env["triton"] = triton.__version__
        env["triton_file"] = triton.__file__

    crypto, why = _module("cryptography")
    if crypto is None:
        stop.append(f"cryptography is not importable ({why}): prepare wheels with 'bash scripts/gpu_wheels.sh' "
                    "and carry .whl")
    else:
        env["cryptography"] = crypto.__version__
        env["cryptography_file"] = crypto.__file__
        env["cryptography_from_wheel_site"] = bool(args.site) and os.path.abspath(crypto.__file__).startswith(
            os.path.abspath(args.site) + os.sep)
        if _version_tuple(crypto.__version__) < (50,):
            stop.append(f"cryptography {crypto.__version__} is older than 50 (encrypt_into/decrypt_into)")
        else:
            def roundtrip() -> bool:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM

                a = AESGCM(bytes(32))
                return a.decrypt(bytes(12), a.encrypt(bytes(12), b"gpu check", b""), b"") == b"gpu check"
            ok = _try(roundtrip, False)
            env["cryptography_aesgcm_ok"] = ok
            if not ok:
                stop.append("cryptography imports but its AESGCM does not work (its cffi or Rust part)")

    ccddp, why = _module("ccddp")
    if ccddp is None:
        stop.append(f"ccddp is not importable from src/ ({why})")
    else:
        env["ccddp_file"] = ccddp.__file__
    env["commit"] = _try(lambda: subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                                timeout=10).stdout.strip() or None)
    # A copied tree may come without .git: the engine's sources name the version that ran.
    device = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "ccddp", "crypto", "device")
    env["device_engine_sha256"] = _try(lambda: {
        name: hashlib.sha256(open(os.path.join(device, name), "rb").read()).hexdigest()[:16]
        for name in ("kernels.py", "engine.py")})
    for name in ("numpy", "pytest", "hypothesis", "pytest_timeout", "xdist", "cffi", "pycparser"):
        mod, why = _module(name)
        env[name] = getattr(mod, "__version__", "present") if mod is not None else None
        if mod is None and name in ("numpy",):
            stop.append(f"{name} is not importable ({why})")
        elif mod is None and name in ("pytest", "hypothesis"):
            warn.append(f"{name} is not importable: the tests step will fail")
    vectors = os.environ.get("CCDDP_GCM_VECTORS")
    if vectors:
        env["gcm_vectors"] = vectors if os.path.isdir(os.path.join(vectors, "ciphers", "AES", "GCM")) else None
    else:
        mod, _ = _module("cryptography_vectors")
        env["gcm_vectors"] = os.path.dirname(mod.__file__) if mod is not None else None
    if env["gcm_vectors"] is None:
        warn.append("NIST GCM vectors not found (cryptography_vectors, or CCDDP_GCM_VECTORS): "
                    "tests/test_device_aead.py will not import")
    env["warnings"] = warn
    env["missing"] = stop

    for key in ("gpu", "capability", "gpu_memory_gib", "driver", "torch", "torch_cuda", "nccl", "triton",
                "cryptography", "cryptography_file", "python", "python_executable", "gcm_vectors", "commit"):
        if key in env:
            print(f"  {key:20s} {env[key]}")
    for w in warn:
        print(f"  warning: {w}")
    with open(args.out, "w") as f:
        json.dump(env, f, indent=2)
    if stop:
        print("gpu_check: cannot run: " + "; ".join(stop))
        return 2
    return 0


def cmd_arch(args: argparse.Namespace) -> int:
    with open(args.env) as f:
        cap = json.load(f).get("capability")
    print(cap.replace(".", "") if cap else "90")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Per size: the command's last line, exit code, and its JSON if it measured."""
    sizes = []
    for size in args.sizes.split(","):
        row: dict = {"size": size, "rc": None, "measured": False, "line": None, "result": None}
        rc_path, out_path = (os.path.join(args.dir, f"bench-{size}.{ext}") for ext in ("rc", "out"))
        if os.path.exists(rc_path):
            with open(rc_path) as f:
                row["rc"] = int(f.read().strip() or -1)
        if os.path.exists(out_path):
            with open(out_path, errors="replace") as f:
                lines = [line for line in f.read().splitlines() if line.strip()]
            row["line"] = lines[-1] if lines else None
        json_path = os.path.join(args.dir, f"bench-{size}.json")
        if os.path.exists(json_path):
            with open(json_path) as f:
                row["result"] = json.load(f)
            row["measured"] = True
        sizes.append(row)
    out: dict = {"schema": "ccddp.gpu-check-bench/1", "sizes": sizes, "targets_64M": None}
    at_64m = next((r["result"] for r in sizes if r["measured"] and r["result"]["bytes"] == 64 << 20), None)
    if at_64m is not None:
        rows = at_64m["rows"]
        out["targets_64M"] = {name: {"gbps": rows[name]["gbps"], "target_gbps": target,
                                     "met": rows[name]["gbps"] >= target, "vs_copy": rows[name]["vs_copy"]}
                              for name, target in TARGETS_64M.items()}
        out["targets_64M"]["copy"] = {"gbps": rows["copy"]["gbps"]}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    for r in sizes:
        if r["measured"]:
            rows = r["result"]["rows"]
            print(f"  {r['size']:>4s}: " + ", ".join(f"{k} {rows[k]['gbps']:.1f}" for k in
                                                      ("copy", "seal", "open", "seal_pad", "open_pad")) + " GB/s")
        else:
            print(f"  {r['size']:>4s}: not measured (exit {r['rc']}): {r['line']}")
    return 0


def _step_files(directory: str, name: str) -> dict:
    """A step's exit code and last output line, and its JSON result if it wrote one."""
    row: dict = {"rc": None, "line": None, "measured": False, "result": None}
    for ext in ("rc", "out"):
        path = os.path.join(directory, f"{name}.{ext}")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text = f.read()
            if ext == "rc":
                row["rc"] = int(text.strip() or -1)
            else:
                lines = [line for line in text.splitlines() if line.strip()]
                row["line"] = lines[-1] if lines else None
    path = os.path.join(directory, f"{name}.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                row["result"] = json.load(f)
            row["measured"] = True
        except (OSError, json.JSONDecodeError) as e:   # a result cut off mid-write
            row["line"] = f"{name}.json unreadable: {e}"
    return row


def _run_lines(name: str, row: dict) -> list[str]:
    """What one step measured, a line per result."""
    result = row["result"]
    if not row["measured"]:
        return [f"  {name}: not measured (exit {row['rc']}): {row['line']}"]
    if name.startswith("collectives"):
        return [f"  {name}: {r['impl']} ({r.get('backend')}, {r.get('device')}) {r['bytes'] >> 20} MiB "
                f"{r['op']}: {r['time_us'] / 1e3:.1f} ms, busbw {r['busbw_gbps']:.2f} GB/s"
                + (f", {r['paired_ratios']['gloo']:.2f}x gloo" if "gloo" in r.get("paired_ratios", {}) else "")
                + (f", {r['wrong']} WRONG" if r["wrong"] else "") for r in result.get("rows", [])]
    if name == "train":
        return [f"  train: {r['workload']} {r['variant']} ({r.get('backend')}, {r.get('device')}): median "
                f"{r['summary']['total_ms']:.1f} ms/iter, bounce {r['summary']['bounce_ms']:.1f} ms"
                for r in result.get("runs", [result])]
    return [f"  {name}: written ({', '.join(sorted(result)[:6])} ...)"]


def cmd_runs(args: argparse.Namespace) -> int:
    steps = {}
    for name in RUN_STEPS:
        row = _step_files(args.dir, name)
        profile = os.path.join(args.dir, f"{name}.toml")
        if os.path.exists(profile):
            with open(profile, errors="replace") as f:
                row["profile_toml"] = f.read()
        if row["rc"] is not None or row["measured"]:
            steps[name] = row
    with open(args.out, "w") as f:
        json.dump({"schema": "ccddp.gpu-check-runs/1", "steps": steps}, f, indent=2)
    for name, row in steps.items():
        if args.step in (None, name):
            for line in _run_lines(name, row):
                print(line)
    return 0


def cmd_has_option(args: argparse.Namespace) -> int:
    from ccddp.cli import build_parser

    parser = build_parser([args.command])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return 0 if f"--{args.name}" in commands.choices[args.command]._option_string_actions else 1


def cmd_no_gpu(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("gpu_check: no-gpu needs a command after --", file=sys.stderr)
        return 2
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == 2 and len(errors) == 1 and NO_GPU_LINE.search(errors[0]):
        print(f"gpu_check: dry run, its arguments accepted: {errors[0]}")
        return 0
    return done.returncode


def step_plan(name: str) -> tuple[int, int]:
    """(estimate, cap) of a step, seconds."""
    if name in PLAN:
        return PLAN[name]
    if name.startswith("bench-"):
        return PLAN_OTHER_BENCH
    raise KeyError(f"no step {name} in the plan")


def cmd_plan(args: argparse.Namespace) -> int:
    """``NAME CAP`` lines for the shell: the budget, then every step (bench at --sizes)."""
    names = [n for n in PLAN if not n.startswith("bench-")] + [f"bench-{s}" for s in args.sizes.split(",") if s]
    print(f"budget {BUDGET_S}")
    for n in names:
        print(f"{n} {step_plan(n)[1]}")
    return 0


def rerun_line(steps: list[dict], dry_run: bool, env_prefix: str = "") -> str | None:
    """One command that runs again just the steps that failed, timed out or were not run
    (wheels and env always run first), or None when nothing needs it."""
    again = [s["name"] for s in steps
             if s["name"] not in ("wheels", "env") and (s["status"] in ("failed", "timeout") or (
                 s["status"] == "skipped" and (s["note"] or "").startswith("not run")))]
    if not again:
        return None
    return " ".join(p for p in [env_prefix, "bash scripts/gpu_check.sh", "--dry-run" if dry_run else "",
                                "--only", ",".join(again)] if p)


def cmd_summary(args: argparse.Namespace) -> int:
    steps = []
    if os.path.exists(args.steps):
        with open(args.steps) as f:
            for line in f:
                if not line.strip():
                    continue
                name, status, rc, seconds, timeout, note, command = line.rstrip("\n").split("\t", 6)
                steps.append({"name": name, "status": status, "rc": int(rc) if rc else None,
                              "seconds": int(seconds), "timeout_s": int(timeout) if timeout else None,
                              "note": note or None, "command": command})
    summary = {"schema": "ccddp.gpu-check/1", "dry_run": args.dry_run, "complete": args.complete,
               # A step skipped by choice (not selected, no wheels to install) is no failure;
               # one that could not run (out of time, after a failed preflight) is.
               "ok": args.complete and all(s["status"] == "ok" or (s["status"] == "skipped" and not (
                   s["note"] or "").startswith("not run")) for s in steps),
               "elapsed_s": args.elapsed, "budget_s": args.budget, "target_s": TARGET_S,
               "estimate_s": sum(_try(lambda n=s["name"]: step_plan(n)[0], 0) for s in steps if s["status"] != "skipped"
                                 or not (s["note"] or "").startswith("not selected")),
               "rerun": rerun_line(steps, args.dry_run, args.rerun_env or "") if args.complete else None,
               "steps": steps,
               "files": sorted(os.listdir(os.path.dirname(os.path.abspath(args.out))))}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="helpers of scripts/gpu_check.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env", help="print and write the environment; exit 2 naming what is missing")
    p.add_argument("--out", required=True)
    p.add_argument("--site", default=None, help="the folder the carried wheels were installed into")
    p.add_argument("--dry-run", action="store_true", help="no GPU needed")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("arch", help="compute capability from env.json, e.g. 90")
    p.add_argument("env")
    p.set_defaults(func=cmd_arch)
    p = sub.add_parser("bench", help="merge per-size bench results")
    p.add_argument("--dir", required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("runs", help="merge the collectives, train and calibrate results")
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step", default=None, help="print this step's results (default: every step's)")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("has-option", help="whether a ccddp command takes an option")
    p.add_argument("command")
    p.add_argument("name", help="the option without its dashes, e.g. device")
    p.set_defaults(func=cmd_has_option)
    p = sub.add_parser("no-gpu", help="a dry run's stand-in for a command that needs a GPU")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_no_gpu)
    p = sub.add_parser("summary", help="write summary.json from the steps file")
    p.add_argument("--steps", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--elapsed", type=int, required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--complete", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--rerun-env", default=None, help="VAR=VALUE words the rerun line must start with")
    p.set_defaults(func=cmd_summary)
    p = sub.add_parser("plan", help="the budget and each step's cap, as NAME SECONDS lines")
    p.add_argument("--sizes", required=True)
    p.set_defaults(func=cmd_plan)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
