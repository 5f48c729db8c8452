"""Launches local ranks through ``torch.distributed.run`` (torchrun).

Commands that "launch N local ranks themselves" call :func:`torchrun`; the same worker
modules run unchanged under a user's own multi-node ``torchrun``.

Example::

    torchrun("ccddp.bench.collectives_worker", ["--sizes", "1M"], nproc=2)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret
from ccddp.errors import CCDDPError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(extra: dict | None = None) -> dict:
    """Environment for local workers: a fresh group secret unless the user set one."""
    env = dict(os.environ)
    if not env.get(ENV_SECRET) and not env.get(ENV_SECRET_FILE):
        env[ENV_SECRET] = GroupSecret.generate().value.hex()
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def torchrun(module: str, args: list[str], nproc: int, *, timeout_s: float = 3600, env: dict | None = None,
             nnodes: int = 1, node_rank: int = 0, master_port: int | None = None, quiet: bool = False) -> None:
    """Run ``python -m module args`` on ``nproc`` local ranks; raise :class:`CCDDPError` with
    the workers' one-line reason if any exits non-zero."""
    if nproc < 1:
        raise CCDDPError(f"world size must be >= 1, got {nproc}")
    port = master_port or free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
           "--max-restarts=0", "-m", module, *args]
    proc = subprocess.run(cmd, env=env or job_env(), timeout=timeout_s, text=True,
                          stdout=None if not quiet else subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise CCDDPError(f"{module} failed on {nproc} ranks: {reason(proc.stderr)}")


def reason(stderr: str) -> str:
    """The most telling line of a failed run's stderr: a ccddp error if there is one, else
    a rank the kernel killed (SIGKILL: almost always its out-of-memory killer)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]

    def first(*markers: str) -> str | None:
        for marker in markers:
            for ln in lines:
                if marker in ln:
                    return ln.split("]:", 1)[-1].strip()[:500]
        return None

    found = first("ccddp: error:", "IntegrityError", "ConfigError", "PeerTimeoutError")
    if found:
        return found
    killed = re.search(r"failed \(exitcode: -9\) local_rank: (\d+)", stderr or "")
    if killed:
        return (f"local rank {killed.group(1)} was killed with SIGKILL, most likely by the kernel's "
                "out-of-memory killer: use fewer ranks, a smaller batch or --dtype bfloat16, "
                "or the pipelined schedule")
    return first("Error:") or (lines[-1][:500] if lines else "no output")
