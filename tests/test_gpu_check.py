"""scripts/gpu_check.sh, the one-command GPU check, rehearsed without a GPU (``--dry-run``):
its own logic end to end -- the wheel install, the environment record, every step run
under its timeout and recorded, a failed step recorded while the next ones run, the
one-line stop when the check cannot run, and the files it leaves (at most 8, all at the
top of OUT, names the device tool brings back).

On a machine with a GPU the same script runs the CUDA tests and benchmarks; here their
CUDA cases skip ("no GPU"), ``bench channel --device cuda`` says it has no device, and the
commands that refuse ``--device cuda`` without a GPU (bench collectives, train) are run
for their argument checks only: their one-line refusal passes a dry run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check_tools as tools  # noqa: E402  (a script's module, by path)
WHEELS = ROOT / ".whl"
SIZES = ["4K", "64K", "1M", "16M", "64M"]
RUN_STEPS = ["collectives-device", "collectives-staged", "train", "calibrate"]
STEPS = ["wheels", "env", "kernels", "tests", *RUN_STEPS] + [f"bench-{s}" for s in SIZES]
FILES = {"gpu-check.log", "env.json", "kernels.json", "tests.xml", "cuda-runs.json", "bench.json", "summary.json"}
#: Files with CUDA cases the tests step runs, where the tree has them.
CUDA_TEST_FILES = ["tests/test_device_aead.py", "tests/test_device_channel.py", "tests/test_backend_device.py",
                   "tests/test_bounce.py", "tests/test_calibrate.py", "tests/test_pads.py",
                   "tests/test_ordered_wire.py"]
#: What the device tool brings back from OUT: names of letters, digits, '.', '_', '-'.
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _have_wheels() -> bool:
    return any(WHEELS.glob("*.whl"))


def _base_env(out: Path) -> dict:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("CCDDP_GPU", "CCDDP_GCM", "TRITON_INTERPRET"))}
    return {**base, "OUT": str(out), "PYTHON": sys.executable}


def _run(tmp_path: Path, *args: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """The script as the device would run it: from the repository root, OUT set."""
    full = {**_base_env(tmp_path / "out"), **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def _steps(summary: dict) -> dict:
    return {s["name"]: s for s in summary["steps"]}


def _check_files(out: Path) -> set[str]:
    entries = list(out.iterdir())
    assert len(entries) <= 8, entries
    for p in entries:
        assert p.is_file() and not p.is_symlink(), f"{p.name}: only plain files at the top of OUT come back"
        assert NAME.match(p.name), p.name
        assert p.stat().st_size <= 16 << 20, p.name
    return {p.name for p in entries}


def test_dry_run_runs_every_step_and_records_it(tmp_path):
    r = _run(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "gpu_check: ok"
    out = tmp_path / "out"
    assert _check_files(out) == FILES

    summary = _summary(tmp_path)
    assert summary["schema"] == "ccddp.gpu-check/1"
    assert summary["dry_run"] and summary["complete"] and summary["ok"]
    assert summary["elapsed_s"] <= summary["budget_s"] == tools.BUDGET_S
    assert summary["rerun"] is None and summary["estimate_s"] <= summary["target_s"] == 360
    assert [s["name"] for s in summary["steps"]] == STEPS
    steps = _steps(summary)
    for name, s in steps.items():
        assert s["status"] in ("ok", "skipped") and isinstance(s["seconds"], int), s
        if s["status"] == "ok":       # its cap from the plan (the budget held every one here)
            assert s["rc"] == 0 and s["command"] and s["timeout_s"] == tools.step_plan(name)[1], s
    assert steps["tests"]["command"].split()[1:4] == ["-m", "pytest", "-q"]
    assert "-k cuda or two_streams " in steps["tests"]["command"] and f"--junitxml {out / 'tests.xml'}" in steps["tests"]["command"]
    assert "--timeout 60 --durations=20" in steps["tests"]["command"]
    # Run once, by their own steps: not in the tests step too.
    assert "--deselect tests/test_calibrate.py::test_calibrate_device_cuda_measures" in steps["tests"]["command"]
    assert "--deselect tests/test_device_channel.py::test_bench_channel_on_cuda_" in steps["tests"]["command"]
    assert "calibrate --device cuda --fast" in steps["calibrate"]["command"]
    assert [f for f in steps["tests"]["command"].split() if f.startswith("tests/") and "::" not in f] == \
        [f for f in CUDA_TEST_FILES if (ROOT / f).exists()]
    assert all(f"bench channel --device cuda --size {s} " in steps[f"bench-{s}"]["command"] for s in SIZES)
    for placement in ("device", "staged"):
        command = steps[f"collectives-{placement}"]["command"]
        assert (f"-m ccddp.cli bench collectives --device cuda --placement {placement} --world-size 2 "
                "--impl gloo,secure --sizes 64M ") in command, command
    assert "-m ccddp.cli train --device cuda --world-size 1 --workload bert-base --cc off,on " in \
        steps["train"]["command"]
    if not torch.cuda.is_available():       # the refusal for want of a GPU is what passed
        assert all("scripts/gpu_check_tools.py no-gpu -- " in steps[n]["command"] for n in RUN_STEPS[:3])
    _check_calibrate_step(steps["calibrate"])

    env = json.loads((out / "env.json").read_text())
    assert env["torch"] == torch.__version__
    assert env["triton"] == importlib.metadata.version("triton")
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["missing"] == [] and env["ccddp_file"].startswith(str(ROOT / "src"))
    assert env["triton_interpret"] is None            # the check compiles: it unset TRITON_INTERPRET
    if _have_wheels():
        assert steps["wheels"]["status"] == "ok" and "--no-index --no-deps" in steps["wheels"]["command"]
        assert env["cryptography_from_wheel_site"], env["cryptography_file"]
        assert env["gcm_vectors"] == str(WHEELS / "gcm-vectors")
    else:
        assert steps["wheels"]["status"] == "skipped" and "scripts/gpu_wheels.sh" in steps["wheels"]["note"]

    kernels = json.loads((out / "kernels.json").read_text())
    arch = int(env["capability"].replace(".", "")) if env.get("capability") else 90
    assert kernels["arch"] == arch and len(kernels["kernels"]) == 9
    assert all(k["registers"] for k in kernels["kernels"])

    suite = ET.parse(out / "tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    names = {c.get("name") for c in suite.iter("testcase")}
    assert "test_seal_and_refill_on_two_streams_give_openssl_frames" in names       # a GPU case without "cuda"
    assert "test_calibrate_device_cuda_measures_the_engine_and_the_staging" not in names     # the calibrate step's
    assert int(suite.get("tests")) > 200 and int(suite.get("failures")) == int(suite.get("errors")) == 0
    if not torch.cuda.is_available():       # all but the commands' own checks of a missing GPU
        assert int(suite.get("tests")) - int(suite.get("skipped")) <= 3

    runs = json.loads((out / "cuda-runs.json").read_text())
    assert runs["schema"] == "ccddp.gpu-check-runs/1"
    assert set(runs["steps"]) == set(RUN_STEPS[:3]) | ({"calibrate"} if steps["calibrate"]["status"] == "ok" else set())
    if not torch.cuda.is_available():
        for name in RUN_STEPS[:3]:
            row = runs["steps"][name]
            assert row["rc"] == 0 and not row["measured"], row
            assert row["line"].startswith("gpu_check: dry run, its arguments accepted: ccddp: error: "), row
            assert "--device cuda needs a CUDA GPU" in row["line"], row

    bench = json.loads((out / "bench.json").read_text())
    assert [b["size"] for b in bench["sizes"]] == SIZES
    if not torch.cuda.is_available():
        for b in bench["sizes"]:
            assert b["rc"] == 0 and not b["measured"]
            assert b["line"] == "ccddp bench channel --device cuda: no CUDA device here; nothing measured"
        assert bench["targets_64M"] is None
    log = (out / "gpu-check.log").read_text()
    assert all(f"== {name}" in log for name in STEPS if steps[name]["status"] == "ok")


def _check_calibrate_step(step: dict) -> None:
    """``ccddp calibrate --device cuda`` runs where calibrate has the option; where it has
    not, the step is skipped, named, and not a failure."""
    import argparse

    from ccddp.cli import build_parser

    parser = build_parser(["calibrate"])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "--device" in commands.choices["calibrate"]._option_string_actions:
        assert step["status"] == "ok" and "-m ccddp.cli calibrate --device cuda " in step["command"], step
    else:
        assert step["status"] == "skipped" and "no --device option" in step["note"], step


def test_a_failed_step_is_recorded_and_the_next_ones_run(tmp_path):
    """A size the bench refuses fails its step; the size after it still runs; the steps
    left out by --only are recorded as such; a missing wheel folder is named, not fatal."""
    r = _run(tmp_path, "--dry-run", "--only", "bench",
             env={"CCDDP_GPU_CHECK_SIZES": "1Q,4K", "CCDDP_GPU_WHEELS": str(tmp_path / "no-wheels")})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "gpu_check: not ok: bench-1Q"
    summary = _summary(tmp_path)
    assert summary["complete"] and not summary["ok"]
    steps = _steps(summary)
    assert list(steps) == ["wheels", "env", "kernels", "tests", *RUN_STEPS, "bench-1Q", "bench-4K"]
    assert steps["wheels"]["status"] == "skipped" and "no wheel folder" in steps["wheels"]["note"]
    assert "bash scripts/gpu_wheels.sh" in steps["wheels"]["note"]
    for name in ["kernels", "tests", *RUN_STEPS]:
        assert steps[name]["status"] == "skipped" and steps[name]["note"].startswith("not selected"), name
    assert steps["bench-1Q"]["status"] == "failed" and steps["bench-1Q"]["rc"] == 2
    assert steps["bench-4K"]["status"] == "ok"
    assert _check_files(tmp_path / "out") <= FILES
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert bench["sizes"][0]["rc"] == 2 and "cannot read size" in bench["sizes"][0]["line"]
    # One line reruns just the failed step, with the sizes it ran with; it is printed too.
    rerun = "CCDDP_GPU_CHECK_SIZES=1Q,4K bash scripts/gpu_check.sh --dry-run --only bench-1Q"
    assert summary["rerun"] == rerun
    assert r.stdout.strip().splitlines()[-2].endswith(rerun)
    again = subprocess.run(["bash", "-c", rerun], cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env={**_base_env(tmp_path / "again"), "CCDDP_GPU_WHEELS": str(tmp_path / "no-wheels")})
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    steps = _steps(json.loads((tmp_path / "again" / "summary.json").read_text()))
    assert [n for n, s in steps.items() if s["status"] != "skipped"] == ["env", "bench-1Q"]
    assert steps["bench-4K"]["note"].startswith("not selected")


def test_only_takes_step_names_and_groups_and_refuses_the_rest(tmp_path):
    r = _run(tmp_path, "--dry-run", "--only", "tests,bench-9Z")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gpu_check: --only takes steps or groups of kernels, tests, collectives, train, calibrate, bench, "
        "collectives-device, collectives-staged, bench-4K, bench-64K, bench-1M, bench-16M, bench-64M; not bench-9Z"]


def test_the_plan_fits_the_window():
    """Caps are estimates with margin, the tests step has at least 240 s, the estimates add
    up to the 6-minute target, and the budget leaves them a minute of slack."""
    assert set(tools.PLAN) == set(STEPS)
    estimates = {n: tools.step_plan(n)[0] for n in STEPS}
    for name, (estimate, cap) in tools.PLAN.items():
        assert cap >= 1.5 * estimate, name
    assert tools.step_plan("tests")[1] >= 240
    assert sum(estimates.values()) <= tools.TARGET_S == 360
    assert tools.BUDGET_S >= sum(estimates.values()) + 60
    assert tools.step_plan("bench-256M") == tools.PLAN["bench-64M"]
    with pytest.raises(KeyError):
        tools.step_plan("nonsense")
    # A step that ignores TERM is killed 15 s later, before the next step needs the GPU.
    assert "timeout -k 15 " in SCRIPT.read_text()


def test_the_check_stops_with_one_line_when_it_cannot_run(tmp_path):
    """No Triton (a module that refuses to import stands first on the path): one line says
    so, exit 2, and the summary still lists every step, as not run."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "triton.py").write_text('raise ImportError("blocked for this test")\n')
    r = _run(tmp_path, "--dry-run", env={"PYTHONPATH": str(blocker), "CCDDP_GPU_WHEELS": str(tmp_path / "none")})
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if "cannot run" in line]
    assert len(lines) == 1 and lines[-1] == r.stdout.strip().splitlines()[-1], r.stdout
    assert (tmp_path / "out" / "gpu-check.log").read_text().count("gpu_check: cannot run") == 1
    assert lines[-1].startswith("gpu_check: cannot run: Triton is not importable (ImportError: blocked for this test)")
    summary = _summary(tmp_path)
    assert [s["name"] for s in summary["steps"]] == STEPS and not summary["ok"]
    steps = _steps(summary)
    assert steps["env"]["status"] == "failed" and steps["env"]["rc"] == 2
    assert all(steps[n]["status"] == "skipped" and steps[n]["note"].startswith("not run") for n in STEPS[2:])
    assert json.loads((tmp_path / "out" / "env.json").read_text())["missing"]
    assert _check_files(tmp_path / "out") == {"gpu-check.log", "env.json", "summary.json"}


