"""Workload profiles: what one training iteration of a model asks of a device.

Plain data, so the model never needs torch: bucket sizes in DDP launch order, when each
bucket's gradients are ready during backward, and phase times. The CLI builds one from
``ccddp.workloads`` (real DDP bucket plans) or reads a JSON file written from a measured
run.

Example::

    wl = WorkloadProfile("toy", bucket_bytes=(4 << 20, 25 << 20), forward_ms=10,
                         backward_ms=20, optimizer_ms=1, input_bytes=1 << 20)
    wl.ready_ms()            # [~2.7, 20.0]: evenly by bytes through backward
    wl.rebucket(8 << 20).num_buckets
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ccddp.config import read_json
from ccddp.errors import ConfigError

MIB = 1 << 20
# DDP's default: a small first bucket so the first all-reduce starts early, 25 MiB after.
DDP_FIRST_BUCKET_BYTES = 1 * MIB
DDP_BUCKET_BYTES = 25 * MIB

JSON_REQUIRED = ("name", "bucket_bytes", "forward_ms", "backward_ms", "optimizer_ms",
                 "input_bytes")


@dataclass(frozen=True)
class WorkloadProfile:
    """One DDP iteration of one rank, as the model sees it.

    - ``bucket_bytes``: gradient bytes per bucket, in launch order (bucket 0 = last layers).
    - ``ready_fraction``: fraction of backward elapsed when each bucket is ready; ``None``
      means evenly by bytes (bucket i ready when its cumulative share of bytes is done).
    - ``param_bytes``: per-parameter gradient bytes in bucket-fill order (reverse of
      ``model.parameters()``), so :meth:`rebucket` can reproduce DDP's greedy assignment.
    - ``data_ms``: data loading/preprocessing for this rank's batch;
      ``input_bytes``: that batch's size host-to-device;
      ``kernel_launches``: launches per iteration that pay CC's launch toll.
    - ``measured_ranks``: how many ranks shared the host when the phase times were
      measured (a profile written from an n-rank run on a CPU host); the model only adds
      the contention beyond that.
    - ``backward_core_ms``: the part of ``backward_ms`` that is the rank's own core work
      (a measured run: its compute thread's CPU time, in wall time on the cores the
      measured ranks shared); the rest is waiting for peers, and on shared host cores
      other work -- the collectives' -- runs in it. ``None``: all of ``backward_ms``.
    """

    name: str
    bucket_bytes: tuple[int, ...]
    forward_ms: float
    backward_ms: float
    optimizer_ms: float = 0.0
    input_bytes: float = 0.0
    data_ms: float = 0.0
    kernel_launches: float = 0.0
    ready_fraction: tuple[float, ...] | None = None
    param_bytes: tuple[int, ...] | None = None
    measured_ranks: int = 1
    backward_core_ms: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bucket_bytes", tuple(int(b) for b in self.bucket_bytes))
        if not self.bucket_bytes:
            raise ConfigError(f"workload {self.name!r}: bucket_bytes is empty")
        if any(b <= 0 for b in self.bucket_bytes):
            raise ConfigError(f"workload {self.name!r}: bucket_bytes must all be > 0")
        for key in ("forward_ms", "backward_ms", "optimizer_ms", "input_bytes", "data_ms",
                    "kernel_launches"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ConfigError(f"workload {self.name!r}: {key} must be a finite "
                                  f"non-negative number, got {v!r}")
        if isinstance(self.measured_ranks, bool) or not isinstance(self.measured_ranks, int) \
                or self.measured_ranks < 1:
            raise ConfigError(f"workload {self.name!r}: measured_ranks must be an integer "
                              f">= 1, got {self.measured_ranks!r}")
        core = self.backward_core_ms
        if core is not None and (isinstance(core, bool) or not isinstance(core, (int, float))
                                 or not 0 <= core <= self.backward_ms):
            raise ConfigError(f"workload {self.name!r}: backward_core_ms must be a number "
                              f"from 0 to backward_ms ({self.backward_ms}), got {core!r}")
        if self.ready_fraction is not None:
            rf = tuple(float(x) for x in self.ready_fraction)
            if len(rf) != len(self.bucket_bytes):
                raise ConfigError(f"workload {self.name!r}: ready_fraction has {len(rf)} "
                                  f"entries for {len(self.bucket_bytes)} buckets")
            if any(not 0 <= x <= 1 for x in rf) or any(b < a for a, b in zip(rf, rf[1:])):
                raise ConfigError(f"workload {self.name!r}: ready_fraction must rise "
                                  "within [0, 1]")
            object.__setattr__(self, "ready_fraction", rf)
        if self.param_bytes is not None:
            pb = tuple(int(p) for p in self.param_bytes)
            if sum(pb) != sum(self.bucket_bytes) or any(p < 0 for p in pb):
                raise ConfigError(f"workload {self.name!r}: param_bytes must be non-negative "
                                  "and sum to the bucket bytes")
            object.__setattr__(self, "param_bytes", pb)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def ready_fractions(self) -> list[float]:
        if self.ready_fraction is not None:
            return list(self.ready_fraction)
        total, acc, out = self.total_bytes, 0, []
        for b in self.bucket_bytes:
            acc += b
            out.append(acc / total)
        return out

    def ready_ms(self) -> list[float]:
        """When each bucket is ready, in ms after backward starts."""
        return [f * self.backward_ms for f in self.ready_fractions()]

    def rebucket(self, cap_bytes: float, first_cap_bytes: float | None = None
                 ) -> "WorkloadProfile":
        """The same model bucketed with another cap (DDP's greedy rule: a bucket closes
        once it reaches the cap). ``first_cap_bytes`` defaults to ``cap_bytes``, as when
        ``bucket_cap_mb`` is passed to DDP. Without ``param_bytes`` the gradient is treated
        as divisible anywhere, so every bucket but the last holds exactly the cap.
        """
        if not cap_bytes > 0:
            raise ConfigError(f"bucket cap must be > 0, got {cap_bytes}")
        first = cap_bytes if first_cap_bytes is None else first_cap_bytes
        if self.param_bytes is not None:
            sizes = _greedy(self.param_bytes, first, cap_bytes)
        else:
            sizes = _even(self.total_bytes, first, cap_bytes)
        # Carry a measured ready curve over by interpolating it at the new boundaries.
        ready = None
        if self.ready_fraction is not None:
            ready = tuple(self._ready_at_offset(off) for off in _cumsum(sizes))
        return replace(self, bucket_bytes=tuple(sizes), ready_fraction=ready)

    def _ready_at_offset(self, offset: float) -> float:
        xs = [0.0] + [float(x) for x in _cumsum(self.bucket_bytes)]
        ys = [0.0] + self.ready_fractions()
        i = min(max(bisect.bisect_left(xs, offset), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y1 if x1 == x0 else y0 + (y1 - y0) * (offset - x0) / (x1 - x0)

    def as_dict(self) -> dict[str, Any]:
        # JSON lists for the sequences; optional fields left out when unset.
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        return {k: v for k, v in d.items()
                if v is not None or k not in ("ready_fraction", "param_bytes", "backward_core_ms")}


def _cumsum(xs: Sequence[float]) -> list[float]:
    acc, out = 0.0, []
    for x in xs:
        acc += x
        out.append(acc)
    return out


def _greedy(param_bytes: Sequence[int], first_cap: float, cap: float) -> list[int]:
    sizes, cur, limit = [], 0, first_cap
    for p in param_bytes:
        cur += p
        if cur >= limit:
            sizes.append(cur)
            cur, limit = 0, cap
    if cur:
        sizes.append(cur)
    return sizes or [sum(param_bytes)]


def _even(total: int, first_cap: float, cap: float) -> list[int]:
    sizes, left, limit = [], total, first_cap
    while left > 0:
        take = int(min(left, max(1, math.ceil(limit))))
        sizes.append(take)
        left -= take
        limit = cap
    return sizes


def workload_from_dict(d: Mapping[str, Any], *, source: str = "<dict>") -> WorkloadProfile:
    """Build a profile from the JSON layout ``{"name", "bucket_bytes", "forward_ms",
    "backward_ms", "optimizer_ms", "input_bytes"}`` (+ optional ``data_ms``,
    ``kernel_launches``, ``ready_fraction``, ``param_bytes``, ``measured_ranks``,
    ``backward_core_ms``)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{source}: a workload profile must be a JSON object")
    for key in JSON_REQUIRED:
        if key not in d:
            raise ConfigError(f"{source}: workload profile field '{key}' is missing")
    known = set(JSON_REQUIRED) | {"data_ms", "kernel_launches", "ready_fraction",
                                  "param_bytes", "measured_ranks", "backward_core_ms"}
    extra = {k: d[k] for k in known if k in d}
    bb = extra.get("bucket_bytes")
    if not isinstance(bb, list) or not all(isinstance(b, (int, float)) and not
                                           isinstance(b, bool) for b in bb):
        raise ConfigError(f"{source}: workload profile field 'bucket_bytes' must be a list "
                          "of byte counts")
    return WorkloadProfile(**extra)


