"""Workloads layer: the seven models, their synthetic data, DDP bucket plans, ``ccddp buckets``.

Only tiny sizes run forward/backward here; default sizes are built on the meta device.
"""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
import torch.distributed as dist

from ccddp.errors import ConfigError
from ccddp.workloads import PAPER, WORKLOADS, bucket_plan, get_workload, paper_setup
from ccddp.workloads.bucketing import MIB, bucket_limits, reducer_parameters
from ccddp.workloads.graphdata import synthetic_products
from ccddp.workloads.precision import upcast_matmuls
from ccddp.workloads.sampler import sample_neighbors

NAMES = ["graphsage", "resnet50", "resnet101", "bert-base", "bert-large", "gpt2-large", "gpt2-xl"]


def _assert_batches_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _batches_differ(a: dict, b: dict) -> bool:
    return any(a[k].shape != b[k].shape or not torch.equal(a[k], b[k]) for k in a)


# -- registry -------------------------------------------------------------------------

def test_registry_has_the_papers_seven_workloads():
    assert list(WORKLOADS) == NAMES
    families = {n: get_workload(n, size="tiny").family for n in NAMES}
    assert families == {"graphsage": "graph", "resnet50": "vision", "resnet101": "vision",
                        "bert-base": "language", "bert-large": "language",
                        "gpt2-large": "language", "gpt2-xl": "language"}


def test_unknown_workload_names_the_choices():
    with pytest.raises(ConfigError) as e:
        get_workload("x")
    assert str(e.value) == ("unknown workload 'x'; choose one of: graphsage, resnet50, "
                            "resnet101, bert-base, bert-large, gpt2-large, gpt2-xl")


@pytest.mark.parametrize("kwargs", [{"size": "huge"}, {"sequence_length": 8}, {"dtype": "int8"},
                                    {"batch_size": 0}, {"seq_len": 4096}])
def test_bad_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        get_workload("gpt2-large", **kwargs)


@pytest.mark.parametrize("name,kwargs", [("resnet50", {"image_size": "abc"}),
                                         ("resnet50", {"image_size": 16}),
                                         ("graphsage", {"fanouts": (10, 5)}),
                                         ("graphsage", {"fanouts": (10, 0, 5)}),
                                         ("bert-base", {"seq_len": 1000}),
                                         ("bert-base", {"matmul_dtype": "int4"})])
def test_family_settings_are_validated(name, kwargs):
    with pytest.raises(ConfigError):
        get_workload(name, **kwargs)


def test_overrides_reach_shapes():
    wl = get_workload("bert-base", size="tiny", batch_size=3, seq_len=24, seed=7, dtype="bfloat16")
    s = wl.shapes
    assert (s["batch_size"], s["seq_len"], s["seed"], s["dtype"]) == (3, 24, 7, "bfloat16")
    assert s["dtype_reduced"] is True and s["dtype_reason"] == "requested by the caller"
    assert wl.param_dtype == torch.bfloat16
    batch = wl.make_batch(0, 0, 1)
    assert batch["input_ids"].shape == (3, 24)
    # None keeps the preset, so CLI options can be passed through unchanged.
    assert get_workload("bert-base", size="tiny", batch_size=None).batch_size == 2


# -- tiny workloads: build, data, loss --------------------------------------------------

