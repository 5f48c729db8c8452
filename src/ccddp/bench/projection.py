"""Model projections of paper workloads, and the workload table the model reads them from.

``ccddp.sim`` never imports torch, so what it needs to know about the paper's seven
models (DDP's bucket plan, every parameter's gradient bytes so it can re-bucket exactly,
FLOPs per sample, the batch's bytes, kernel launches per iteration) is computed here once,
from the model definitions on the meta device, and shipped as package data
(``ccddp/sim/data/paper_workloads.json``, read by :mod:`ccddp.sim.catalog`). A test
regenerates it and compares; after a change to a model or to torch, regenerate it with::

    python -m ccddp.bench.projection --write

Example::

    rows = project_paper_gpus(["bert-base"], gpus=(2, 4, 8))
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TABLE_PATH = Path(__file__).resolve().parents[1] / "sim" / "data" / "paper_workloads.json"


def workload_entry(name: str) -> dict[str, Any]:
    """One workload's row of the table, computed from its model definition (torch)."""
    from ccddp.sim.workload import paper_input_bytes
    from ccddp.workloads import bucket_plan, get_workload, paper_setup
    from ccddp.workloads.bucketing import reducer_parameters
    from ccddp.workloads.launches import count_launches

    setup = paper_setup(name)
    # The paper's setting: fp32 throughout, its sequence length and image size.
    shape = {k: setup[k] for k in ("seq_len", "image_size") if k in setup}
    wl = get_workload(name, dtype="float32", matmul_dtype="same", **shape)
    model = wl.build_model(device="meta")      # one build serves the plan and the counts
    plan = bucket_plan(model, dtype="float32")
    _, params, _ = reducer_parameters(model)
    sizes = [p.numel() * 4 for p in reversed(params)]
    launches = count_launches(wl, buckets=plan.num_buckets, model=model)
    return {
        "batch_size": setup["batch_size"],
        "forward_flops_per_sample": setup["forward_flops_per_sample"],
        "flops_method": setup["flops_method"],
        "input_bytes": paper_input_bytes(setup),
        "num_params": plan.num_params,
        # fp32 gradient bytes per parameter in DDP's bucket-fill order (parameters
        # reversed), so the model re-buckets as DDP would.
        "param_bytes": sizes,
        "bucket_bytes": list(plan.bucket_bytes),
        "kernel_launches": launches.as_dict(),
    }


def workload_table(names: list[str] | None = None) -> dict[str, Any]:
    """The whole table (``names``: default all seven workloads)."""
    import torch

    from ccddp.sim.catalog import TABLE_SCHEMA
    from ccddp.workloads import WORKLOADS

    names = list(names or WORKLOADS)
    return {"schema": TABLE_SCHEMA,
            "generated_with": {"torch": torch.__version__.split("+")[0],
                               "by": "python -m ccddp.bench.projection --write"},
            "workloads": {n: workload_entry(n) for n in names}}


def format_table(table: dict[str, Any]) -> str:
    """The table as JSON, one line per workload (readable diffs, small file)."""
    head = {k: v for k, v in table.items() if k != "workloads"}
    lines = ["{" + json.dumps(head)[1:-1] + ', "workloads": {']
    rows = [f"  {json.dumps(n)}: {json.dumps(e)}" for n, e in table["workloads"].items()]
    lines.append(",\n".join(rows))
    lines.append("}}")
    return "\n".join(lines) + "\n"


def project_paper_gpus(workloads: list[str], gpus=(2, 4, 8),
                       profiles=("paper-h100", "h100-cc"), schedule: str = "naive") -> list[dict]:
    """Predicted CC-off/CC-on rows for ``workloads`` on GPUs not measured here: the
    paper's emulated H100 (``schedule``) and Hopper CC as it runs in production (its
    native protection)."""
    from ccddp.sim import Schedule, load_profile, sweep
    from ccddp.sim.catalog import catalog_workload

    rows = []
    for profile in profiles:
        hw = load_profile(profile)
        sched = Schedule(schedule) if hw.sealed_inside_node else Schedule.default_for(hw)
        wls = [catalog_workload(w, hw) for w in workloads]
        rows += sweep(hw, wls, sched, gpus)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the model's workload table.")
    ap.add_argument("--write", action="store_true", help=f"write {TABLE_PATH}")
    args = ap.parse_args(argv)
    text = format_table(workload_table())
    if args.write:
        TABLE_PATH.parent.mkdir(parents=True, exist_ok=True)
        TABLE_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {TABLE_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