def load_workload_profile(path: str | Path) -> WorkloadProfile:
    """Read a workload profile JSON file (e.g. written from a measured run)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"workload profile not found: {p}")
    # Bounded and typed (size, UTF-8, nesting before parsing, integers): ccddp.config.
    data = read_json(p, what=str(p))
    return workload_from_dict(data, source=str(p))


def derive_workload(name: str, bucket_bytes: Sequence[int], hw: Any, *,
                    batch_size: float = 0.0, forward_flops_per_sample: float = 0.0,
                    input_bytes: float = 0.0, param_bytes: Sequence[int] | None = None,
                    kernel_launches: float = 0.0) -> WorkloadProfile:
    """Phase times from FLOPs and the profile's compute rate; measured values in the
    profile's ``[workloads.<name>]`` table win over derived ones.

    Example::

        derive_workload("bert-base", plan.bucket_bytes, load_profile("h100-cc"),
                        batch_size=128, forward_flops_per_sample=2.9e10)
    """
    total = float(sum(bucket_bytes))
    fwd = batch_size * forward_flops_per_sample / (hw.compute_tflops * 1e12) * 1e3
    values = {
        "forward_ms": fwd,
        "backward_ms": fwd * hw.backward_ratio,
        "optimizer_ms": total / (hw.optimizer_gbps * 1e9) * 1e3,
        "input_bytes": float(input_bytes),
        "data_ms": 0.0,
        "kernel_launches": float(kernel_launches),
    }
    over = hw.workload_overrides(name)
    if "forward_ms" in over and "backward_ms" not in over:
        over["backward_ms"] = over["forward_ms"] * hw.backward_ratio
    values.update(over)
    return WorkloadProfile(name=name, bucket_bytes=tuple(bucket_bytes),
                           param_bytes=tuple(param_bytes) if param_bytes else None, **values)


def paper_input_bytes(setup: Mapping[str, Any], *, num_features: int = 100) -> float:
    """Bytes one device's batch sends host-to-device, from a ``paper_setup`` dict.

    Images travel as uint8 pixels (the paper's ResNet input is 1.5x ResNet-50's gradient
    bytes: 1024 x 3 x 224 x 224 B); text as int64 ids + attention mask; a graph batch as
    fp32 node features plus int64 edges of the tree-shaped neighbour sample (an upper
    bound: real samples share nodes).
    """
    batch = float(setup.get("batch_size", 0))
    if "image_size" in setup:
        return batch * 3 * float(setup["image_size"]) ** 2
    if "seq_len" in setup:
        return batch * float(setup["seq_len"]) * 8 * 2
    if "fanouts" in setup:
        nodes, frontier = 1.0, 1.0
        for f in setup["fanouts"]:
            frontier *= f
            nodes += frontier
        return batch * (nodes * num_features * 4 + (nodes - 1) * 16)
    return 0.0


__all__ = ["WorkloadProfile", "workload_from_dict", "load_workload_profile",
           "derive_workload", "paper_input_bytes", "DDP_FIRST_BUCKET_BYTES",
           "DDP_BUCKET_BYTES", "MIB"]