@pytest.fixture(scope="module")
def tiny_models():
    return {n: get_workload(n, size="tiny").build_model() for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_tiny_build_is_deterministic_and_leaves_global_rng(name, tiny_models):
    wl = get_workload(name, size="tiny")
    before = torch.random.get_rng_state()
    again = wl.build_model()
    assert torch.equal(torch.random.get_rng_state(), before)
    ref = dict(tiny_models[name].named_parameters())
    params = dict(again.named_parameters())
    assert params.keys() == ref.keys()
    assert all(torch.equal(params[k], ref[k]) for k in ref)
    assert all(p.dtype == wl.param_dtype for p in params.values())
    other = dict(get_workload(name, size="tiny", seed=1).build_model().named_parameters())
    assert any(not torch.equal(other[k], ref[k]) for k in ref)
    assert again.training


@pytest.mark.parametrize("name", NAMES)
def test_tiny_batches_are_deterministic_and_sharded(name):
    wl = get_workload(name, size="tiny")
    a = wl.make_batch(step=3, rank=1, world_size=2)
    _assert_batches_equal(a, get_workload(name, size="tiny").make_batch(step=3, rank=1, world_size=2))
    assert _batches_differ(a, wl.make_batch(step=3, rank=0, world_size=2))
    assert _batches_differ(a, wl.make_batch(step=4, rank=1, world_size=2))
    assert _batches_differ(a, get_workload(name, size="tiny", seed=5).make_batch(3, 1, 2))
    with pytest.raises(ConfigError):
        wl.make_batch(step=0, rank=2, world_size=2)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_loss_is_finite_and_backward_reaches_every_parameter(name, tiny_models):
    wl = get_workload(name, size="tiny")
    model = tiny_models[name]
    model.zero_grad(set_to_none=True)
    loss = wl.loss(model, wl.make_batch(0, 0, 2))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    _, params, _ = reducer_parameters(model)
    for p in params:
        assert p.grad is not None and p.grad.dtype == wl.param_dtype
        assert torch.isfinite(p.grad.float()).all()
    assert sum(p.numel() for p in params) == wl.shapes["num_params"]


def test_batch_shapes_follow_the_originals():
    img = get_workload("resnet50", size="tiny").make_batch(0)
    assert img["pixel_values"].shape == (2, 3, 32, 32) and img["labels"].max() < 1000
    # ImageNet-normalised pixels: roughly zero mean, unit-ish spread, not [0, 1].
    assert img["pixel_values"].min() < -0.5 and img["pixel_values"].max() > 0.5

    glue = get_workload("bert-base").make_batch(0)
    ids, mask = glue["input_ids"], glue["attention_mask"]
    assert ids.shape == (4, 128) and ids.max() < 30522
    assert (ids[:, 0] == 101).all() and set(glue["labels"].tolist()) <= {0, 1}
    assert ((ids == 0) == (mask == 0)).all()  # padding exactly where the mask is 0
    assert (glue["token_type_ids"] <= mask).all()

    lm = get_workload("gpt2-xl").make_batch(0)
    assert lm["input_ids"].shape == (1, 32) and lm["input_ids"].max() < 50257
    assert torch.equal(lm["labels"], lm["input_ids"])


def test_graph_batch_is_a_neighbour_sample_of_the_rank_partition():
    wl = get_workload("graphsage", size="tiny")
    g = wl.graph()
    b = wl.make_batch(0, rank=1, world_size=2)
    n, bs = b["n_id"].numel(), b["y"].numel()
    assert bs == 16 and b["x"].shape == (n, 100)
    seeds = b["n_id"][:bs]
    assert set(seeds.tolist()) <= set(g.train_idx.tensor_split(2)[1].tolist())
    assert torch.equal(b["y"], g.y[seeds]) and torch.equal(b["x"], g.x[b["n_id"]])
    src, dst = b["edge_index"]
    assert src.max() < n and dst.max() < n
    # Every sampled edge exists in the graph (CSR in-neighbours of the target).
    adj = {(int(u), int(v)) for u, v in zip(g.edge_index[0], g.edge_index[1])}
    assert all((int(b["n_id"][s]), int(b["n_id"][d])) in adj for s, d in zip(src, dst))


def test_sampler_respects_fanouts_without_replacement():
    g = synthetic_products(seed=3, num_nodes=3000, avg_degree=20.0)
    seeds = g.train_idx[:40]
    gen = torch.Generator().manual_seed(0)
    n_id, ei = sample_neighbors(g.rowptr, g.col, seeds, [7, 4], gen)
    assert torch.equal(n_id[:40], seeds) and n_id.unique().numel() == n_id.numel()
    deg = torch.bincount(ei[1], minlength=n_id.numel())
    full = g.rowptr[seeds + 1] - g.rowptr[seeds]
    assert torch.equal(deg[:40], full.clamp(max=7))  # seeds: min(degree, fanout) each
    assert deg.max() <= 7
    assert torch.unique(ei[0] * n_id.numel() + ei[1]).numel() == ei.shape[1]  # no repeats


def test_synthetic_graph_looks_like_products():
    g = synthetic_products(seed=0, num_nodes=20_000)
    deg = (g.rowptr[1:] - g.rowptr[:-1]).float()
    assert g.x.shape == (20_000, 100) and int(g.y.max()) == 46
    assert 35 < deg.mean() < 65  # products: ~50 after symmetrisation
    assert deg.max() > 10 * deg.median()  # heavy tail
    homophily = (g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).float().mean()
    assert homophily > 0.6
    assert torch.equal(synthetic_products(seed=0, num_nodes=20_000).x, g.x)  # cached/deterministic


# -- default sizes on the meta device ---------------------------------------------------

@pytest.mark.parametrize("name,expected", [("bert-large", 38), ("gpt2-xl", 145),
                                           ("resnet50", 5), ("bert-base", 14), ("graphsage", 2)])
def test_default_bucket_counts_fp32(name, expected):
    plan = bucket_plan(name, dtype="float32")
    assert plan.num_buckets == expected
    assert plan.dtype == "float32" and plan.bucket_cap_mb is None
    assert sum(plan.bucket_bytes) == plan.num_params * 4 == plan.total_bytes
    assert sum(plan.bucket_numel) == plan.num_params
    assert plan.first_bucket_bytes == dist._DEFAULT_FIRST_BUCKET_BYTES
    # A bucket closes once it reaches its limit: all but the last are at least the cap.
    assert plan.bucket_bytes[0] >= plan.first_bucket_bytes
    assert all(b >= 25 * MIB for b in plan.bucket_bytes[1:-1])


def test_default_architectures_are_full_size():
    counts = {n: bucket_plan(n).num_params for n in NAMES}
    assert counts == {"graphsage": 675_887, "resnet50": 25_557_032, "resnet101": 44_549_160,
                      "bert-base": 109_483_778, "bert-large": 335_143_938,
                      "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200}


def test_bucket_launch_order_starts_at_the_output_layer():
    plan = bucket_plan("bert-base", dtype="float32")
    assert "classifier.bias" in plan.bucket_params[0]
    assert "bert.embeddings.word_embeddings.weight" in plan.bucket_params[-1]


def test_bucket_cap_sets_both_limits():
    assert bucket_limits(None) == (dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB)
    assert bucket_limits(25) == (25 * MIB, 25 * MIB)
    default = bucket_plan("bert-base", dtype="float32")
    capped = bucket_plan("bert-base", dtype="float32", bucket_cap_mb=25)
    assert capped.bucket_bytes[0] >= 25 * MIB > default.bucket_bytes[0]
    assert capped.num_buckets < default.num_buckets
    big = bucket_plan("bert-base", dtype="float32", bucket_cap_mb=10_000)
    assert big.num_buckets == 1
    for bad in (0, -1, "x"):
        with pytest.raises(ConfigError):
            bucket_plan("bert-base", bucket_cap_mb=bad)


def test_gpt2_xl_default_dtype_is_reduced_for_memory_and_recorded():
    wl = get_workload("gpt2-xl")
    s = wl.shapes
    assert wl.param_dtype == torch.bfloat16 and s["dtype"] == "bfloat16"
    assert s["dtype_reduced"] is True and "memory" in s["dtype_reason"]
    assert s["matmul_dtype"] == "float32"
    assert s["param_bytes"] == 2 * 1_557_611_200
    plan = bucket_plan(wl)  # what a run of this workload actually all-reduces
    assert plan.dtype == "bfloat16" and plan.num_buckets < 145
    fp32 = get_workload("gpt2-xl", dtype="float32").shapes
    assert fp32["dtype_reduced"] is False and fp32["dtype_reason"] is None
    assert get_workload("gpt2-large").shapes["dtype_reduced"] is False


def test_bucket_plan_of_a_plain_module_dedups_shared_parameters():
    lin = torch.nn.Linear(512, 512)
    model = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.Linear(512, 10))
    plan = bucket_plan(model)
    assert plan.num_tensors == 4 and plan.num_params == 512 * 512 + 512 + 5130
    assert plan.workload == "Sequential" and plan.dtype == "float32"
    with pytest.raises(ConfigError):
        bucket_plan(model, order="ready")
    with pytest.raises(ConfigError):
        bucket_plan(42)


def test_ready_order_matches_real_ddp_buckets(tmp_path):
    """bucket_plan(order="ready") is byte-for-byte what DDP rebuilds after iteration 0."""
    # Another test leaking its default group would make this one init a second: fail loudly.
    assert not dist.is_initialized(), "a default process group leaked from an earlier test"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cap = 0.002  # ~2 KB buckets, so tiny models get several
        mismatched_reverse = 0
        # One per code path: PyG, ResNet shortcuts, BERT embeddings, GPT-2 bf16 + fp32 matmuls.
        for name in ("graphsage", "resnet50", "bert-base", "gpt2-xl"):
            wl = get_workload(name, size="tiny")
            ddp = torch.nn.parallel.DistributedDataParallel(wl.build_model(), bucket_cap_mb=cap)
            for step in range(3):
                wl.loss(ddp, wl.make_batch(step, 0, 1)).backward()
            logged = str(ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"])
            real = [int(x) for x in logged.split(", ")]
            assert bucket_plan(wl, bucket_cap_mb=cap, order="ready").bucket_bytes == real, name
            mismatched_reverse += bucket_plan(wl, bucket_cap_mb=cap).bucket_bytes != real
        # The reverse-order stand-in really is an approximation (ResNet, BERT differ).
        assert mismatched_reverse > 0
    finally:
        dist.destroy_process_group()


def test_ready_and_reverse_orders_agree_on_default_counts():
    for name in ("resnet50", "bert-large"):
        a = bucket_plan(name, dtype="float32", order="ready")
        b = bucket_plan(name, dtype="float32")
        assert a.num_buckets == b.num_buckets and a.total_bytes == b.total_bytes


# -- paper setup ----------------------------------------------------------------------

def test_paper_setup_batches_and_flops():
    assert {n: PAPER[n]["batch_size"] for n in NAMES} == {
        "graphsage": 1024, "resnet50": 1024, "resnet101": 1024, "bert-base": 128,
        "bert-large": 128, "gpt2-large": 1, "gpt2-xl": 1}
    r50 = paper_setup("resnet50")
    assert math.isclose(r50["forward_flops_per_sample"], 8.18e9, rel_tol=0.01)  # 2 x 4.09 GMAC
    assert r50["train_flops_per_sample"] == 3 * r50["forward_flops_per_sample"]
    xl = paper_setup("gpt2-xl")
    # ~2 * params * tokens plus attention.
    assert 2 * 1.5576e9 * 1024 < xl["forward_flops_per_sample"] < 1.2 * 2 * 1.5576e9 * 1024
    assert PAPER["bert-large"]["fig6_allreduces"] == 38 and xl["fig6_allreduces"] == 142
    sage = paper_setup("graphsage")
    assert sage["batch_size"] == 1024 and sage["fanouts"] == [15, 10, 5]
    assert sage["forward_flops_per_sample"] > 0
    with pytest.raises(ConfigError):
        paper_setup("nope")


# -- reduced-precision storage, fp32 matmuls --------------------------------------------

def test_upcast_matmuls_keeps_bf16_storage_and_matches_fp32_math():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), Conv1D(4, 8))
    low = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), Conv1D(4, 8)).to(torch.bfloat16)
    low.load_state_dict({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()})
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})  # same values
    assert upcast_matmuls(low) == 2
    x = torch.randn(3, 5, 16)
    y_low = low(x.to(torch.bfloat16))
    y_ref = ref(x.to(torch.bfloat16).float())
    assert y_low.dtype == torch.bfloat16 and y_low.shape == (3, 5, 4)
    torch.testing.assert_close(y_low.float(), y_ref, atol=3e-2, rtol=3e-2)
    y_low.float().sum().backward()
    y_ref.sum().backward()
    for (name, p), (_, q) in zip(low.named_parameters(), ref.named_parameters()):
        assert p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16, name
        torch.testing.assert_close(p.grad.float(), q.grad, atol=5e-2, rtol=5e-2)


