"""Tables people already know how to read (nccl-tests columns for collectives), laid out
for where they are printed.

A table fits at most 120 columns (:data:`COMPACT_WIDTH`; less on a narrower terminal):
headers wrap, and when the cells still do not fit, optional columns are left out (named
under the table; ``--json`` keeps everything). A cell is never cut, so implementation
names such as ``secure-naive`` and ``secure`` stay apart. With a command's ``--wide`` a
table takes the terminal's whole width, or printed to a pipe, a file or a CI log its
natural width, one row per line.

Example::

    cols = [Col("impl", lambda r: r["impl"], "left"), Col("time (us)", lambda r: f"{r['t']:.1f}", drop=1)]
    print_rows(cols, rows, title="demo", notes=["time: median over calls"])
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table


#: Every table (and the compact collectives table: nccl-tests' columns, the implementation
#: and the paired ratio with its interval) stays within this many columns by default; a
#: command's --wide shows every column at the terminal's (or, off one, the natural) width.
COMPACT_WIDTH = 120


@dataclass(frozen=True)
class Col:
    """A column: ``cell(row)`` gives its text. ``drop``: 0 keeps it at any width; when the
    terminal is too narrow, columns with the highest ``drop`` are left out first."""

    header: str
    cell: Callable[[dict], str]
    justify: str = "right"
    drop: int = 0


def _width(col: Col, rows: Sequence[dict]) -> int:
    """Columns the cells need (headers may wrap at spaces)."""
    words = max(len(w) for w in col.header.split()) if col.header.strip() else 1
    return max([words] + [len(col.cell(r)) for r in rows])


def fit(cols: Sequence[Col], rows: Sequence[dict], width: int | None) -> tuple[list[Col], list[Col]]:
    """(kept, left out): the columns that fit ``width`` characters (None: all), dropping
    non-essential ones from the end."""
    kept = list(cols)
    if width is None:
        return kept, []
    dropped: list[Col] = []

    def need(cs: Sequence[Col]) -> int:
        return sum(_width(c, rows) + 3 for c in cs) + 1  # padding and a border per column

    while need(kept) > width:
        optional = [c for c in kept if c.drop]
        if not optional:
            break
        first = max(optional, key=lambda c: c.drop)
        kept.remove(first)
        dropped.append(first)
    return kept, dropped


def make_table(cols: Sequence[Col], rows: Sequence[dict], title: str = "", fitted: bool = False) -> Table:
    """The rows as a rich table; ``fitted``: every column exactly as wide as its widest
    cell (headers wrap at spaces), as :func:`fit` counted."""
    t = Table(title=title, show_lines=False)
    for c in cols:
        t.add_column(c.header, justify=c.justify, width=_width(c, rows) if fitted else None)
    for r in rows:
        t.add_row(*(c.cell(r) for c in cols))
    return t


def terminal_width(stream=None) -> int | None:
    """The terminal's width, or None when output is not a terminal (no width to fit)."""
    stream = stream or sys.stdout
    return shutil.get_terminal_size().columns if stream.isatty() else None


def default_width(stream=None, wide: bool = False) -> int | None:
    """The width a table is fitted to when the caller gives none: the terminal's, at most
    :data:`COMPACT_WIDTH` (a pipe: COMPACT_WIDTH); ``wide`` (a command's ``--wide``): the
    terminal's whole width, or off a terminal the table's natural width (None)."""
    term = terminal_width(stream or sys.stdout)
    if wide:
        return term
    return min(term or COMPACT_WIDTH, COMPACT_WIDTH)


