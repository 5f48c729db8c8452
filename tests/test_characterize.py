"""``ccddp characterize``: results.json stays valid when a run is interrupted, and the
next run continues where it stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

ARGS = ["characterize", "--workloads", "graphsage,resnet50", "--world-sizes", "2", "--size", "tiny",
        "--steps", "1", "--warmup", "0", "--schedules", "pipelined", "--no-projection", "--timeout", "60"]


def _default_sigint() -> None:
    # A shell's background jobs (e.g. CI runners) start with SIGINT ignored, and an
    # ignored signal stays ignored across exec: give the child the default a user has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ccddp(out, **kw):
    return subprocess.Popen([sys.executable, "-m", "ccddp.cli", *ARGS, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint, **kw)


def test_interrupted_sweep_leaves_valid_results_and_resumes(tmp_path):
    out = tmp_path / "run"
    results = out / "results.json"
    p = _ccddp(out)
    # Interrupt as soon as the first (workload, world size) group has landed.
    deadline = time.time() + 300
    while time.time() < deadline:
        if results.exists() and any(r["status"] == "ok" for r in json.loads(results.read_text())["runs"]):
            break
        assert p.poll() is None, p.communicate()[1][-2000:]
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    p.communicate(timeout=120)
    data = json.loads(results.read_text())  # still valid JSON
    done = {r["key"] for r in data["runs"] if r["status"] == "ok"}
    # Two groups: the interrupt lands while the second one runs (a launch of seconds).
    assert done and len(done) < 4, done
    first = {r["key"]: r["result"]["param_sha256"] for r in data["runs"] if r["status"] == "ok"}

    p = _ccddp(out)
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-2000:]
    data = json.loads(results.read_text())
    assert sorted(r["key"] for r in data["runs"] if r["status"] == "ok") == [
        "graphsage/ws2/cc-off", "graphsage/ws2/cc-on/pipelined", "resnet50/ws2/cc-off",
        "resnet50/ws2/cc-on/pipelined"]
    # What was there was kept, not recomputed.
    for key, sha in first.items():
        assert next(r for r in data["runs"] if r["key"] == key)["result"]["param_sha256"] == sha
    assert (out / "report.md").exists()
    # Off a terminal, progress is one plain line per event (started / done, with ratios).
    done = [ln for ln in stdout.splitlines() if re.match(r"characterize \[\d/\d\] \S+, 2 ranks: done in \d+ s; "
                                                        r"pipelined/off ", ln)]
    assert done and "\x1b" not in stdout and "━" not in stdout, stdout
