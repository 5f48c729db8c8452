"""Compile the device AES-GCM engine's Triton kernels for a GPU architecture without a
GPU, and report what ptxas says of each: registers per thread and spills. A compile
check, not a speed: it shows the kernels build for the target and fit its registers.

    python scripts/compile_device_kernels.py --arch 90 --json kernels-sm90.json

Needs Triton's CUDA backend (it ships ptxas) and nothing else of ccddp's dependencies: the
kernels module is loaded from its file and the engine's launch constants are read from its
source, so neither torch nor cryptography is imported (a bare venv with one Triton version
can check the kernels against it). Runs with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: this compiles the kernels, it does not interpret them")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

DEVICE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "ccddp", "crypto", "device")


def _load_kernels():
    """ccddp.crypto.device.kernels from its file: importing the package would import the
    engine, hence torch and cryptography; the kernels need only Triton."""
    spec = importlib.util.spec_from_file_location("ccddp_device_kernels", os.path.join(DEVICE, "kernels.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # Triton reads a kernel's globals through its module
    spec.loader.exec_module(module)
    return module


def _engine_constants(*names: str) -> list[int]:
    """Module-level integer constants of engine.py, read from its source (not imported)."""
    with open(os.path.join(DEVICE, "engine.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = {}
    for node in tree.body:
        for t in node.targets if isinstance(node, ast.Assign) else ():
            if isinstance(t, ast.Name) and t.id in names:
                try:
                    found[t.id] = ast.literal_eval(node.value)
                except ValueError:          # an expression: reported below
                    pass
    missing = [n for n in names if not isinstance(found.get(n), int)]
    if missing:
        sys.exit(f"engine.py has no integer literal for {', '.join(missing)}: update {__file__}")
    return [found[n] for n in names]


kernels = _load_kernels()
FINISH_TILES, TILE_BLOCKS_GPU, WARPS_GPU = _engine_constants("FINISH_TILES", "TILE_BLOCKS_GPU", "WARPS_GPU")

PTRS = {"desc_ptr": "*i64", "src_ptr": "*u8", "dst_ptr": "*u8", "aad_ptr": "*u8", "pad_ptr": "*u8",
        "rk_ptr": "*u32", "te_ptr": "*u32", "p4_ptr": "*u64", "q4_ptr": "*u64", "r4_ptr": "*u64",
        "part_ptr": "*u64", "ok_ptr": "*i32", "max_tiles": "i32"}


def signature(fn, constexprs: dict) -> dict:
    names = fn.arg_names
    return {n: ("constexpr" if n in constexprs else PTRS[n]) for n in names}


def variants() -> list[tuple[str, object, dict, int]]:
    b, log_b = TILE_BLOCKS_GPU, TILE_BLOCKS_GPU.bit_length() - 1
    out = []
    for seal in (True, False):
        for pad in (False, True):
            out.append((f"gcm_pass seal={seal} pad={pad}", kernels.gcm_pass,
                        {"SEAL": seal, "USE_PAD": pad, "B": b, "LOG_B": log_b}, WARPS_GPU))
        out.append((f"gcm_finish seal={seal}", kernels.gcm_finish,
                    {"SEAL": seal, "B": b, "T": FINISH_TILES, "LOG_T": FINISH_TILES.bit_length() - 1}, 4))
    for pad in (False, True):
        out.append((f"ctr_open pad={pad}", kernels.ctr_open, {"USE_PAD": pad, "B": b}, WARPS_GPU))
    out.append(("keystream", kernels.keystream, {"B": b}, WARPS_GPU))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas-blackwell")
    if not os.path.exists(ptxas):
        ptxas = ptxas.removesuffix("-blackwell")
    rows = []
    for name, fn, consts, warps in variants():
        compiled = triton.compile(ASTSource(fn=fn, signature=signature(fn, consts), constexprs=consts),
                                  target=GPUTarget("cuda", args.arch, 32), options={"num_warps": warps})
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(compiled.asm["ptx"])
        report = subprocess.run([ptxas, "-v", "--gpu-name", f"sm_{args.arch}a" if args.arch >= 90 else
                                 f"sm_{args.arch}", f.name, "-o", os.devnull], capture_output=True, text=True)
        os.unlink(f.name)
        text = report.stderr
        regs = re.search(r"Used (\d+) registers", text)
        spills = re.search(r"(\d+) bytes spill stores", text)
        rows.append({"kernel": name, "num_warps": warps, "registers": int(regs.group(1)) if regs else None,
                     "spill_store_bytes": int(spills.group(1)) if spills else None})
        print(f"{name:32s} warps {warps}  registers {rows[-1]['registers']}  spills {rows[-1]['spill_store_bytes']} B")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "triton": triton.__version__, "kernels": rows}, f, indent=2)
    return 0 if all(r["registers"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