def print_rows(cols: Sequence[Col], rows: Sequence[dict], *, title: str = "", notes: Sequence[str] = (),
               width: int | None = None, stream=None, wide: bool = False) -> None:
    """Print ``rows`` as a table fitted to ``width`` (default: :func:`default_width`, at
    most COMPACT_WIDTH columns unless ``wide``), then the ``notes`` (footnotes) and, if
    columns were left out for width, which ones."""
    stream = stream or sys.stdout
    width = width if width is not None else default_width(stream, wide)
    kept, dropped = fit(cols, rows, width)
    table = make_table(kept, rows, title, fitted=width is not None)
    _console(table, width, stream).print(table)
    lines = list(notes)
    if dropped:
        lines.append(f"Left out to fit {width} columns: {', '.join(c.header for c in dropped)} "
                     f"({'a wider terminal' if wide else '--wide'} or --json shows them).")
    for line in lines:
        print(textwrap.fill(line, width, subsequent_indent="  ") if width else line, file=stream)


def print_table(table: Table, width: int | None = None, stream=None) -> None:
    """Print a ready-made rich table: at the terminal's width, or off a terminal at the
    table's natural width (one row per line, for logs)."""
    stream = stream or sys.stdout
    _console(table, width if width is not None else terminal_width(stream), stream).print(table)


def _console(table: Table, width: int | None, stream) -> Console:
    if width is None:
        width = Console(width=10_000).measure(table).maximum
    return Console(width=width, file=stream, highlight=False)


# -- collectives ------------------------------------------------------------------------------



def collectives_columns(ref: str, wide: bool = True) -> list[Col]:
    """nccl-tests columns (size, count, type, redop, time, algbw, busbw, #wrong) and each
    row's paired ratio to the first implementation ``ref`` with its 95 % interval;
    ``wide`` adds the operation, the crypto counters ccddp adds, the CPU time a rank spent
    in the call where it was measured, and for secure rows the additive floor (``ref``'s
    time plus the row's AES-GCM bytes at the rate measured on this machine) and the row's
    ratio to it."""
    def num(key: str, fmt: str) -> Callable[[dict], str]:
        return lambda r: format(r[key], fmt) if r.get(key) is not None else "-"

    def paired(r: dict) -> str:
        if r["impl"] == ref:
            return "1"
        from ccddp.stats import Interval, ratio_text

        iv = r.get("paired_ratio_intervals", {}).get(ref)
        if iv and iv[0] is not None:
            return ratio_text(Interval(*iv))      # the one way every ratio is printed
        p = r.get("paired_ratios", {})
        if ref not in p:
            return "-"
        # A row from before intervals were recorded: the estimate alone, in the same words.
        return ratio_text(Interval(p[ref], None, None, 0)).replace(" (not measured in turns, no interval)", "")

    if not wide:
        return [
            Col("impl", lambda r: r["impl"], "left"),
            Col("size (B)", lambda r: str(r["bytes"])),
            Col("count", lambda r: str(r["count"]), drop=4),
            Col("type", lambda r: r["type"], "left", drop=2),
            Col("redop", lambda r: r["redop"], "left", drop=3),
            Col("time (us)", num("time_us", ".1f")),
            Col("algbw (GB/s)", num("algbw_gbps", ".3f"), drop=1),
            Col("busbw (GB/s)", num("busbw_gbps", ".3f")),
            Col("#wrong", lambda r: str(r["wrong"])),
            Col(f"vs {ref} ¹ (95 % interval)", paired),
        ]
    return [
        Col("impl", lambda r: r["impl"], "left"),
        Col("op", lambda r: r["op"], "left", drop=8),
        Col("size (B)", lambda r: str(r["bytes"])),
        Col("count", lambda r: str(r["count"]), drop=14),
        Col("type", lambda r: r["type"], "left", drop=13),
        Col("redop", lambda r: r["redop"], "left", drop=12),
        Col("time (us)", num("time_us", ".1f")),
        Col("algbw (GB/s)", num("algbw_gbps", ".3f"), drop=7),
        Col("busbw (GB/s)", num("busbw_gbps", ".3f")),
        Col("#wrong", lambda r: str(r["wrong"])),
        Col("cpu (us)/rank", num("cpu_us_per_rank", ".1f"), drop=6),
        Col("seals/rank", num("seals_per_rank", "g"), drop=10),
        Col("opens/rank", num("opens_per_rank", "g"), drop=9),
        Col("tags", lambda r: r["tag_granularity"], "left", drop=11),
        Col(f"vs {ref} ¹", paired),
        Col("additive floor (us) ²", num("additive_floor_us", ".1f"), drop=5),
        Col("vs floor ²", num("vs_additive_floor", ".2f"), drop=4),
    ]


