"""Per-rank crypto counters: what was sealed and opened, and the time it took.

``seals``/``opens`` count messages (one ring step's chunk, whatever its segmentation),
so one ring all-reduce shows the paper's 2(n-1) seals and 2(n-1) opens per rank (a
two-rank exchange, counted in ``exchanges``, n-1 of each);
``segments_sealed``/``segments_opened`` count AEAD frames (tags).
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field, fields


@dataclass
class CryptoCounters:
    seals: int = 0
    opens: int = 0
    segments_sealed: int = 0
    segments_opened: int = 0
    bytes_sealed: int = 0
    bytes_opened: int = 0
    busy_seconds: float = 0.0
    control_seals: int = 0
    control_opens: int = 0
    # All-reduces run as one two-rank exchange (issue 42): n-1 seals and opens, not 2(n-1).
    exchanges: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_frame(self, sealed: bool, nbytes: int, seconds: float) -> None:
        with self._lock:
            if sealed:
                self.segments_sealed += 1
                self.bytes_sealed += nbytes
            else:
                self.segments_opened += 1
                self.bytes_opened += nbytes
            self.busy_seconds += seconds

    def add_message(self, sealed: bool, control: bool = False) -> None:
        with self._lock:
            if control:
                if sealed:
                    self.control_seals += 1
                else:
                    self.control_opens += 1
            elif sealed:
                self.seals += 1
            else:
                self.opens += 1

    def add_exchange(self) -> None:
        with self._lock:
            self.exchanges += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in _COUNTER_NAMES}

    def values(self) -> tuple:
        """The counters as a tuple, in :meth:`snapshot`'s order: what the op queue takes
        twice per op (issue 42: a fraction of a dict snapshot's cost)."""
        with self._lock:
            return _VALUES(self)

    @staticmethod
    def as_dict(values: tuple) -> dict:
        """A :meth:`values` tuple as a :meth:`snapshot` dict."""
        return dict(zip(_COUNTER_NAMES, values))

    def reset(self) -> None:
        with self._lock:
            for f in fields(self):
                if not f.name.startswith("_"):
                    setattr(self, f.name, f.default)

    @staticmethod
    def diff(after: dict, before: dict) -> dict:
        return {k: after[k] - before[k] for k in after}

    @staticmethod
    def total(snapshots: list[dict]) -> dict:
        """The sum of several snapshots (a group's counters and its sub-groups')."""
        # Twice per op of the ccddp backend, mostly over one snapshot: no generator per field
        # (issue 42: 6.5 us of the op's fixed cost as a comprehension of sums).
        if not snapshots:
            return {k: 0 for k in _COUNTER_NAMES}
        out = {k: snapshots[0][k] for k in _COUNTER_NAMES}
        for s in snapshots[1:]:
            for k in _COUNTER_NAMES:
                out[k] += s[k]
        return out


class CountersByOp:
    """Counter deltas summed per operation name: what each kind of op sealed and opened.

    Whoever runs the ops adds each one's delta (a :meth:`CryptoCounters.diff` of snapshots
    taken around it; or, cheaper, :meth:`add_between` the :meth:`CryptoCounters.values`
    taken around it) under its name; readers on other threads take a :meth:`snapshot`.

    Example::

        by_op = CountersByOp()
        by_op.add("all_reduce", CryptoCounters.diff(after, before))
        by_op.add_between("all_reduce", counters.values(), before_values)
        by_op.snapshot()["all_reduce"]["seals"]     # 2(n-1) per ring all-reduce
        by_op.get("broadcast")                       # zeros: none ran
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Per op name, its counters as a tuple in ``_COUNTER_NAMES`` order.
        self._by_op: dict[str, tuple] = {}

    def add(self, op: str, delta: dict) -> None:
        self._add(op, tuple(delta[k] for k in _COUNTER_NAMES))

    def add_between(self, op: str, after: tuple, before: tuple) -> None:
        """Add ``after - before`` (two :meth:`CryptoCounters.values`) under ``op``."""
        self._add(op, tuple(map(operator.sub, after, before)))

    def _add(self, op: str, delta: tuple) -> None:
        with self._lock:
            total = self._by_op.get(op)
            self._by_op[op] = delta if total is None else tuple(map(operator.add, total, delta))

    def get(self, op: str) -> dict:
        """``op``'s counters (every field zero if no op of that name ran)."""
        with self._lock:
            found = self._by_op.get(op)
        return CryptoCounters.as_dict(found) if found is not None else CryptoCounters().snapshot()

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            found = dict(self._by_op)
        return {op: CryptoCounters.as_dict(c) for op, c in found.items()}


# The public counter fields, in declaration order (snapshot runs twice per collective).
_COUNTER_NAMES = tuple(f.name for f in fields(CryptoCounters) if not f.name.startswith("_"))
_VALUES = operator.attrgetter(*_COUNTER_NAMES)
