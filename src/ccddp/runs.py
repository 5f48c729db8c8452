"""Reading measured training results: ``ccddp train --json`` files (one run, or several
variants of one launch) and ``ccddp characterize``'s ``results.json``, as a flat list of
runs, and the keys that group them. Pure functions over JSON: the model's validation
(:mod:`ccddp.bench.validate`) and the report (:mod:`ccddp.report.training_runs`) both
read results through it.

Example::

    runs = load_runs(["runs/"])
    groups = {}
    for r in runs:
        groups.setdefault(run_key(r), []).append(r)
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterable

from ccddp.config import MAX_RESULTS_BYTES, RESULTS_DEPTH, read_json
from ccddp.errors import ConfigError

TRAIN_SCHEMA = "ccddp.train/1"
COMPARE_SCHEMA = "ccddp.train.compare/1"   # several variants of one launch: {"runs": [TRAIN_SCHEMA, ...]}
CHARACTERIZE_SCHEMA = "ccddp.characterize/1"
# Settings of the workload that are not shapes (recorded in "shapes" for the record).
_NOT_SETTINGS = {"workload", "family", "size", "paper_batch_size", "num_params", "param_bytes",
                 "dtype_reduced", "dtype_reason"}


def _read(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise ConfigError(f"measured result not found: {path}")
    # Bounded and typed (size, UTF-8, nesting before parsing, integers): ccddp.config.
    data = read_json(path, what=f"{path} (a JSON result)", max_bytes=MAX_RESULTS_BYTES, max_depth=RESULTS_DEPTH)
    if not isinstance(data, dict):
        return []
    schema = data.get("schema")
    if schema == TRAIN_SCHEMA:
        return [{**data, "source": path}]
    if schema == COMPARE_SCHEMA:
        return [{**r, "source": f"{path}#{r.get('variant')}"} for r in data.get("runs", [])]
    if schema == CHARACTERIZE_SCHEMA:
        return [{**r["result"], "source": f"{path}#{r['key']}"} for r in data.get("runs", [])
                if r.get("status") == "ok" and r.get("result")]
    return []


def load_runs(paths: Iterable[str]) -> list[dict]:
    """Training results from files and directories (``*.json`` below them); JSON files of
    other kinds in a directory are skipped, a named file must be a result."""
    runs: list[dict] = []
    for p in paths:
        if os.path.isdir(p):
            for f in sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True)):
                runs += _read(f)
        else:
            found = _read(p)
            if not found:
                raise ConfigError(f"{p} is not a `ccddp train --json` or `ccddp characterize` "
                                  f"result (schema {TRAIN_SCHEMA}, {COMPARE_SCHEMA} or {CHARACTERIZE_SCHEMA})")
            runs += found
    if not runs:
        raise ConfigError("no measured training results found in " + ", ".join(map(str, paths)))
    return runs


def settings_of(run: dict) -> dict[str, Any]:
    """The workload settings a run used (its ``shapes`` minus derived facts)."""
    return {k: v for k, v in run.get("shapes", {}).items() if k not in _NOT_SETTINGS}


def run_key(run: dict) -> tuple:
    """Runs with equal keys differ only in CC mode and schedule."""
    return (run["workload"], run.get("size", "default"), int(run["world_size"]),
            json.dumps(settings_of(run), sort_keys=True), run.get("bucket_cap_mb"))