def collectives_notes(ref: str, aes: dict | None, wide: bool = True) -> list[str]:
    """Footnotes of the collectives table: how the paired column and the floor are computed."""
    notes = [f"¹ vs {ref}: the row's time / {ref}'s time in the same iteration (the implementations "
             "took turns call by call), Hodges-Lehmann estimate over iterations with its 95 % interval "
             "(a plain median where there is none), so it differs from the ratio of the time column's "
             "medians."]
    if not wide:
        return notes + ["--wide (or --json) adds the operation, CPU time, seals and opens per rank, tags "
                        "and the additive floor of the secure rows."]
    if aes:
        notes.append(f"² additive floor: {ref}'s time + the row's AES-GCM bytes per rank at this machine's "
                     f"rate measured in this run (one thread, {aes['bytes'] >> 10} KiB messages: seal "
                     f"{aes['seal_gbps']:.2f} GB/s, open {aes['open_gbps']:.2f} GB/s). vs floor < 1: the "
                     "crypto overlapped the transfer; > 1: it cost more than its bytes at that rate.")
    return notes


def add_additive_floor(rows: list[dict], aes: dict, ref: str = "gloo") -> None:
    """Add ``additive_floor_us`` and ``vs_additive_floor`` to every secure row of ``rows``
    that has a ``ref`` row of the same op and size (``aes``: seal/open GB/s)."""
    base = {(r["op"], r["bytes"]): r["time_us"] for r in rows if r["impl"] == ref}
    for r in rows:
        crypto = r.get("bytes_sealed_per_rank", 0) / aes["seal_gbps"] + r.get("bytes_opened_per_rank", 0) / aes["open_gbps"]
        if crypto and (r["op"], r["bytes"]) in base:
            floor_us = base[(r["op"], r["bytes"])] + crypto / 1e3  # bytes / (GB/s) = ns
            r["additive_floor_us"] = floor_us
            r["vs_additive_floor"] = r["time_us"] / floor_us


def print_collectives(rows: list[dict], title: str = "", aes: dict | None = None, wide: bool = False,
                      **kw) -> None:
    """The collectives table: one per operation, nccl-tests' columns and the paired ratio
    (within :data:`COMPACT_WIDTH` columns); ``wide``: every column, in one table."""
    ref = rows[0]["impl"] if rows else ""
    if wide:
        print_rows(collectives_columns(ref), rows, title=title, notes=collectives_notes(ref, aes), wide=True, **kw)
        return
    ops = list(dict.fromkeys(r["op"] for r in rows)) or [""]
    stream = kw.get("stream") or sys.stdout
    if kw.get("width") is None:  # a terminal's width, at most COMPACT_WIDTH; a pipe: COMPACT_WIDTH
        kw["width"] = min(terminal_width(stream) or COMPACT_WIDTH, COMPACT_WIDTH)
    for i, op in enumerate(ops):
        part = [r for r in rows if r["op"] == op]
        print_rows(collectives_columns(ref, wide=False), part, title=f"{title}, {op}" if op else title,
                   notes=collectives_notes(ref, aes, wide=False) if i == len(ops) - 1 else (), **kw)


def collectives_table(rows: list[dict], title: str = "") -> Table:
    """Every collectives column as one rich table (no fitting)."""
    ref = rows[0]["impl"] if rows else ""
    return make_table(collectives_columns(ref), rows, title)
