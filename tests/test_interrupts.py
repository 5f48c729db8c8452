"""An interrupted command leaves no rank behind: Ctrl-C (SIGINT to the command alone, as
a terminal's Ctrl-C reaches it once torchrun runs in its own session) ends torchrun and
every rank before the command returns, and ranks that ignore SIGTERM are killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil

from ccddp.bench.launch import AGENT


def _default_sigint() -> None:
    # Background jobs (e.g. CI runners) start with SIGINT ignored, and that survives exec:
    # give the command the default a user's shell gives it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ranks(cli: subprocess.Popen, n: int, deadline_s: float = 300, marker: str = "ccddp.bench.train") -> list[psutil.Process]:
    """The command's rank processes (``marker`` in their command line), once all ``n`` run."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert cli.poll() is None, cli.communicate()[1][-2000:]
        ranks = [p for p in psutil.Process(cli.pid).children(recursive=True)
                 if marker in " ".join(p.cmdline()) and AGENT not in p.cmdline()]
        if len(ranks) == n:
            return ranks
        time.sleep(0.2)
    raise AssertionError(f"{n} ranks did not start")


def test_ctrl_c_ends_every_rank_before_the_command_returns():
    cli = subprocess.Popen([sys.executable, "-m", "ccddp.cli", "train", "--workload", "graphsage", "--size", "tiny",
                            "--cc", "on", "--world-size", "2", "--steps", "1000000", "--warmup", "0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=_default_sigint)
    ranks: list[psutil.Process] = []
    try:
        ranks = _ranks(cli, 2)
        time.sleep(2.0)  # importing torch or already training: either way they must go
        cli.send_signal(signal.SIGINT)
        _, stderr = cli.communicate(timeout=120)
        alive = [p.pid for p in ranks if not _gone(p)]
        assert not alive, f"ranks {alive} outlived the command"
        assert cli.returncode == 130 and stderr.strip().splitlines()[-1] == "ccddp: interrupted", stderr[-2000:]
    finally:  # never leave a rank running, whatever failed
        for p in ranks + (psutil.Process(cli.pid).children(recursive=True) if cli.poll() is None else []):
            if not _gone(p):
                p.kill()
        cli.kill()


SLEEPER = textwrap.dedent("""
    import time, torch.distributed as dist
    dist.init_process_group("gloo")
    print("rank", dist.get_rank(), "ready", flush=True)
    time.sleep(600)
""")


def test_sigterm_to_launch_ends_every_rank_of_the_script(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    cli = subprocess.Popen([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", "2", str(script)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    ranks: list[psutil.Process] = []
    try:
        ranks = _ranks(cli, 2, marker="sleeper.py")
        cli.send_signal(signal.SIGTERM)   # what a job scheduler sends: to the command alone
        _, stderr = cli.communicate(timeout=60)
        alive = [p.pid for p in ranks if not _gone(p)]
        assert not alive, f"ranks {alive} outlived the command"
        assert cli.returncode == 130, stderr[-2000:]
    finally:
        for p in ranks:
            if not _gone(p):
                p.kill()
        cli.kill()


# A "torchrun" that ignores SIGTERM and starts a "rank" in a session of its own that
# ignores it too: only the kill after the grace period ends them.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(600)"], start_new_session=True)
    time.sleep(600)
""")


def test_stop_kills_what_ignores_sigterm_after_the_grace_period():
    from ccddp.bench.launch import stop

    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"  # both ignore SIGTERM now
    (rank,) = psutil.Process(proc.pid).children()
    stop(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL
    assert _gone(rank)
