"""``ccddp characterize``: the paper's study on the user's own machine.

Every workload runs CC-off and CC-on (the paper's naive schedule and ccddp's pipelined
one) at every world size, each (workload, world size) in one torchrun launch in which the
variants take turns iteration by iteration (``ccddp.bench.train``), so each CC-on/CC-off
ratio is a paired comparison with a 95 % interval. Every finished launch is merged into
``DIR/results.json`` at once, written atomically, so the file is always valid; re-running
on the same DIR keeps what is there and runs only what is missing or failed.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from ccddp.bench.machine import LoadMeter, aes_gcm_rate, machine_info
from ccddp.bench.options import variant_key
from ccddp.config import MAX_RESULTS_BYTES, RESULTS_DEPTH, read_json
from ccddp.errors import CCDDPError, ConfigError

SCHEMA = "ccddp.characterize/1"
# --quick: each launch measures at least `steps` rounds after its warm-up, then stops as
# soon as every CC-on/CC-off ratio's 95 % interval is within ±QUICK_PRECISION, or when
# QUICK_BUDGET_S seconds are spent. Launches whose rounds agree stop early and give their
# time to the noisy ones, which keeps the whole sweep under 10 minutes on a quiet 2-core
# machine (BENCHMARKS.md).
QUICK_BUDGET_S = 90.0
QUICK_PRECISION = 0.10
QUICK = {"workloads": ["graphsage", "resnet50", "bert-base"], "world_sizes": [2, 3],
         "schedules": ["naive", "pipelined"], "steps": 10, "warmup": 2, "budget_s": QUICK_BUDGET_S,
         "precision": QUICK_PRECISION}
# --quick keeps every architecture (so gradient bytes and bucket counts are the real ones)
# but shrinks the per-rank batch, so a 2-core machine finishes the sweep in minutes.
QUICK_SHAPES = {"graphsage": {"batch_size": 32}, "resnet50": {"batch_size": 2, "image_size": 112},
                "resnet101": {"batch_size": 2, "image_size": 112}, "bert-base": {"batch_size": 2, "seq_len": 32},
                "bert-large": {"batch_size": 1, "seq_len": 32}, "gpt2-large": {"seq_len": 16},
                "gpt2-xl": {"seq_len": 16}}
# The full study: 12 measured iterations per variant; models that do not fit in memory
# together take turns in blocks of 2 (6 rounds, each with its own warm-up).
FULL = {"workloads": ["graphsage", "resnet50", "resnet101", "bert-base", "bert-large", "gpt2-large", "gpt2-xl"],
        "world_sizes": [2, 3, 4], "schedules": ["naive", "pipelined"], "steps": 12, "warmup": 2, "budget_s": None,
        "precision": None}
FULL_BLOCK = 2


@dataclass(frozen=True)
class Plan:
    workloads: list[str]
    world_sizes: list[int]
    schedules: list[str]
    steps: int
    warmup: int
    size: str = "default"
    quick: bool = False
    budget_s: float | None = None
    precision: float | None = None
    trust_domains: str = "rank"    # as --trust-domains gives it: a name or a JSON list
    device: str = "cpu"            # where every launch trains: cpu or cuda
    placement: str = "auto"        # with cuda: where CC-on seals a CUDA tensor's frames

    def overrides(self, workload: str) -> dict:
        return QUICK_SHAPES.get(workload, {}) if self.quick and self.size == "default" else {}

    def keys(self, workload: str, ws: int) -> list[str]:
        return [variant_key(workload, ws, "off", None)] + [variant_key(workload, ws, "on", s) for s in self.schedules]

    def as_dict(self) -> dict:
        return {"workloads": self.workloads, "world_sizes": self.world_sizes, "schedules": self.schedules,
                "steps": self.steps, "warmup": self.warmup, "budget_s": self.budget_s,
                "precision": self.precision, "size": self.size,
                "quick": self.quick, "trust_domains": self.trust_domains, "device": self.device,
                "placement": self.placement}


def load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        data = read_json(path, what=path, max_bytes=MAX_RESULTS_BYTES, max_depth=RESULTS_DEPTH)
    except ConfigError as e:
        raise ConfigError(f"{e}; move it away to start over") from None
    schema = data.get("schema") if isinstance(data, dict) else f"none (a JSON {type(data).__name__})"
    if schema != SCHEMA:
        raise ConfigError(f"{path} has schema {schema!r}, expected {SCHEMA!r}")
    return data


def save(path: str, data: dict) -> None:
    """Atomic: a reader (or an interrupted run) never sees a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".results.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def bucket_summary(workloads: list[str]) -> dict:
    """Paper Fig. 6 inputs: parameters and all-reduce calls per iteration (DDP's default caps, fp32)."""
    from ccddp.workloads import PAPER, bucket_plan

    out = {}
    for w in workloads:
        plan = bucket_plan(w, dtype="float32")
        out[w] = {"num_params": plan.num_params, "num_buckets": plan.num_buckets,
                  "bucket_bytes": list(plan.bucket_bytes), "dtype": "float32",
                  "paper_allreduce_calls": PAPER[w].get("fig6_allreduces")}
    return out