# -- CLI ------------------------------------------------------------------------------

def test_cli_buckets_json(tmp_path, capsys):
    from ccddp.cli import main

    out = tmp_path / "b.json"
    assert main(["buckets", "--workload", "bert-large", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    assert row["workload"] == "bert-large" and row["num_buckets"] == 38
    assert row["paper_fig6_allreduces"] == 38 and row["dtype"] == "float32"
    assert row["num_params"] == 335_143_938 and len(row["bucket_bytes"]) == 38
    printed = capsys.readouterr().out
    assert "bert-large" in printed and "38" in printed
    assert main(["buckets", "--workload", "resnet50", "--order", "ready", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["order"] == "ready" and row["num_buckets"] == 5


def test_cli_buckets_all_and_errors(tmp_path, capsys):
    from ccddp.cli import main

    out = tmp_path / "all.json"
    assert main(["buckets", "--workload", "all", "--bucket-cap-mb", "100", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["workload"] for r in rows] == NAMES
    assert all(r["bucket_cap_mb"] == 100 for r in rows)
    capsys.readouterr()
    assert main(["buckets", "--workload", "gpt3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ccddp: error: unknown workload 'gpt3'") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# -- PyG without transformers (workloads/pyg.py) -------------------------------------------------------

def _graphsage_digest() -> dict:
    """Checksums of the tiny GraphSAGE's parameters, its graph and its first batch."""
    import hashlib

    import torch

    from ccddp.workloads import get_workload

    def sha(tensors) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    wl = get_workload("graphsage", size="tiny")
    graph = wl.graph()
    return {"model": sha(wl.build_model().parameters()), "graph": sha([graph.x, graph.edge_index]),
            "batch": sha(wl.make_batch(step=0, rank=0, world_size=1).values())}


#: A fresh process builds the tiny GraphSAGE, its graph and a batch, then prints what it
#: had loaded of transformers by then, the checksums, and whether transformers imports after.
PYG_PROBE = inspect.getsource(_graphsage_digest) + """
import json, sys
row = {"digest": _graphsage_digest(), "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")}
import transformers
row["after"] = transformers.__name__
print(json.dumps(row))
"""


def test_a_fresh_process_builds_graphsage_without_transformers_and_the_same_model():
    """PyG's package import would load transformers for a type alias (~1 s of CPU a rank):
    a fresh process builds GraphSAGE, its graph and batches without it, with the same
    parameters and data as a process that loaded PyG the ordinary way (this one, with
    transformers imported first), and can import transformers afterwards."""
    import subprocess
    import sys

    import transformers  # noqa: F401  (so this process's PyG, if not loaded yet, loads the ordinary way)

    from dist_util import child_env

    p = subprocess.run([sys.executable, "-c", PYG_PROBE], capture_output=True, text=True, timeout=300,
                       env=child_env())
    assert p.returncode == 0, p.stderr[-3000:]
    row = json.loads(p.stdout.strip().splitlines()[-1])
    assert row["loaded"] == [] and row["after"] == "transformers", row
    assert row["digest"] == _graphsage_digest()


#: A PyG that imports transformers unconditionally (a package of that name put first on
#: the path): the attempt without it fails, and the loader imports it the ordinary way.
NEEDS_TRANSFORMERS = """
import sys, types
sys.path.insert(0, sys.argv[1])
from ccddp.workloads import pyg
module = pyg.load("torch_geometric")
print(module.needs, isinstance(sys.modules["transformers"], types.ModuleType), module.attempts)
"""

def test_a_pyg_that_needs_transformers_to_import_is_loaded_the_ordinary_way(tmp_path):
    import subprocess
    import sys

    from dist_util import child_env

    fake = tmp_path / "torch_geometric"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\n"
        "attempts = int(os.environ.get('PYG_ATTEMPTS', '0')) + 1\n"
        "os.environ['PYG_ATTEMPTS'] = str(attempts)\n"
        "import transformers\n"
        "needs = transformers.__name__\n")
    p = subprocess.run([sys.executable, "-c", NEEDS_TRANSFORMERS, str(tmp_path)], capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr[-3000:]
    # Tried once without transformers, then loaded for real: the module of the failed
    # attempt was dropped (a second run of the package's code), transformers is a module.
    assert p.stdout.split() == ["transformers", "True", "2"], p.stdout + p.stderr
