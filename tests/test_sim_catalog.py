"""The workload table the model reads without torch: regenerated from the model
definitions it must equal the shipped one; kernel launches are counted as CUDA would
launch them; one chains rule serves the collectives and the model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ccddp.bench.projection import TABLE_PATH, format_table, workload_entry
from ccddp.sim.catalog import NAMES, table


#: The larger model of a family whose smaller one is built in the fast tier (the same
#: definition at another size): their entries are checked by the whole suite.
LARGER_OF_A_FAMILY = {"resnet101", "bert-large", "gpt2-xl"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.exhaustive if n in LARGER_OF_A_FAMILY else ())
                                  for n in NAMES])
def test_shipped_table_is_what_the_model_definitions_give(name):
    """Regenerates each of the seven entries (meta device; one test each, so workers share
    them) and compares it with the shipped one; after a change to a model or to torch, run
    `python -m ccddp.bench.projection --write`."""
    assert workload_entry(name) == table()["workloads"][name]


def test_shipped_table_is_the_whole_file_as_written():
    """The file is what ``--write`` writes for these entries: all seven workloads, the
    schema, and the torch it was made with."""
    from ccddp.sim.catalog import TABLE_SCHEMA

    shipped = table()
    assert list(shipped["workloads"]) == list(NAMES)
    assert shipped["schema"] == TABLE_SCHEMA and shipped["generated_with"]["torch"]
    assert format_table(shipped) == TABLE_PATH.read_text(encoding="utf-8")


def test_table_entries_are_consistent():
    for name in NAMES:
        e = table()["workloads"][name]
        assert sum(e["param_bytes"]) == sum(e["bucket_bytes"]) == 4 * e["num_params"]
        k = e["kernel_launches"]
        assert k["total"] == k["forward"] + k["backward"] + k["optimizer"] + k["ddp"] > 0


def test_attention_and_dropout_count_as_the_fused_kernels_cuda_runs():
    from ccddp.workloads.launches import _AsOnCuda, _Counter

    q = torch.empty(1, 4, 64, 16, device="meta", requires_grad=True)
    fwd, bwd = _Counter(), _Counter()
    with _AsOnCuda(), fwd:
        y = F.dropout(F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True),
                      p=0.1, training=True)
    with bwd:
        y.sum().backward()
    assert fwd.ops["aten._scaled_dot_product_efficient_attention"] == 1
    assert fwd.ops["aten.native_dropout"] == 1 and "aten.bernoulli_" not in fwd.ops
    assert sum(fwd.ops.values()) == 2
    assert bwd.ops["aten._scaled_dot_product_efficient_attention_backward"] == 1
    # Without the CUDA view, meta decomposes attention into a dozen operators.
    plain = _Counter()
    with plain:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert sum(plain.ops.values()) > 3


def test_multi_tensor_operators_count_their_launches():
    from ccddp.workloads.launches import _multi_tensor_launches

    small = [torch.empty(10, device="meta")] * 200
    assert _multi_tensor_launches([small]) == 2               # 110 tensors per launch
    assert _multi_tensor_launches([small, small, small]) == 5  # 48 with three lists
    big = [torch.empty(65536 * 400, device="meta")]
    assert _multi_tensor_launches([big]) == 2                  # 320 chunks per launch


@pytest.mark.parametrize("cores,local", [(2, 1), (2, 2), (2, 4), (16, 4), (7, 2)])
def test_one_chains_rule_for_collectives_and_model(monkeypatch, cores, local):
    from ccddp.chains import auto_chains
    from ccddp.comm.settings import CommSettings
    from ccddp.sim import Schedule, load_profile

    monkeypatch.setattr("os.cpu_count", lambda: cores)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    assert CommSettings().resolved_chains() == auto_chains(cores, local) == max(1, cores // local)
    hw = load_profile("local").replace(host_cores=cores, max_chains=cores)
    assert Schedule().chains_for(hw, local) == CommSettings().resolved_chains()
