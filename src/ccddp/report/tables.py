"""Tables people already know how to read: nccl-tests columns for collectives."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def collectives_table(rows: list[dict], title: str = "") -> Table:
    """nccl-tests columns (size, count, type, redop, time, algbw, busbw, #wrong) plus the
    crypto counters ccddp adds, the CPU time a rank spent in the call (user + system,
    all threads) where it was measured, and each row's paired ratio to the first
    implementation (median of per-iteration ratios; see ``ccddp.bench.collectives``)."""
    ref = rows[0]["impl"] if rows else ""
    t = Table(title=title, show_lines=False)
    for col in ("impl", "op", "size (B)", "count", "type", "redop", "time (us)", "algbw (GB/s)",
                "busbw (GB/s)", "#wrong", "cpu (us)/rank", "seals/rank", "opens/rank", "tags",
                f"vs {ref}"):
        t.add_column(col, justify="left" if col in ("impl", "op", "type", "redop", "tags") else "right")
    for r in rows:
        paired = r.get("paired_ratios", {})
        vs = "1.00" if r["impl"] == ref else (f"{paired[ref]:.2f}" if ref in paired else "-")
        t.add_row(r["impl"], r["op"], str(r["bytes"]), str(r["count"]), r["type"], r["redop"],
                  f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}", str(r["wrong"]),
                  f"{r['cpu_us_per_rank']:.1f}" if "cpu_us_per_rank" in r else "-",
                  f"{r['seals_per_rank']:g}", f"{r['opens_per_rank']:g}", r["tag_granularity"], vs)
    return t


def print_table(table: Table) -> None:
    Console(width=max(160, Console().width)).print(table)
