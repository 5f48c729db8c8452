"""The paper's seven workloads as the model sees them, read from a table shipped with
ccddp (no torch): DDP's bucket plan (fp32, default caps), every parameter's gradient
bytes in bucket-fill order (so ``--bucket-cap-mb`` re-buckets exactly as DDP would), FLOPs
per sample, the batch's bytes and the kernel launches of one iteration.

The table is generated from the model definitions by ``python -m
ccddp.bench.projection --write`` (a test regenerates it and compares).

Example::

    from ccddp.sim import load_profile
    wl = catalog_workload("gpt2-xl", load_profile("h100-cc"))
    wl.num_buckets, wl.kernel_launches      # 145, 4601.0
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from ccddp.errors import ConfigError

TABLE_SCHEMA = "ccddp.workload-table/1"
#: The paper's Table I, in its order.
NAMES = ("graphsage", "resnet50", "resnet101", "bert-base", "bert-large", "gpt2-large",
         "gpt2-xl")


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The shipped table (parsed once per process)."""
    text = (resources.files("ccddp.sim") / "data" / "paper_workloads.json").read_text(
        encoding="utf-8")
    data = json.loads(text)
    if data.get("schema") != TABLE_SCHEMA:
        raise ConfigError(f"workload table has schema {data.get('schema')!r}, "
                          f"expected {TABLE_SCHEMA}")
    return data


def entry(name: str) -> dict[str, Any]:
    """One workload's row of the table."""
    rows = table()["workloads"]
    if name not in rows:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(NAMES)}")
    return rows[name]


def catalog_workload(name: str, hw: Any):
    """A :class:`~ccddp.sim.workload.WorkloadProfile` for a paper workload on profile
    ``hw``: phase times from FLOPs at the profile's compute rate, or the profile's own
    ``[workloads.<name>]`` values where it has them."""
    from ccddp.sim.workload import derive_workload

    e = entry(name)
    return derive_workload(name, e["bucket_bytes"], hw, batch_size=e["batch_size"],
                           forward_flops_per_sample=e["forward_flops_per_sample"],
                           input_bytes=e["input_bytes"], param_bytes=e["param_bytes"],
                           kernel_launches=e["kernel_launches"]["total"])


__all__ = ["NAMES", "TABLE_SCHEMA", "table", "entry", "catalog_workload"]
