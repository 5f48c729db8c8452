"""An opt-in timing probe: where the microseconds of one sealed collective go (issue 42).

Invariants:

- **Off by default, free when off.** ``CCDDP_PROBE`` unset, :data:`ON` is False and every
  call site is ``if probe.ON: probe.stamp(...)``: one module attribute read per stage, no
  call, no allocation.
- **One op at a time, one thread.** The thread that began an op owns it: stamps from any
  other thread are ignored (the caller queueing the next op while the worker runs this
  one). The op queue runs one op at a time, so the owner's stamps between :func:`begin`
  and :func:`end` are that op's alone. Crypto on the pool threads is seen from the owner
  (submit to result). The state is module-global, read unlocked: a stamp racing a
  begin on another thread can at worst misfile one interval of a probe run, never
  affect the op.
- **Stages are intervals.** A stamp names the interval that ends at it: the time since the
  previous stamp is charged to that name. So the stages of an op add up to its wall time
  from :func:`begin` to :func:`end`, with nothing counted twice and nothing lost.
- **What leaves the process.** ``CCDDP_PROBE=PREFIX`` writes ``PREFIX.rank<R>.json`` at
  exit: per op name, the number of ops and per stage the list of per-op nanoseconds
  (only ops with at most :data:`MAX_OPS` kept). Only timings: no data, no key material.

Example::

    CCDDP_PROBE=/tmp/probe torchrun --nproc-per-node 2 script.py   # then
    python benchmarks/small-ops/breakdown.py /tmp/probe.rank0.json
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

ENV = "CCDDP_PROBE"
#: Ops kept per op name (a long run keeps its first ones).
MAX_OPS = 20000

_prefix = os.environ.get(ENV, "")
ON: bool = bool(_prefix)

_now = time.perf_counter_ns
_ident = threading.get_ident
_current: dict[str, int] | None = None   # stage -> ns of the op being probed
_owner = 0                               # the thread that began it: only its stamps count
_last = 0
_name = ""
_ops: dict[str, list[dict[str, int]]] = {}


def begin(name: str) -> bool:
    """Start probing an op called ``name``; False (and nothing changes) when an op is
    already being probed: the caller nests inside it and must not :func:`end` it."""
    global _current, _last, _name, _owner
    if _current is not None:
        return False
    _current, _name, _owner, _last = {}, name, _ident(), _now()
    return True


def stamp(stage: str) -> None:
    """Charge the time since the previous stamp to ``stage``."""
    global _last
    if _current is None or _ident() != _owner:
        return
    t = _now()
    _current[stage] = _current.get(stage, 0) + t - _last
    _last = t


def end(stage: str = "complete") -> None:
    """Close the op (the time since the last stamp goes to ``stage``) and keep it."""
    global _current
    if _current is None or _ident() != _owner:
        return
    stamp(stage)
    kept = _ops.setdefault(_name, [])
    if len(kept) < MAX_OPS:
        kept.append(_current)
    _current = None


def ops() -> dict[str, list[dict[str, int]]]:
    """Every op probed so far, per name: one {stage: ns} per op."""
    return _ops


def reset() -> None:
    _ops.clear()


def _dump() -> None:
    if not _ops:
        return
    rank = os.environ.get("RANK", "0")
    with open(f"{_prefix}.rank{rank}.json", "w") as f:
        json.dump({"schema": "ccddp.probe/1", "rank": int(rank), "ops": _ops}, f)


if ON:
    atexit.register(_dump)