def test_the_wheel_folder_installs_for_the_gpu_python(tmp_path, monkeypatch):
    """.whl (made by scripts/gpu_wheels.sh; a fresh clone has none) installs into an empty
    folder with no index and no dependency resolution, for the Python it was made for, and
    cryptography imports from there and works."""
    if not _have_wheels():
        pytest.skip("no .whl folder: scripts/gpu_wheels.sh prepares it (a fresh clone, as in CI, has none); "
                    "the missing-folder path is covered by test_a_failed_step_is_recorded_and_the_next_ones_run")
    target = tmp_path / "site"
    python_version = (WHEELS / "python-version").read_text().strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--only-binary=:all:", "--python-version", python_version, "--target", str(target),
                    *map(str, sorted(WHEELS.glob("*.whl")))], check=True, timeout=120)
    installed = {p.name.split("-")[0] for p in target.glob("*.dist-info")}
    assert installed == {"cryptography", "cffi", "pycparser"}
    code = ("import cryptography; from cryptography.hazmat.primitives.ciphers.aead import AESGCM; "
            "a = AESGCM(bytes(32)); assert a.decrypt(bytes(12), a.encrypt(bytes(12), b'x', b''), b'') == b'x'; "
            "print(cryptography.__file__)")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(target))
    # The NIST vectors carried beside the wheels read as the package's do.
    from _gcm_vectors import gcm_vectors

    monkeypatch.setenv("CCDDP_GCM_VECTORS", str(WHEELS / "gcm-vectors"))
    assert len({v.shape for v in gcm_vectors("gcmEncryptExtIV256.rsp")}) == 175
    assert any(v.pt is None for v in gcm_vectors("gcmDecrypt256.rsp"))


