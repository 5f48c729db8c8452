"""``--device cuda`` and ``--placement`` on the measuring commands (train, characterize,
bench collectives).

Without a GPU, asking for one is answered in one line (exit 2, no traceback) before any
rank starts or any output folder is made; every other argument is still checked first,
before torch loads. ``--device cpu`` runs are unchanged (the other CLI tests run them);
one rank, the run a single GPU allows, is checked here on the host through the rank
module, and on a GPU (the ``cuda`` cases, which skip here) end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ccddp.bench.launch import free_port

SECRET = "04fccafb0452801fd7829c2113e85de94146f84ef090b1f880c47b8dcf90fec9"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the command would run")
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")

PROBE = """
import json, sys
from ccddp.cli import main
code = main(json.loads(sys.argv[1]))
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""

CUDA_COMMANDS = {
    "ccddp train": ["train", "--workload", "bert-base", "--device", "cuda", "--world-size", "1", "--cc", "off,on",
                    "--json", "OUT/train.json"],
    "ccddp characterize": ["characterize", "--quick", "--device", "cuda", "--out", "OUT"],
    "ccddp bench collectives": ["bench", "collectives", "--device", "cuda", "--placement", "device",
                                "--json", "OUT/c.json"],
}


def _probe(argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    return subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


@NO_GPU
@pytest.mark.parametrize("command", list(CUDA_COMMANDS))
def test_device_cuda_without_a_gpu_is_one_line_before_any_rank(command, tmp_path):
    p = _probe(CUDA_COMMANDS[command], tmp_path)
    assert p.stdout.split()[-1:] == ["2"], p.stdout + p.stderr
    assert "starting" not in p.stdout and "ccddp train:" not in p.stdout, p.stdout    # nothing launched
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    # Before torch loads where the machine has no GPU device at all, else torch's own check.
    assert lines[0].startswith(f"ccddp: error: {command}: --device cuda needs a CUDA GPU; none is visible ("), lines[0]
    assert "(this machine has no GPU device" in lines[0] or "(torch.cuda.is_available() is False" in lines[0]
    # Nothing written (the CLI makes a --json file's folder up front, so a result is never lost).
    assert not any((tmp_path / "out").rglob("*"))


@pytest.mark.parametrize("argv, expect", [
    (["train", "--workload", "bert-tiny", "--device", "cuda"], "unknown workload"),
    (["train", "--workload", "bert-base", "--placement", "staged"], "--placement staged"),
    (["train", "--workload", "bert-base", "--world-size", "1", "--cc", "on"], "at least 2 ranks"),
    (["bench", "collectives", "--placement", "device"], "needs --device cuda"),
    (["bench", "collectives", "--device", "cuda", "--impl", "gloo,ring"], "--impl ring takes host tensors"),
    (["characterize", "--device", "cuda", "--world-sizes", "0", "--out", "OUT"], "must be >= 1"),
    (["characterize", "--world-sizes", "1", "--placement", "device", "--out", "OUT"], "needs --device cuda"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_argument_mistakes_with_the_device_options_come_before_torch(argv, expect, tmp_path):
    p = _probe(argv, tmp_path)
    assert p.stdout.split() == ["NO-TORCH", "2"], p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: ") and expect in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_the_device_options_reach_the_ranks():
    from ccddp.bench.characterize import Plan, train_args
    from ccddp.bench.options import build_collectives_parser, build_parser, check_collectives
    from ccddp.cli.cmd_train import forwarded_args

    args = build_parser().parse_args(["--workload", "resnet50", "--device", "cuda", "--placement", "staged"])
    forwarded = forwarded_args(args, "out.json")
    assert forwarded[forwarded.index("--device") + 1] == "cuda"
    assert forwarded[forwarded.index("--placement") + 1] == "staged"
    ranks = build_parser().parse_args(forwarded)
    assert (ranks.device, ranks.placement) == ("cuda", "staged")

    plan = Plan(["resnet50"], [1], ["pipelined"], 3, 1, device="cuda", placement="device")
    forwarded = train_args(plan, "resnet50", "c.json", 60)
    assert forwarded[forwarded.index("--device") + 1] == "cuda"
    assert forwarded[forwarded.index("--placement") + 1] == "device"
    assert plan.as_dict()["device"] == "cuda" and plan.as_dict()["placement"] == "device"

    # --impl's default follows the device: the engine's host-only ring is left out on CUDA.
    for device, impls in (("cpu", "gloo,ring,secure-naive,secure"), ("cuda", "gloo,secure")):
        args = build_collectives_parser().parse_args(["--device", device])
        check_collectives(args)
        assert args.impl == impls


def test_settings_take_a_placement_and_the_static_names_match():
    from ccddp.bench.options import PLACEMENTS
    from ccddp.comm import CommSettings
    from ccddp.comm.settings import PLACEMENTS as SETTINGS_PLACEMENTS
    from ccddp.errors import ConfigError

    assert PLACEMENTS == SETTINGS_PLACEMENTS
    assert CommSettings().placement == "auto"
    assert CommSettings(placement="staged").as_dict()["placement"] == "staged"
    with pytest.raises(ConfigError, match="placement must be one of auto, device, staged"):
        CommSettings(placement="pinned")


def test_cc_off_uses_nccl_only_where_every_rank_has_its_own_gpu():
    from ccddp.bench.devices import plaintext_backend
    from ccddp.bench.options import min_world_size

    cuda = torch.device("cuda", 0)
    assert plaintext_backend(cuda, own_gpu_everywhere=True)[0] == "nccl"
    backend, why = plaintext_backend(cuda, own_gpu_everywhere=False)
    assert backend == "gloo" and "share a GPU" in why
    assert plaintext_backend(torch.device("cpu"), own_gpu_everywhere=True)[0] == "gloo"
    assert (min_world_size("cpu"), min_world_size("cuda")) == (2, 1)


def test_a_results_folder_holds_one_devices_runs(tmp_path):
    from ccddp.bench.characterize import Plan, characterize, new_results, save
    from ccddp.errors import ConfigError

    cpu = Plan(["graphsage"], [2], ["pipelined"], 3, 1, size="tiny")
    data = new_results(cpu)
    data["runs"] = [{"key": "graphsage/ws2/cc-off", "status": "ok"}]
    save(str(tmp_path / "results.json"), data)
    with pytest.raises(ConfigError, match="holds runs on cpu; give --device cuda another --out"):
        characterize(Plan(["graphsage"], [1], ["pipelined"], 3, 1, size="tiny", device="cuda"), str(tmp_path))


def _one_rank(tmp_path, device: str) -> dict:
    out = tmp_path / "one.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
           f"--master-port={free_port()}", "-m", "ccddp.bench.train", "--workload", "graphsage", "--size", "tiny",
           "--cc", "off,on", "--steps", "2", "--warmup", "1", "--device", device, "--timeout", "60",
           "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CCDDP_GROUP_SECRET": SECRET, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return {run["variant"]: run for run in json.loads(out.read_text())["runs"]}


def test_one_rank_compares_cc_on_and_off_by_the_bounce_path(tmp_path):
    """The run one GPU allows, on the host: one rank, CC-off and CC-on in turns; no
    gradient leaves the rank, so CC-on seals the input batch alone, and both end with the
    same parameters. The result says where it ran and which backend carried it."""
    runs = _one_rank(tmp_path, "cpu")
    off, on = runs["off"], runs["on:pipelined"]
    assert off["world_size"] == on["world_size"] == 1
    assert on["seals_per_rank"] == off["seals_per_rank"] == 0
    assert on["bounce_seals_per_iteration"] > 0 == off["bounce_seals_per_iteration"]
    assert on["param_sha256"] == off["param_sha256"]
    assert (off["device"], off["backend"], off["placement"]) == ("cpu", "gloo", None)
    assert (on["device"], on["backend"], on["settings"]["placement"]) == ("cpu", "ccddp", "auto")


@GPU
def test_one_rank_on_cuda_runs_cc_on_and_off(tmp_path):
    runs = _one_rank(tmp_path, "cuda")
    off, on = runs["off"], runs["on:pipelined"]
    assert off["device"].startswith("cuda:") and off["gpu"] and off["ranks_per_gpu"] == 1
    assert off["backend"] == "nccl" and on["backend"] == "ccddp" and on["placement"] == "auto"
    assert on["bounce_seals_per_iteration"] > 0
    assert on["param_sha256"] == off["param_sha256"]


@GPU
@pytest.mark.parametrize("placement", ["device", "staged"])
def test_bench_collectives_on_cuda_with_two_ranks_on_one_gpu(placement, tmp_path):
    out = tmp_path / "c.json"
    r = subprocess.run([sys.executable, "-m", "ccddp.cli", "bench", "collectives", "--device", "cuda",
                        "--placement", placement, "--world-size", "2", "--sizes", "1M", "--iters", "2",
                        "--timeout", "60", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["impl"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"gloo", "secure"} and not any(row["wrong"] for row in rows.values())
    assert rows["gloo"]["backend"] == "gloo" and rows["secure"]["backend"] == "ccddp"
    assert rows["secure"]["placement"] == placement and rows["secure"]["device"].startswith("cuda:")
    assert rows["secure"]["device_wire"] == "gloo" and rows["gloo"]["device_wire"] is None   # two ranks, one GPU
