"""The backend's c10d ops as one table (issue 40), without ranks: every record is a method
of the group with torch's name and signature, the checks run before anything is queued and
say what they refuse, and the measurement-only schedules are off the default path. The ops
themselves, on real ranks, are in ``test_backend.py`` and ``test_torch_compat.py``."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ccddp.backend import ops
from ccddp.backend.calls import Call, stage
from ccddp.backend.process_group import _DEVICE_OPS, ProcessGroupCCDDP
from ccddp.comm import CommSettings
from ccddp.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "ccddp" / "backend"


class _Group:
    """What the table's checks and staging read of a group."""

    def __init__(self, rank: int = 0, size: int = 2) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def placement(self, device):
        raise AssertionError("a CPU tensor has no placement")


def test_every_record_is_a_method_of_the_group_with_torchs_signature():
    assert len({op.method for op in ops.TABLE}) == len(ops.TABLE) == 16
    for op in ops.TABLE:
        method = getattr(ProcessGroupCCDDP, op.method)
        assert method.__name__ == op.method
        params = list(inspect.signature(method).parameters)
        assert params[0] == "self" and params[1:] == list(inspect.signature(op.check).parameters)[1:]
        assert op.method in _DEVICE_OPS
    assert list(inspect.signature(ProcessGroupCCDDP.barrier).parameters) == ["self", "opts"]  # torch: barrier(opts=)
    for alias, name in (("all_gather_single", "_allgather_base"), ("all_to_all_single", "alltoall_base"),
                        ("reduce_scatter_single", "_reduce_scatter_base")):
        assert getattr(ProcessGroupCCDDP, alias) is getattr(ProcessGroupCCDDP, name)
    assert {"monitored_barrier", "send", "recv", "recv_anysource"} <= set(_DEVICE_OPS)


def test_the_group_module_stays_small():
    assert len((SRC / "process_group.py").read_text().splitlines()) <= 250


@pytest.mark.parametrize("op, args, message", [
    (ops.ALL_REDUCE, ([torch.ones(2), torch.ones(2)],), "all_reduce: the ccddp backend takes one tensor per call, got 2"),
    (ops.ALL_REDUCE, ([torch.ones(2).to_sparse()],), "all_reduce: torch.sparse_coo tensors are not supported"),
    (ops.BROADCAST, ([torch.ones(2)], dist.BroadcastOptions()), None),
    (ops.ALL_GATHER, ([[torch.ones(2)]], [torch.ones(2)]), "all_gather: need 2 output tensors, got 1"),
    (ops.ALL_GATHER_INTO_TENSOR, (torch.ones(3), torch.ones(2)), "all_gather_into_tensor: output must hold"),
    (ops.REDUCE_SCATTER, ([torch.ones(2)], [[torch.ones(2)]]), "reduce_scatter: need one list of 2 input tensors"),
    (ops.ALL_TO_ALL_SINGLE, (torch.ones(3), torch.ones(4), [], []),
     "all_to_all_single output: 3 rows do not split evenly over 2 ranks"),
    (ops.GATHER, ([], [torch.ones(2)]), "gather: the destination rank needs one output list"),
])
def test_checks_refuse_before_anything_is_queued(op, args, message):
    if message is None:
        result, inputs, calls = op.check(_Group(), *args)
        assert result is args[0] and len(calls) == 1 and calls[0].root == 0
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        op.check(_Group(), *args)


def test_a_coalesced_op_is_one_call_per_tensor_and_each_call_stages_in_place():
    outs, ins = [torch.empty(4), torch.empty(6)], [torch.ones(2), torch.ones(3)]
    _, _, calls = ops.ALL_GATHER_INTO_TENSOR_COALESCED.check(_Group(), outs, ins)
    assert [c.outs[0] for c in calls] == outs
    for c in calls:
        stage(_Group(), c)
        assert c.bufs[0] is c.outs[0] and c.srcs[0] is c.ins[0]   # contiguous CPU: no copy
    t = torch.arange(6.0).reshape(2, 3).t()
    call = Call([t])
    stage(_Group(), call)
    call.bufs[0].fill_(1.0)
    ops.write_back(_Group(), call)
    assert torch.equal(t, torch.ones(3, 2))                        # not contiguous: copied back


def test_the_measurement_only_schedules_are_off_the_default_path():
    ops.refuse_measurement_only(CommSettings(), "CCDDP_SETTINGS")
    for settings, named in ((CommSettings(impl="secure-naive"), "impl 'secure-naive'"),
                            (CommSettings(algorithm="tree"), "algorithm 'tree'")):
        with pytest.raises(ConfigError, match=f"CCDDP_SETTINGS: {named} is a measurement-only schedule"):
            ops.refuse_measurement_only(settings, "CCDDP_SETTINGS")


class _FakeCuda:
    """What staging reads of a CUDA tensor, without a GPU."""

    is_cuda = True

    def __init__(self, numel: int) -> None:
        self._numel = numel

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return 4


@pytest.mark.parametrize("placement, outs, ins, staged", [
    ("auto", [1024], [], True),                      # 4 KiB: through host, OpenSSL
    ("auto", [1 << 18], [], True),                   # 1 MiB: still small
    ("auto", [(1 << 18) + 1], [], False),            # past 1 MiB: on the device
    ("auto", [1024], [1 << 20], False),              # judged by the call's largest tensor
    ("device", [1024], [], False),                   # the user's word
    ("staged", [1024], [], False),                   # (staged by its placement, not as small)
])
def test_a_small_cuda_call_is_staged_under_auto(placement, outs, ins, staged, monkeypatch):
    """Issue 42: a device-engine seal costs ~0.2 ms of host work on an H100, so under
    placement ``auto`` a small CUDA call goes through host memory, the same on every rank."""
    from types import SimpleNamespace

    from ccddp.backend import calls

    group = SimpleNamespace(settings=SimpleNamespace(placement=placement))
    call = Call([_FakeCuda(n) for n in outs], [_FakeCuda(n) for n in ins])
    assert calls._small(group, call) is staged
    seen = []
    monkeypatch.setattr(calls, "working", lambda pg, t, on_device: (seen.append(on_device), (t, None))[1])
    monkeypatch.setattr(calls, "source", lambda pg, t, on_device: seen.append(on_device) or t)
    stage(group, call)
    assert seen and all(on is (not staged) for on in seen)