# -- the image-version rehearsal (scripts/gpu_check_image.sh) ---------------------------------
IMAGE_SCRIPT = ROOT / "scripts" / "gpu_check_image.sh"


def test_the_image_rehearsal_refuses_a_venv_with_cryptography_installed(tmp_path):
    """The rehearsal is only worth its time if cryptography comes from the wheel folder
    alone: a venv of the image's versions that has it installed is refused (exit 2, one
    line) before anything runs. (A stand-in interpreter answers as such a venv would.)"""
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\ncase "$2" in\n  *print*) echo "2.11.0 3.6.0" ;;\n'
                    '  "import cryptography") exit 0 ;;\n  *) exit 9 ;;\nesac\n')
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(IMAGE_SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**_base_env(tmp_path / "out"), "CCDDP_IMAGE_VENV": str(tmp_path / "venv")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.strip().splitlines() == [
        f"gpu_check_image: cannot run: cryptography is installed in {tmp_path / 'venv'}; the image has none "
        "(pip uninstall it there)"]


@pytest.mark.skipif(not os.environ.get("CCDDP_IMAGE_VENV"), reason=(
    "opt-in tier: the image-like venv (torch 2.11 CUDA build, several GB; Triton 3.6): "
    "CCDDP_IMAGE_VENV=DIR pytest tests/test_gpu_check.py -k image_versions, or bash scripts/gpu_check_image.sh"))
def test_the_check_and_the_cpu_twins_pass_on_the_images_versions(tmp_path):
    """The GPU check's dry run and the CPU twins of the CUDA cases, with the engine in Triton
    3.6's interpreter, in a venv built like the GPU image (cryptography only on PYTHONPATH)."""
    r = subprocess.run(["bash", str(IMAGE_SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                       env=_base_env(tmp_path / "out"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "image-rehearsal.json").read_text())
    assert (record["torch"], record["triton"]) == ("2.11.0", "3.6.0") and record["ok"]
    env = json.loads((tmp_path / "out" / "dry-run" / "env.json").read_text())
    assert env["cryptography_from_wheel_site"] and env["triton"] == "3.6.0"
    suite = ET.parse(tmp_path / "out" / "twins.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("failures")) == int(suite.get("errors")) == 0 and int(suite.get("tests")) > 200
