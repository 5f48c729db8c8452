"""Launches local ranks through ``torch.distributed.run`` (torchrun).

Commands that "launch N local ranks themselves" call :func:`torchrun`; the same worker
modules run unchanged under a user's own multi-node ``torchrun``. The agent process runs
torchrun's own ``main`` through :data:`AGENT` (``ccddp.bench.agent``), which only adds
imports without the cycle collector (:mod:`ccddp.startup`) and an exit without the
interpreter's teardown once torchrun has returned.

An interrupted command (Ctrl-C, SIGTERM, SIGHUP, or the launch's own timeout) ends every
rank before it returns: torchrun runs in a session of its own, so the command decides how
it stops -- SIGTERM to torchrun, which passes it to every rank's process group (the ranks
leave SIGTERM at its default and exit at once), then SIGKILL to torchrun and every rank
still alive after a grace period.

Example::

    torchrun("ccddp.bench.collectives", ["--sizes", "1M"], nproc=2)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping

from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret
from ccddp.errors import CCDDPError
from ccddp.launched import ENV_WORLD_SIZE


#: The module that runs torchrun (``torch.distributed.run.main``) for every launch of ccddp's.
AGENT = "ccddp.bench.agent"

#: torchrun takes every option's default from a ``PET_<OPTION>`` variable
#: (torch/distributed/argparse_util.py): ``PET_STANDALONE=1`` or ``PET_RDZV_BACKEND=c10d``
#: would switch a launch to a dynamic rendezvous, which unpickles what it reads from the
#: host's store. No launch of ccddp's passes one to the agent (:func:`agent_environment`).
PET_PREFIX = "PET_"

#: ``ccddp.comm.settings.SETTINGS_ENV`` (not imported: ``ccddp.comm`` loads torch, which a
#: command's parent does not need before its ranks start).
SETTINGS_ENV = "CCDDP_SETTINGS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(extra: dict | None = None) -> dict:
    """Environment for local workers (the group secret is not in it: :func:`torchrun`
    hands it over, see :func:`secret_handoff`)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def agent_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without its ``PET_*`` variables: what the agent may read. Every option of a
    launch of ccddp's is on its command line (``ccddp launch`` turns the user's ``PET_*``
    variables into options first and checks them as such)."""
    return {k: v for k, v in env.items() if not k.startswith(PET_PREFIX)}


def torchrun(module: str, args: list[str], nproc: int, *, timeout_s: float = 3600, env: dict | None = None,
             nnodes: int = 1, node_rank: int = 0, master_addr: str | None = None, master_port: int | None = None,
             quiet: bool = False) -> None:
    """Run ``python -m module args`` on ``nproc`` local ranks; raise :class:`CCDDPError` with
    the workers' one-line reason if any exits non-zero. ``master_addr``/``master_port``:
    node 0's rendezvous address (default: this machine, 127.0.0.1, and a free port)."""
    if nproc < 1:
        raise CCDDPError(f"world size must be >= 1, got {nproc}")
    port = master_port or free_port()
    cmd = [sys.executable, "-m", AGENT, f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           f"--node-rank={node_rank}", f"--master-addr={master_addr or '127.0.0.1'}", f"--master-port={port}",
           "--max-restarts=0", "-m", module, *args]
    env = dict(env or job_env())
    env[ENV_WORLD_SIZE] = str(nproc * nnodes)   # what every rank checks its WORLD_SIZE against
    if env.get(SETTINGS_ENV, "").strip():
        # The ranks of ccddp's commands build their groups from the command's options; a
        # user who exported CCDDP_SETTINGS for their scripts must not think it measured.
        print(f"ccddp: warning: {SETTINGS_ENV} is set but not used: this command takes its collective settings "
              f"from its own options (see its --help); {SETTINGS_ENV} is for scripts on the ccddp backend",
              file=sys.stderr, flush=True)
    # The secret never enters an environment block (/proc/<pid>/environ of torchrun, the
    # ranks and whatever they start): the user's CCDDP_GROUP_SECRET is taken out of the
    # ranks' environment, else a fresh one is made unless a file already holds it.
    given = env.pop(ENV_SECRET, None)
    secret = GroupSecret.from_hex(given) if given else None if env.get(ENV_SECRET_FILE) else GroupSecret.generate()
    with contextlib.ExitStack() as stack:
        if secret is not None:
            env[ENV_SECRET_FILE] = stack.enter_context(secret_handoff(secret))
        done = supervised(cmd, env, timeout_s=timeout_s, stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise CCDDPError(f"the run on {nproc} local ranks failed: {reason(done.stderr)}")


@contextlib.contextmanager
def secret_handoff(secret) -> Iterator[str]:
    """A path the ranks read the group secret from, valid while the ``with`` block runs:
    ``/proc/<this pid>/fd/N`` of a sealed memfd (in this process's memory only: never in
    an environment block, never on a disk the host could read), else (no memfd) a 0400
    file in a fresh 0700 directory, removed at the end. Either way a process of the same
    user can read it while the launch runs, as it could read the ranks' memory."""
    text = secret.value.hex().encode()
    if hasattr(os, "memfd_create"):
        import fcntl

        fd = os.memfd_create("ccddp-group-secret", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, text)
            os.fchmod(fd, 0o400)
            # Sealed: nothing that opens it can change the secret the next rank reads.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE)
            yield f"/proc/{os.getpid()}/fd/{fd}"
        finally:
            os.close(fd)
        return
    where = tempfile.mkdtemp(prefix="ccddp-secret-")  # 0700
    try:
        path = os.path.join(where, "group-secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        yield path
    finally:
        shutil.rmtree(where, ignore_errors=True)


def supervised(cmd: list[str], env: dict, *, timeout_s: float | None = None, stdout=None,
               stderr=None) -> subprocess.CompletedProcess:
    """Run the torchrun command ``cmd`` in a session of its own, in ``env`` without its
    ``PET_*`` variables (:func:`agent_environment`), and wait for it. Ctrl-C, SIGTERM,
    SIGHUP or ``timeout_s`` stop it and every rank (:func:`stop`) before the exception
    goes on, so no rank outlives the call.

    Example::

        done = supervised([sys.executable, "-m", AGENT, "--nproc-per-node=2", "train.py"],
                          dict(os.environ))
        done.returncode
    """
    with _signals_as_interrupt():
        proc = subprocess.Popen(cmd, env=agent_environment(env), text=True, start_new_session=True, stdout=stdout,
                                stderr=stderr)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            stop(proc)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


#: Seconds torchrun and the ranks get to exit after SIGTERM before they are killed.
GRACE_S = 3.0


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """End torchrun ``proc`` and every process it started (the ranks run in sessions of
    their own, so they are found as its descendants); returns when all are gone."""
    ranks = _Ranks.of(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    # communicate, not wait: torchrun may write to a full pipe while it shuts down.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=grace_s)
    alive = ranks.wait(timeout=grace_s if proc.poll() is None else 0.5)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    alive.kill()
    alive.wait(timeout=grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=grace_s)


class _Ranks:
    """The descendants of a process, to wait for and kill: through psutil where it is
    installed (the ``bench`` extra), else through Linux's ``/proc`` (``ccddp launch`` needs
    no more than the core dependencies)."""

    def __init__(self, procs: list, psutil) -> None:
        self.procs, self.psutil = procs, psutil

    @classmethod
    def of(cls, pid: int) -> _Ranks:
        try:
            import psutil
        except ImportError:
            return cls(_proc_descendants(pid), None)
        try:
            return cls(psutil.Process(pid).children(recursive=True), psutil)
        except psutil.NoSuchProcess:
            return cls([], psutil)

    def wait(self, timeout: float) -> _Ranks:
        """Wait up to ``timeout`` s for all to end; the ones still running."""
        if self.psutil is not None:
            return _Ranks(self.psutil.wait_procs(self.procs, timeout=timeout)[1], self.psutil)
        deadline = time.monotonic() + timeout
        alive = [p for p in self.procs if _proc_running(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if _proc_running(p)]
        return _Ranks(alive, None)

    def kill(self) -> None:
        for p in self.procs:
            if self.psutil is not None:
                with contextlib.suppress(self.psutil.NoSuchProcess):
                    p.kill()
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (state, ppid, ...); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def _proc_descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _proc_stat(int(name))):
                children.setdefault(int(st[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _proc_running(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals_as_interrupt():
    """SIGTERM and SIGHUP end the command like Ctrl-C does (with its clean-up), not at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def reason(stderr: str) -> str:
    """The most telling line of a failed run's stderr: a ccddp error if there is one, else
    a rank the kernel killed (SIGKILL: almost always its out-of-memory killer)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]

    def first(*markers: str) -> str | None:
        for marker in markers:
            for ln in lines:
                if marker in ln:
                    # A rank's own "ccddp: error: " prefix goes: the command puts its own first.
                    return ln.split("]:", 1)[-1].strip().removeprefix("ccddp: error: ")[:500]
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
