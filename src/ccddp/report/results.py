"""Reading a ``ccddp characterize`` results file, and looking runs up in it.

The report layer draws everything from one ``results.json`` (schema
``ccddp.characterize/1``). This module is the only place that knows its layout: it
checks the schema, tolerates what a partly failed characterization leaves behind
(failed runs, missing phases, a single world size, no naive schedule) and answers the
questions figures and tables ask, e.g. "CC-on pipelined at 3 ranks for resnet50, over
CC-off".

Example::

    from ccddp.report.results import Results

    res = Results.load("out/results.json")
    res.total_ms("resnet50", 2, "on", "pipelined")   # median ms/iteration, or None
    res.ratio("resnet50", 2, "pipelined")            # CC-on / CC-off, or None
    res.comparison("resnet50", 2, "pipelined")       # the same with its 95 % interval
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping

from ccddp.config import MAX_RESULTS_BYTES, RESULTS_DEPTH, read_json
from ccddp.errors import ConfigError
from ccddp.stats import Interval, median_interval, paired_ratio

SCHEMA = "ccddp.characterize/1"

#: Paper order (Table I); workloads not in it follow in the order the file lists them.
PAPER_ORDER = ("graphsage", "resnet50", "resnet101", "bert-base", "bert-large",
               "gpt2-large", "gpt2-xl")
#: Schedules in the order they are drawn: the paper's baseline first.
SCHEDULE_ORDER = ("naive", "pipelined")
#: CC-on phases of a train result's summary, in the order they happen in an iteration.
PHASES = ("data_ms", "bounce_ms", "forward_ms", "backward_ms", "exposed_comm_ms",
          "optimizer_ms")


def _number(x: Any) -> float | None:
    """A finite float, or None: JSON from a crashed run may hold null/NaN/strings."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def load_results(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """Read and check a results file (a path, or an already loaded dict).

    Raises :class:`~ccddp.errors.ConfigError` with a one-line reason when the file is
    missing, is not JSON, or has another schema.

    Example::

        data = load_results("out/results.json")
        data["schema"]        # "ccddp.characterize/1"
    """
    if isinstance(source, Mapping):
        data: Any = dict(source)
        where = "results"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise ConfigError(f"{path} does not exist; run `ccddp characterize` to produce it")
        # Bounded and typed (size, UTF-8, nesting before parsing, integers): ccddp.config.
        data = read_json(path, what=str(path), max_bytes=MAX_RESULTS_BYTES, max_depth=RESULTS_DEPTH)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object with schema {SCHEMA!r}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ConfigError(f"{where}: unsupported schema {schema!r}; this ccddp reads {SCHEMA!r}")
    if not isinstance(data.get("runs", []), list):
        raise ConfigError(f"{where}: 'runs' must be a list")
    return data


class Results:
    """An index over a loaded results dict; every accessor returns None for "not there".

    Example::

        res = Results(load_results("out/results.json"))
        for wl in res.workloads:
            for n in res.world_sizes:
                print(wl, n, res.ratio(wl, n, "naive"))
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.machine: dict = dict(data.get("machine") or {})
        self.config: dict = dict(data.get("config") or {})
        self.buckets: dict = {k: v for k, v in (data.get("buckets") or {}).items()
                              if isinstance(v, Mapping)}
        self.runs: list[dict] = [r for r in (data.get("runs") or []) if isinstance(r, Mapping)]
        self.projections: list[dict] = [p for p in (data.get("projections") or [])
                                        if isinstance(p, Mapping)]
        self.fidelity: dict = dict(data.get("fidelity") or {})
        self._index: dict[tuple, dict] = {}
        self._failed: set[tuple] = {self.key_of(r) for r in self.runs if not self.is_ok(r)}
        for r in self.runs:
            if self.is_ok(r):
                # First ok run of a configuration wins; a re-run appended later does not
                # silently replace what the figures were first drawn from.
                self._index.setdefault(self.key_of(r), r)

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any]) -> "Results":
        """``Results(load_results(source))``; also accepts a ``Results``."""
        if isinstance(source, Results):
            return source
        return cls(load_results(source))

    # -- runs ---------------------------------------------------------------------

    @staticmethod
    def key_of(run: Mapping[str, Any]) -> tuple:
        """``(workload, world_size, cc, schedule)``; CC-off has no schedule."""
        cc = run.get("cc")
        return (run.get("workload"), run.get("world_size"), cc,
                None if cc == "off" else run.get("schedule"))

    @staticmethod
    def is_ok(run: Mapping[str, Any]) -> bool:
        """An ok run with a result dict; "ok" without a result cannot be drawn."""
        return run.get("status") == "ok" and isinstance(run.get("result"), Mapping)

    @property
    def failed_runs(self) -> list[dict]:
        """Runs that did not produce a usable result, in file order."""
        return [r for r in self.runs if not self.is_ok(r)]

    def run(self, workload: str, world_size: int, cc: str,
            schedule: str | None = None) -> dict | None:
        """The ok run of one configuration (``schedule`` ignored for CC-off)."""
        return self._index.get((workload, world_size, cc, None if cc == "off" else schedule))

    def failed(self, workload: str, world_size: int, cc: str, schedule: str | None = None) -> bool:
        """True when this configuration was attempted, failed, and has no ok run."""
        key = (workload, world_size, cc, None if cc == "off" else schedule)
        return key in self._failed and key not in self._index

    def result(self, *key) -> dict | None:
        """The train result of :meth:`run`, or None."""
        r = self.run(*key)
        return r["result"] if r else None

    def summary(self, *key) -> dict:
        """The median phases of :meth:`run` (empty when absent)."""
        res = self.result(*key)
        s = res.get("summary") if res else None
        return dict(s) if isinstance(s, Mapping) else {}

    def total_ms(self, workload: str, world_size: int, cc: str,
                 schedule: str | None = None) -> float | None:
        """Median ms per iteration on rank 0 (the quantity the phases decompose)."""
        return _number(self.summary(workload, world_size, cc, schedule).get("total_ms"))

    def ratio(self, workload: str, world_size: int, schedule: str) -> float | None:
        """CC-on (``schedule``) over CC-off: the estimate of :meth:`comparison`, or None."""
        c = self.comparison(workload, world_size, schedule)
        return c.estimate if c else None

    def comparison(self, workload: str, world_size: int, schedule: str,
                   against: str | None = None) -> Interval | None:
        """CC-on with ``schedule`` over CC-off (``against=None``) or over CC-on with the
        schedule ``against``, per iteration on rank 0, or None when a run is missing.

        Runs measured in turns in one launch are paired by round: the median of the
        per-round ratios with its 95 % interval (:mod:`ccddp.stats`). Runs from
        separate launches (older results files) give the ratio of their medians, with
        ``n == 0`` and no interval."""
        num = self.run(workload, world_size, "on", schedule)
        den = self.run(workload, world_size, "off") if against is None else \
            self.run(workload, world_size, "on", against)
        if num is None or den is None:
            return None
        a, b = self.round_ms(num), self.round_ms(den)
        if a and b and _launch(num) is not None and _launch(num) == _launch(den):
            return paired_ratio(a, b)
        on = _number(self.summary_of(num).get("total_ms"))
        off = _number(self.summary_of(den).get("total_ms"))
        if on is None or off is None or off <= 0:
            return None
        return Interval(on / off, None, None, 0)

    @staticmethod
    def summary_of(run: Mapping[str, Any]) -> dict:
        s = run["result"].get("summary")
        return dict(s) if isinstance(s, Mapping) else {}

    @staticmethod
    def round_ms(run: Mapping[str, Any]) -> dict[int, float]:
        """:func:`round_ms` of an ok run's result."""
        return round_ms(run["result"])

    def time_interval(self, workload: str, world_size: int, cc: str,
                      schedule: str | None = None) -> Interval | None:
        """Median measured time per iteration on rank 0 with its 95 % interval."""
        res = self.result(workload, world_size, cc, schedule)
        if not res:
            return None
        return median_interval([it.get("total_ms") for it in res.get("iterations") or []
                                if isinstance(it, Mapping) and not it.get("warmup")])

    def phase_ms(self, workload: str, world_size: int, schedule: str) -> dict[str, float] | None:
        """CC-on phases (``PHASES`` plus ``crypto_busy_ms``) with missing ones as 0, or
        None when the run is absent or has no phase at all."""
        s = self.summary(workload, world_size, "on", schedule)
        vals = {k: _number(s.get(k)) for k in PHASES + ("crypto_busy_ms",)}
        if all(vals[k] is None for k in PHASES):
            return None
        return {k: (v if v is not None and v > 0 else 0.0) for k, v in vals.items()}

    # -- how a launch went -------------------------------------------------------------

    def launch_load(self, workload: str, world_size: int) -> dict | None:
        """The machine's load while the launch of (workload, world size) ran: load averages
        before and after, other processes' CPU seconds (``ccddp characterize`` records it;
        None in older results files)."""
        for r in self.runs:
            if r.get("workload") == workload and r.get("world_size") == world_size \
                    and isinstance(r.get("launch"), Mapping):
                return dict(r["launch"])
        return None

    def precision_check(self, workload: str, world_size: int) -> dict | None:
        """Whether the launch of (workload, world size) reached the precision target the
        study set: ``{"target", "widest", "met", "stop", "rounds", "missed": [schedules]}``;
        ``stop`` is why measuring ended ("precision", "time cap", "round cap", "steps"; None
        when the results file predates the record). None without a target or a result."""
        target = _number(self.config.get("precision"))
        ratios = {s: c for s in self.schedules if (c := self.comparison(workload, world_size, s)) is not None}
        if not target or not ratios:
            return None
        widths = {s: c.half_width for s, c in ratios.items()}
        missed = [s for s, w in widths.items() if w is None or w > target]
        off = self.result(workload, world_size, "off") or {}
        pairing = off.get("pairing") if isinstance(off.get("pairing"), Mapping) else {}
        known = [w for w in widths.values() if w is not None]
        return {"target": target, "widest": max(known) if known else None, "met": not missed,
                "missed": missed, "stop": pairing.get("stop"), "rounds": pairing.get("rounds")}

    # -- axes -----------------------------------------------------------------------

    @property
    def workloads(self) -> list[str]:
        """Every workload named anywhere, paper order first."""
        seen = _unique(list(self.config.get("workloads") or []) + list(self.buckets)
                       + [r.get("workload") for r in self.runs])
        seen = [w for w in seen if isinstance(w, str)]
        return [w for w in PAPER_ORDER if w in seen] + [w for w in seen if w not in PAPER_ORDER]

    @property
    def world_sizes(self) -> list[int]:
        """World sizes configured or run, ascending."""
        sizes = list(self.config.get("world_sizes") or []) + [r.get("world_size") for r in self.runs]
        return sorted({n for n in sizes if isinstance(n, int) and not isinstance(n, bool)})

    @property
    def schedules(self) -> list[str]:
        """CC-on schedules configured or run; naive (the paper's) first."""
        found = _unique(list(self.config.get("schedules") or []) +
                        [r.get("schedule") for r in self.runs if r.get("cc") == "on"])
        found = [s for s in found if isinstance(s, str)]
        return [s for s in SCHEDULE_ORDER if s in found] + [s for s in found if s not in SCHEDULE_ORDER]

    def measured_workloads(self) -> list[str]:
        """Workloads with at least one ok run."""
        ok = {r.get("workload") for r in self.runs if self.is_ok(r)}
        return [w for w in self.workloads if w in ok]

    def measured_allreduces(self, workload: str) -> list[int]:
        """Distinct all-reduce calls per (steady) iteration measured in ok runs."""
        vals = []
        for r in self.runs:
            if self.is_ok(r) and r.get("workload") == workload:
                k = r["result"].get("allreduce_calls_per_iteration")
                if isinstance(k, int) and not isinstance(k, bool):
                    vals.append(k)
        return sorted(set(vals))

    def shapes(self, workload: str) -> list[dict]:
        """Distinct ``shapes`` dicts the workload ran with (normally one)."""
        out: list[dict] = []
        for r in self.runs:
            if self.is_ok(r) and r.get("workload") == workload:
                s = r["result"].get("shapes")
                if isinstance(s, Mapping) and dict(s) not in out:
                    out.append(dict(s))
        return out


def round_ms(result: Mapping[str, Any]) -> dict[int, float]:
    """Measured time per iteration on rank 0 of a train result, by round (a round's median
    when it ran a block of iterations); empty for results without rounds."""
    by_round: dict[int, list[float]] = {}
    for it in result.get("iterations") or []:
        if not isinstance(it, Mapping) or it.get("warmup"):
            continue
        r, t = it.get("round"), _number(it.get("total_ms"))
        if isinstance(r, int) and not isinstance(r, bool) and t is not None:
            by_round.setdefault(r, []).append(t)
    return {r: statistics.median(ts) for r, ts in by_round.items()}


def _launch(run: Mapping[str, Any]) -> str | None:
    """The id of the launch whose variants took turns (absent in older results)."""
    pairing = run["result"].get("pairing")
    return pairing.get("launch") if isinstance(pairing, Mapping) else None


def _unique(items: Iterable) -> list:
    out: list = []
    for x in items:
        if x is not None and x not in out:
            out.append(x)
    return out


__all__ = ["SCHEMA", "PHASES", "PAPER_ORDER", "SCHEDULE_ORDER", "load_results", "round_ms", "Results"]
