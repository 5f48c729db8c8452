"""The backend's c10d methods (aliases included) and its queue's waits are kept out of
dynamo's tracing (``ccddp.backend.eager``), and importing the backend does not load
``torch._dynamo`` to do so (it doubled a rank's start). A fresh interpreter each: the
test process may have loaded dynamo already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dist_util import child_env

CHECK = textwrap.dedent("""
    import json, sys
    import torch
    {first}
    from ccddp.backend.process_group import ProcessGroupCCDDP, _DEVICE_OPS
    from ccddp.backend.queue import OpQueue
    loaded_by_backend = "torch._dynamo" in sys.modules
    import torch._dynamo
    entry_points = {{id(getattr(vars(ProcessGroupCCDDP)[name], "__wrapped__", vars(ProcessGroupCCDDP)[name]))
                    for name in _DEVICE_OPS}}
    methods = {{f"ProcessGroupCCDDP.{{name}}": fn for name, fn in vars(ProcessGroupCCDDP).items()
               if id(getattr(fn, "__wrapped__", fn)) in entry_points}}
    methods.update({{f"OpQueue.{{name}}": vars(OpQueue)[name] for name in ("start", "wait", "future")}})
    print(json.dumps({{
        "loaded_by_backend": loaded_by_backend,
        "not_disabled": sorted(n for n, fn in methods.items() if not getattr(fn, "_torchdynamo_disable", False)),
        "count": len(methods),
        "loader": type(torch._dynamo.__loader__).__name__,
    }}))
""")


@pytest.mark.parametrize("first", ["", "import torch._dynamo"], ids=["backend-first", "dynamo-first"])
def test_every_entry_point_is_disabled_whichever_loads_first(first):
    done = subprocess.run([sys.executable, "-c", CHECK.format(first=first)], capture_output=True, text=True,
                          env=child_env({}), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["not_disabled"] == [], seen
    # 16 table ops, their 5 aliases, 4 point-to-point methods, 3 queue methods.
    assert seen["count"] == 28, seen
    # dynamo's module keeps its own loader (inspect and linecache read its source through it).
    assert seen["loader"] == "SourceFileLoader", seen
    if not first:
        assert seen["loaded_by_backend"] is False, "importing the backend loaded torch._dynamo"
