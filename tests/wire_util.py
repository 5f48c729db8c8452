"""What processes wrote to their sockets, as a host attacker sees it, and torchrun launches
that record it.

``wiretap.c`` (built here with the system C compiler) is preloaded into every process of
a launch; it appends every byte written to any socket -- gloo's links, the rendezvous
store, anything else -- to a file per process. A test then searches those bytes for
markers of model data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dist_util import child_env

HERE = Path(__file__).parent
SRC = HERE.parent / "src"
SECRET_HEX = "9c41d0e2b7f35a86c1e4d92b07a3f6185de0c4b2a97f3e6d5c8b1a0f2e4d6c83"


def build_wiretap(out_dir: Path) -> Path:
    """Compile the socket recorder into ``out_dir``; returns the shared library."""
    lib = out_dir / "wiretap.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(HERE / "wire" / "wiretap.c"), "-ldl"],
                   check=True, capture_output=True, text=True)
    return lib


def torchrun(args: list[str], *, nproc: int = 2, wiretap: Path | None = None, wire_dir: Path | None = None,
             env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node nproc ARGS`` with this checkout's ccddp; with
    ``wiretap``, every process's socket writes go to files in ``wire_dir``."""
    full = child_env()
    full.setdefault("CCDDP_GROUP_SECRET", SECRET_HEX)
    full["OMP_NUM_THREADS"] = "1"
    if wiretap is not None:
        full["LD_PRELOAD"] = str(wiretap)
        full["CCDDP_WIRE_DIR"] = str(wire_dir)
    full.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)


def wire_bytes(wire_dir: Path) -> bytes:
    """Everything the recorded processes wrote to sockets, concatenated."""
    return b"".join(p.read_bytes() for p in sorted(wire_dir.glob("wire.*")))


def found(markers: list[bytes], blob: bytes) -> list[bytes]:
    """The markers that occur in ``blob``."""
    return [m for m in markers if m in blob]


def json_rows(out: str) -> list[dict]:
    """The ranks' JSON objects (``{"rank": ...}``) in a launcher's ``out``: two ranks'
    lines can meet on one line of its output."""
    rows, decoder = [], json.JSONDecoder()
    for line in out.splitlines():
        at = line.find('{"rank"')
        while at >= 0:
            obj, end = decoder.raw_decode(line, at)
            rows.append(obj)
            at = line.find('{"rank"', end)
    return rows