def new_results(plan: Plan) -> dict:
    return {"schema": SCHEMA, "machine": machine_info(), "config": plan.as_dict(), "buckets": {}, "runs": [],
            "projections": []}


def merge_run(data: dict, run: dict) -> None:
    data["runs"] = [r for r in data["runs"] if r["key"] != run["key"]] + [run]
    data["runs"].sort(key=lambda r: r["key"])


def pending(data: dict, plan: Plan) -> list[tuple[str, int]]:
    done = {r["key"] for r in data["runs"] if r["status"] == "ok"}
    return [(w, n) for w in plan.workloads for n in plan.world_sizes
            if not all(k in done for k in plan.keys(w, n))]


def train_args(plan: Plan, workload: str, json_path: str, timeout_s: float) -> list[str]:
    """``ccddp.bench.train`` arguments: every variant of ``workload`` in one launch, in turns."""
    args = ["--workload", workload, "--size", plan.size, "--cc", "off,on", "--schedule", ",".join(plan.schedules),
            "--steps", str(plan.steps), "--warmup", str(plan.warmup), "--block", str(FULL_BLOCK),
            "--trust-domains", plan.trust_domains, "--device", plan.device, "--placement", plan.placement,
            "--json", json_path, "--timeout", str(timeout_s)]
    if plan.budget_s:
        args += ["--budget", str(plan.budget_s)]
        if plan.precision:
            args += ["--precision", str(plan.precision)]
    for k, v in plan.overrides(workload).items():
        args += ["--" + k.replace("_", "-"), str(v)]
    return args


def run_group(plan: Plan, workload: str, ws: int, data: dict, out_path: str, timeout_s: float) -> None:
    """One torchrun launch for all variants of (workload, world size); merges its results."""
    from ccddp.bench.launch import torchrun

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "compare.json")
        error = None
        meter = LoadMeter()  # the load on the machine while this launch ran, for the report
        try:
            torchrun("ccddp.bench.train", train_args(plan, workload, path, timeout_s), nproc=ws, quiet=True,
                     timeout_s=timeout_s * 4 + 900 + 2 * (plan.budget_s or 0))
        except CCDDPError as e:
            error = str(e)
        except Exception as e:  # a timeout of the whole launch: record it, keep going
            error = f"{type(e).__name__}: {e}"
        launch = meter.stop()
        finished = {}
        if error is None and os.path.exists(path):
            with open(path) as f:
                compared = json.load(f)
            for result in compared.get("runs", [compared]):
                key = variant_key(result["workload"], result["world_size"], result["cc"], result["schedule"])
                finished[key] = result
    for key in plan.keys(workload, ws):
        _, _, cc, *sched = key.split("/")
        run = {"key": key, "workload": workload, "world_size": ws, "cc": cc.removeprefix("cc-"),
               "schedule": sched[0] if sched else None, "launch": launch}
        if key in finished:
            run.update(status="ok", error=None, result=finished[key])
        else:
            run.update(status="failed", error=error or "did not finish", result=None)
        merge_run(data, run)
    save(out_path, data)


def characterize(plan: Plan, out_dir: str, *, timeout_s: float = 600.0, progress=None,
                 project: bool = True) -> dict:
    """Run what ``out_dir/results.json`` lacks of ``plan``; return the results.

    ``progress(done, total, workload, world_size, data)`` is called before each launch
    (``data`` None) and after it (``data``: the results so far)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    data = load(path) or new_results(plan)
    held = data.get("config", {}).get("device", "cpu")
    if data["runs"] and held != plan.device:
        # Resuming merges runs by workload and world size: one folder, one device.
        raise ConfigError(f"{path} holds runs on {held}; give --device {plan.device} another --out")
    data["config"] = plan.as_dict()
    missing = [w for w in plan.workloads if w not in data["buckets"]]
    if missing:
        data["buckets"].update(bucket_summary(missing))
    save(path, data)
    todo = pending(data, plan)
    if todo:  # CC-on cost on CPU ranks follows the AES-GCM rate: record it for every session of runs
        data.setdefault("aes_gcm_rates", []).append(aes_gcm_rate())
    for i, (workload, ws) in enumerate(todo):
        if progress:
            progress(i, len(todo), workload, ws, None)
        run_group(plan, workload, ws, data, path, timeout_s)
        if progress:
            progress(i + 1, len(todo), workload, ws, data)
    if project:
        try:
            data["projections"] = projections(plan.workloads)
            data["fidelity"] = fidelity()
        except CCDDPError as e:  # the measurements stand without the model's projections
            data["projections"] = []
            data["projection_error"] = str(e)
        save(path, data)
    return data


def fidelity() -> dict:
    """The model against the published numbers (``ccddp fidelity``), for the report."""
    from ccddp.sim.fidelity import evaluate, summary

    rows = evaluate()
    return {"summary": summary(rows), "rows": rows}


def projections(workloads: list[str]) -> list[dict]:
    """Model projections to GPUs not measured here (paper-h100 profile), if the model is installed."""
    from ccddp.bench.projection import project_paper_gpus

    return project_paper_gpus(workloads)
