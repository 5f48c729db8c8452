"""How a rank that ccddp launched ends when its work is done (``ccddp.bench.worker.leave``):
without the interpreter's teardown (a second of CPU per rank), but with everything an exit
promises -- the ``atexit`` functions run once, buffered output reaches the pipe, status 0 --
and the ordinary way where Python would still wait for a thread."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from ccddp.bench import worker

RANK = textwrap.dedent("""
    import atexit, sys
    from ccddp.bench.worker import run_worker

    class Teardown:
        def __del__(self):                      # runs when the interpreter clears this module
            sys.stderr.write("teardown ran\\n")

    kept = Teardown()
    atexit.register(lambda: sys.stdout.write("exit function ran\\n"))

    def main():
        sys.stdout.write("x" * 200_000 + "\\n")  # a pipe: buffered, not yet written

    run_worker(main)
    sys.stderr.write("run_worker returned\\n")
""")


def test_a_finished_rank_runs_its_exit_functions_flushes_and_skips_the_teardown():
    done = subprocess.run([sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RANK": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines == ["x" * 200_000, "exit function ran"], [ln[:40] for ln in lines]
    assert "run_worker returned" not in done.stderr
    assert "teardown ran" not in done.stderr, "the interpreter was torn down"


class _Exited(Exception):
    pass


@pytest.fixture
def no_real_exit(monkeypatch):
    """``os._exit`` raises instead, and the ``atexit`` functions are recorded, not run."""
    calls: list = []

    def fake_exit(status):
        calls.append(("exit", status))
        raise _Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: calls.append(("atexit",)))
    return calls


def test_a_thread_python_would_wait_for_keeps_the_ordinary_exit(no_real_exit):
    release = threading.Event()
    busy = threading.Thread(target=release.wait, daemon=False)
    busy.start()
    try:
        worker.leave()                  # returns: the interpreter's exit will wait for ``busy``
    finally:
        release.set()
        busy.join()
    assert no_real_exit == []


def test_leaving_runs_the_exit_functions_then_exits_with_status_0(no_real_exit, monkeypatch):
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread()])
    with pytest.raises(_Exited):
        worker.leave()
    assert no_real_exit == [("atexit",), ("exit", 0)]


def test_without_cpythons_exit_functions_hook_the_exit_is_ordinary(no_real_exit, monkeypatch):
    monkeypatch.delattr(atexit, "_run_exitfuncs")
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread()])
    worker.leave()
    assert no_real_exit == []
