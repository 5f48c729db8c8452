"""``ccddp launch``: an unmodified DDP script (examples/ddp_tutorial.py asks for gloo) runs
on the ccddp backend, ends with the same parameters as under plain torchrun, and its
model data never appears on a socket; backends ccddp cannot seal are refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from dist_util import child_env
from wire_util import HERE, SRC, build_wiretap, found, torchrun, wire_bytes

EXAMPLE = str(HERE.parent / "examples" / "ddp_tutorial.py")


def _checksums(stdout: str) -> dict[int, tuple[str, str]]:
    return {int(r): (b, c) for r, b, c in re.findall(r"rank (\d+): backend (\w+), world 2, params checksum (-?\d+\.\d{10})",
                                                     stdout)}


def _initial_parameter_markers() -> list[bytes]:
    sys.path.insert(0, str(HERE.parent / "examples"))
    try:
        from ddp_tutorial import ToyModel
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    model = ToyModel()
    raw = b"".join(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() for p in model.parameters())
    return [raw[i:i + 16] for i in range(0, len(raw) - 16, 16) if len(set(raw[i:i + 16])) >= 10]


def _reference_run(lib, wire_dir):
    """The plaintext reference under plain torchrun and gloo. gloo itself now and then
    aborts a rank in its teardown on a loaded machine ("terminate called without an active
    exception" after destroy_process_group): that run is repeated once."""
    for _ in range(2):
        plain = torchrun([EXAMPLE, "--steps", "3"], wiretap=lib, wire_dir=wire_dir, timeout=300)
        if plain.returncode == 0:
            break
    assert plain.returncode == 0, plain.stderr[-3000:]
    return plain


def test_launch_runs_an_unmodified_script_sealed(tmp_path):
    lib = build_wiretap(tmp_path)
    (tmp_path / "gloo").mkdir()
    (tmp_path / "ccddp").mkdir()
    plain = _reference_run(lib, tmp_path / "gloo")
    env = child_env(dict(LD_PRELOAD=str(lib), CCDDP_WIRE_DIR=str(tmp_path / "ccddp"), OMP_NUM_THREADS="1"))
    env.pop("CCDDP_GROUP_SECRET", None)  # a single-node launch makes its own
    sealed = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", "2",
                             EXAMPLE, "--steps", "3"], env=env, capture_output=True, text=True, timeout=300)
    assert sealed.returncode == 0, sealed.stderr[-3000:]
    before, after = _checksums(plain.stdout), _checksums(sealed.stdout)
    assert set(before) == set(after) == {0, 1}
    for r in (0, 1):
        assert before[r][0] == "gloo" and after[r][0] == "ccddp"
        assert after[r][1] == before[r][1], "same training, same parameters"
    markers = _initial_parameter_markers()
    assert len(markers) >= 10
    assert found(markers, wire_bytes(tmp_path / "gloo")), "DDP's parameter broadcast is visible under gloo"
    assert not found(markers, wire_bytes(tmp_path / "ccddp"))


def test_backend_names_are_rewritten_or_refused():
    from ccddp.backend.policy import secure_backend
    from ccddp.errors import ConfigError

    assert secure_backend("gloo") == "ccddp"
    assert secure_backend("cpu:gloo") == "cpu:ccddp"
    assert secure_backend("ccddp") == "ccddp"
    # ccddp seals CUDA tensors too: NCCL, and torch's own pick, are served by it.
    assert secure_backend(None) == secure_backend("undefined") == "ccddp"
    assert secure_backend("nccl") == "ccddp"
    assert secure_backend("cpu:gloo,cuda:nccl") == "cpu:ccddp,cuda:ccddp"
    for name in ("mpi", "ucc", "cuda:mpi", "cpu:gloo,cuda:ucc"):
        with pytest.raises(ConfigError, match="cannot seal"):
            secure_backend(name)


def test_torchrun_arguments_start_the_script_through_the_interceptor():
    from ccddp.cli.cmd_launch import torchrun_argv

    fixed = ["--master-addr", "127.0.0.1", "--master-port", "29500"]
    assert torchrun_argv(["--nproc-per-node", "2", *fixed, "train.py", "--lr", "1"], {}) == [
        "--nproc-per-node", "2", *fixed, "-m", "ccddp.backend.intercept", "train.py", "--lr", "1"]
    argv = torchrun_argv(["-m", "pkg.train", "x"], {})
    assert argv[-5:] == ["-m", "ccddp.backend.intercept", "-m", "pkg.train", "x"]


def _bert_markers() -> list[bytes]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    raw = b"".join(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                   for p in BertForSequenceClassification(config).parameters())
    return [raw[i:i + 16] for i in range(0, len(raw) - 16, 4096) if len(set(raw[i:i + 16])) >= 10]


def test_hugging_face_trainer_through_launch(tmp_path):
    """Accelerate picks gloo for CPU ranks whatever ``ddp_backend`` says; ``ccddp launch``
    serves it with ccddp without a change to the script."""
    script = str(HERE / "hf_trainer_main.py")
    lib = build_wiretap(tmp_path)
    out = {}
    for backend in ("gloo", "ccddp"):
        d = tmp_path / backend
        (d / "wire").mkdir(parents=True)
        if backend == "gloo":
            proc = torchrun([script, str(d)], wiretap=lib, wire_dir=d / "wire", timeout=600)
            if proc.returncode != 0 and "terminate called without an active exception" in proc.stderr:
                # The plain-gloo reference: about one run in ten (before this session's changes
                # too) aborts at interpreter exit, after its results are saved, as the Trainer
                # leaves torch's group to exit. Run the reference again; the ccddp run below
                # gets no second try.
                for f in d.rglob("*"):
                    if f.is_file():
                        f.unlink()
                proc = torchrun([script, str(d)], wiretap=lib, wire_dir=d / "wire", timeout=600)
        else:
            env = child_env(dict(LD_PRELOAD=str(lib), CCDDP_WIRE_DIR=str(d / "wire"), OMP_NUM_THREADS="1"))
            proc = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node",
                                   "2", script, str(d)], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[backend] = [torch.load(d / f"rank{r}.pt") for r in range(2)]
        out[backend + "_wire"] = wire_bytes(d / "wire")
    for r in range(2):
        assert out["gloo"][r]["backend"] == "gloo" and out["ccddp"][r]["backend"] == "ccddp"
        assert torch.equal(out["gloo"][r]["params"], out["ccddp"][r]["params"])
        assert out["gloo"][r]["loss"] == out["ccddp"][r]["loss"]
    markers = _bert_markers()
    assert found(markers, out["gloo_wire"]), "the initial parameter broadcast is visible under gloo"
    assert not found(markers, out["ccddp_wire"])


def test_torch_registers_the_backend_through_its_entry_point(tmp_path):
    """Installed, ccddp declares a ``torch.backends`` entry point (pyproject.toml): torch
    calls it at import, so ``init_process_group("ccddp")`` works without importing ccddp.
    Here a distribution on the path declares the same entry point as the project does."""
    import tomllib

    with open(HERE.parent / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"]["torch.backends"]
    info = tmp_path / "ccddp_entry_point_check-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ccddp-entry-point-check\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    code = ("import sys, torch.distributed as dist\n"
            "print('ccddp' in dist.Backend.backend_list, any(m == 'ccddp.backend.process_group' for m in sys.modules))")
    env = child_env(first=(tmp_path,))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # Registered, and nothing heavy imported until a group is created.
    assert out.stdout.split() == ["True", "False"], out.stdout
