"""Figures of a characterization, drawn only from its ``results.json``.

Each function mirrors one figure of the paper (Lee et al., "Characterization of GPU TEE
Overheads in Distributed Data Parallel ML Training"), takes the loaded results (a dict
or :class:`~ccddp.report.results.Results`) and an output directory, writes
``<name>.png`` and ``<name>.svg`` there and returns their paths, or ``[]`` when the
results hold nothing it can draw (failed runs, a single world size, no CC-off run...):

=========================  ====================================================
function                   paper figure
=========================  ====================================================
``fig_allreduces``         Fig. 6: parameters and all-reduces per iteration
``fig_iteration_time``     Figs. 8a/9a/10: CC-off vs CC-on time, panel per n
``fig_decomposition``      Figs. 8b/9b: CC-on phases, panel per schedule and n
``fig_scaling``            Fig. 11: CC-on time at n ranks over 2 ranks, (n-1) line
``fig_schedule_overhead``  (ccddp) CC-on/CC-off of naive vs pipelined schedule
``fig_projection``         (ccddp) model-projected slowdown vs GPUs, not measured
=========================  ====================================================

Files are reproducible: the Agg/SVG backends are used directly (no pyplot state),
matplotlib's default style and a fixed size and dpi, a fixed ``svg.hashsalt`` and no
date or software metadata, so drawing the same results twice gives identical bytes.

Example::

    from ccddp.report.figures import write_figures

    paths = write_figures(json.load(open("out/results.json")), "out/figures")
    paths["iteration_time"]      # [Path('out/figures/iteration_time.png'), ....svg]
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from ccddp.report.results import PHASES, Results
from ccddp.stats import Interval, shows_difference

DPI = 110
#: Fixed salt: SVG element ids are hashes of it, so they repeat run to run.
HASHSALT = "ccddp-report"
PANEL_H = 3.4  # inches; panel widths scale with the number of workloads
MAX_WIDTH = 13.0  # inches; wider grids wrap into rows

RC = {
    "svg.hashsalt": HASHSALT,
    "svg.fonttype": "path",  # glyphs as paths: no dependence on the viewer's fonts
    "font.size": 8.5,
    "axes.titlesize": 9.5,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 7.5,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.alpha": 0.3,
    "axes.axisbelow": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

SERIES_COLOR = {"off": "#4C72B0", "naive": "#C44E52", "pipelined": "#DD8452"}
EXTRA_COLORS = ("#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")
PHASE_STYLE = {  # key in summary -> (label, colour)
    "data_ms": ("data", "#B0B0B0"),
    "bounce_ms": ("bounce (input sealing)", "#DA8BC3"),
    "forward_ms": ("forward", "#4C72B0"),
    "backward_ms": ("backward", "#55A868"),
    "exposed_comm_ms": ("exposed comm", "#C44E52"),
    "optimizer_ms": ("optimizer", "#8172B3"),
}
WORKLOAD_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860",
                   "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")
SCHEDULE_LINESTYLE = {"naive": "--", "pipelined": "-"}
#: World sizes beyond the base in one scaling panel: told apart by hatching, since the
#: colour is the schedule's (one colour per schedule in every figure).
SIZE_HATCH = ("", "///", "xxx", "...", "\\\\\\")
SIZE_THEORY_STYLE = ("--", "-.", ":", (0, (5, 1)), (0, (1, 1)))
#: What a hardware profile of the projections stands for, for the panel titles.
PROFILE_TITLES = {
    "paper-h100": "paper-h100: the paper's emulation,\nsoftware AES-GCM on every hop of H100s",
    "h100-cc": "h100-cc: production H100 confidential\ncomputing, NVLink in plaintext inside a node",
    "h200-cc": "h200-cc: production H200 confidential computing",
    "b300-cc": "b300-cc: production B300 confidential computing",
}


# -- plumbing -------------------------------------------------------------------------

class _LegendSlot(NamedTuple):
    y: float  # figure fraction of the legend's top edge
    ncols: int


@contextlib.contextmanager
def _style() -> Iterator[None]:
    """matplotlib's default style plus ours, whatever the caller's rcParams are."""
    import matplotlib.style

    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        yield


def _grid(rows: int, cols: int, panel_w: float, *, title: str, legend: list[str],
          rotated: bool, legend_ncols: int | None = None, panel_h: float = PANEL_H,
          right: float = 0.2, sharey: bool = True, panel_titles: bool = True):
    """A Figure with its own Agg canvas (no pyplot: no global figure registry, no backend
    switch in the caller's process) and a rows x cols grid of panels.

    Margins are fixed in inches from what goes there (title lines, the rows of a legend
    with labels ``legend`` in as many of ``legend_ncols`` columns as fit, rotated tick
    labels) instead of a layout engine: as readable, and 2-3x faster to draw.
    Returns ``(fig, axes, lg)``: ``axes[r][c]``, and ``lg`` for :func:`_legend`.
    """
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    left, wgap = 0.8, 0.6  # every panel keeps its y tick labels: room for them between panels
    bottom = 0.95 if rotated else 0.5
    hgap = bottom + 0.35
    width = left + cols * panel_w + (cols - 1) * wgap + right
    lines = textwrap.wrap(title, max(30, int(width * 10.5)))
    ncols, legend_rows = 1, 0
    if legend:
        # ~0.058 in per character at the legend's 7.5 pt, plus handle and spacing.
        entry_w = 0.45 + 0.058 * max(len(lab) for lab in legend)
        fit = max(1, int((width - 0.2) // entry_w))
        ncols = max(1, min(legend_ncols or len(legend), fit, len(legend)))
        legend_rows = _rows(len(legend), ncols)
    top = 0.12 + 0.2 * len(lines) + 0.19 * legend_rows + (0.35 if panel_titles else 0.15)
    height = top + rows * panel_h + (rows - 1) * hgap + bottom
    fig = Figure(figsize=(round(width, 2), round(height, 2)), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=sharey)
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=wgap / panel_w, hspace=hgap / panel_h)
    fig.text(0.5, 1 - 0.08 / height, "\n".join(lines), ha="center", va="top",
             fontsize=9.5, fontweight="bold")
    # The legend hangs below the title.
    return fig, axes, _LegendSlot(1 - (0.12 + 0.2 * len(lines)) / height, ncols)


def _panels(n: int, panel_w: float, **kw):
    """:func:`_grid` for ``n`` panels of one kind (e.g. one per world size): side by side
    while the figure stays under ``MAX_WIDTH`` inches, else stacked in rows (7 workloads
    at 3 world sizes side by side would be 20 inches wide). Returns a flat axes list."""
    cols = max(1, min(n, int((MAX_WIDTH - 1.0) // (panel_w + 0.6)) or 1))
    rows = -(-n // cols)
    fig, axes, ly = _grid(rows, cols, panel_w, **kw)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n], ly, cols


def _legend(fig, slot: "_LegendSlot", handles, labels, handlelength: float = 1.6) -> None:
    if handles:
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, slot.y),
                   ncols=slot.ncols, frameon=False, handlelength=handlelength, columnspacing=1.2,
                   borderaxespad=0.0)


def _rows(n_entries: int, ncols: int) -> int:
    return max(1, -(-n_entries // ncols))


def _unique_handles(axes) -> tuple[list, list[str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return list(seen.values()), list(seen)


def _save(fig, out_dir: str | Path, name: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, svg = out / f"{name}.png", out / f"{name}.svg"
    # No "Software"/"Date" entries: a version bump or the clock must not change bytes.
    fig.savefig(png, format="png", dpi=DPI, metadata={"Software": None})
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return [png, svg]


def _res(results: Mapping[str, Any] | Results) -> Results:
    return results if isinstance(results, Results) else Results(results)


def _series_color(schedule: str | None, i: int = 0) -> str:
    return SERIES_COLOR.get(schedule or "off", EXTRA_COLORS[i % len(EXTRA_COLORS)])


def _series_label(schedule: str | None) -> str:
    return "CC-off" if schedule is None else f"CC-on {schedule}"


def _panel_width(n_groups: int, per_group: float = 0.8, base: float = 0.5) -> float:
    return max(2.8, base + per_group * n_groups)


def _fmt_ms(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1000:.0f} s"
    if v >= 1000:
        return f"{v / 1000:.1f} s"
    return f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"


def _ratio_label(r: Interval) -> str:
    """What a bar says about a ratio: ``1.23×``; ``≈1`` when its interval contains 1 (or,
    without an interval, it is below 1); ``1.05×?`` when it has no interval."""
    if not shows_difference(r):
        return "≈1"
    return f"{r.estimate:.2f}×" + ("" if r.known else "?")


def _yerr(ivs: list[Interval | None], values: list[float]) -> list[list[float]] | None:
    """matplotlib's asymmetric error bars (below, above) for intervals around ``values``;
    None when no interval is known (a zero-length bar is drawn for unknown ones)."""
    if not any(iv is not None and iv.known for iv in ivs):
        return None
    lo = [max(0.0, v - iv.low) if iv is not None and iv.known else 0.0 for iv, v in zip(ivs, values)]
    hi = [max(0.0, iv.high - v) if iv is not None and iv.known else 0.0 for iv, v in zip(ivs, values)]
    return [lo, hi]


ERR_STYLE = {"ecolor": "black", "capsize": 2.5, "elinewidth": 0.9}
#: After a ratio that missed the precision target (the report's tables use the same mark).
MISSED_MARK = " †"


def _mark_failed(ax, x: float, color: str) -> None:
    """A run that was attempted and failed: say so where its bar would be."""
    ax.text(x, 0.02, "failed", transform=ax.get_xaxis_transform(), rotation=90,
            ha="center", va="bottom", fontsize=7, color=color, fontweight="bold")


def _rotated(workloads: list[str]) -> bool:
    return len(workloads) > 3


def _group_ticks(ax, workloads: list[str]) -> None:
    rot = _rotated(workloads)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, rotation=30 if rot else 0, ha="right" if rot else "center",
                       rotation_mode="anchor" if rot else "default")
    ax.set_xlim(-0.6, len(workloads) - 0.4)
    ax.tick_params(axis="y", labelleft=True)


def _log_limits(ax, values: list[float], headroom: float = 4.0) -> None:
    pos = [v for v in values if v > 0]
    if pos:
        ax.set_ylim(min(pos) / 2.5, max(pos) * headroom)


def _log_ticks(ax) -> None:
    """Labelled ticks at 1, 2 and 5 times each power of ten, as plain numbers (a log axis
    spanning less than two decades would otherwise label only one or two powers of ten)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


# -- Fig. 6 -----------------------------------------------------------------------------

def fig_allreduces(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """Paper Fig. 6: parameters (line, millions) and all-reduces per iteration (bars) per
    workload, from DDP's bucketing at default caps; measured all-reduces of the runs
    (their own dtype) and the paper's count are marked when known.

    Example::

        fig_allreduces(results, "out/figures")   # [.../allreduces_per_iteration.png, ...svg]
    """
    res = _res(results)
    workloads = [w for w in res.workloads if w in res.buckets or res.measured_allreduces(w)]
    if not workloads:
        return []
    xs = list(range(len(workloads)))
    bars = [res.buckets.get(w, {}).get("num_buckets") for w in workloads]
    heights = [b if isinstance(b, (int, float)) and not isinstance(b, bool) else 0 for b in bars]
    dtypes = sorted({str(res.buckets[w].get("dtype", "?")) for w in workloads if w in res.buckets})
    mx, my, px, py = [], [], [], []
    for x, w in zip(xs, workloads):
        for k in res.measured_allreduces(w):
            mx.append(x + 0.17)
            my.append(k)
        paper = res.buckets.get(w, {}).get("paper_allreduce_calls")
        if isinstance(paper, (int, float)) and not isinstance(paper, bool):
            px.append(x - 0.17)
            py.append(paper)
    params = [res.buckets.get(w, {}).get("num_params") for w in workloads]
    pts = [(x, p / 1e6) for x, p in zip(xs, params)
           if isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0]
    bar_label = f"k = all-reduces/iteration, DDP default caps ({', '.join(dtypes) or '?'})"
    legend = [bar_label] + ["k measured in runs (run's dtype)"] * bool(my) + \
        ["k in paper Fig. 6"] * bool(py) + ["parameters (millions)"] * bool(pts)
    with _style():
        fig, axes, ly = _grid(1, 1, max(4.2, _panel_width(len(workloads), 0.75)),
                              title="Parameters and all-reduces per iteration (cf. paper Fig. 6)",
                              legend=legend, legend_ncols=2, rotated=_rotated(workloads),
                              panel_titles=False,
                              right=0.85 if pts else 0.2)
        ax = axes[0][0]
        ax.bar(xs, heights, width=0.6, color="#4C72B0", alpha=0.85, label=bar_label)
        ymax = max(heights + my + py + [1]) * 1.18
        for x, b in zip(xs, bars):
            if isinstance(b, (int, float)) and not isinstance(b, bool):
                # At the foot of the bar, inside it: the paper's ★, the measured × and the
                # parameters line all sit at or near its top. A bar too short to hold the
                # number gets it beside the bar, left of the ★.
                inside = b > 0.07 * ymax
                if inside:
                    ax.annotate(f"{b:g}", (x, 0), xytext=(0, 3), textcoords="offset points", ha="center",
                                va="bottom", fontsize=7.5, color="white", fontweight="bold")
                else:
                    ax.annotate(f"{b:g}", (x - 0.3, b), xytext=(-2, 0), textcoords="offset points",
                                ha="right", va="center", fontsize=7.5)
        if my:
            ax.plot(mx, my, "x", color="black", ms=7, mew=1.8, label="k measured in runs (run's dtype)")
        if py:
            ax.plot(px, py, "*", color="#C44E52", ms=10, label="k in paper Fig. 6")
        ax.set_ylabel("all-reduce calls per iteration (k)")
        ax.set_ylim(0, ymax)
        _group_ticks(ax, workloads)
        axs = [ax]
        if pts:
            ax2 = ax.twinx()
            ax2.grid(False)
            ax2.spines["right"].set_visible(True)
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="#55A868",
                     label="parameters (millions)")
            ax2.set_yscale("log")
            ax2.set_ylabel("parameters (millions, log)", color="#55A868")
            ax2.tick_params(axis="y", which="both", colors="#55A868")
            lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
            ax2.set_ylim(lo / 3, hi * 30)  # keeps the line below the bar labels
            axs.append(ax2)
        _legend(fig, ly, *_unique_handles(axs))
        return _save(fig, out_dir, "allreduces_per_iteration")


# -- Figs. 8a / 9a / 10 ---------------------------------------------------------------------

def fig_iteration_time(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """Paper Figs. 8a/9a/10: median time per iteration, CC-off vs CC-on (each schedule),
    per workload; one panel per world size, log scale, CC-on/CC-off ratio on the bars.

    Example::

        fig_iteration_time(results, "out/figures")   # [.../iteration_time.png, ...svg]
    """
    res = _res(results)
    series = [None] + res.schedules
    sizes = [n for n in res.world_sizes
             if any(res.total_ms(w, n, "on" if s else "off", s) is not None
                    for w in res.workloads for s in series)]
    if not sizes:
        return []
    # Keep workloads with a run at a drawn size (ok or failed) so x positions line up.
    workloads = [w for w in res.workloads
                 if any(res.run(w, n, "on" if s else "off", s) or res.failed(w, n, "on" if s else "off", s)
                        for n in sizes for s in series)]
    width = 0.8 / len(series)
    with _style():
        fig, axes, ly, cols = _panels(len(sizes), _panel_width(len(workloads), 0.25 + 0.2 * len(series)),
                              title="Time per iteration, CC-off vs CC-on — measured "
                                    "(cf. paper Figs. 8a, 9a, 10); median with 95 % interval; label: "
                                    "CC-on / CC-off (≈1: no measurable difference)",
                              legend=[_series_label(s) for s in series], rotated=_rotated(workloads))
        values: list[float] = []
        missed_any = False
        for ax, n in zip(axes, sizes):
            for i, s in enumerate(series):
                cc = "on" if s else "off"
                color = _series_color(s, i)
                xs, ys, ivs = [], [], []
                for j, w in enumerate(workloads):
                    x = j - 0.4 + width * (i + 0.5)
                    iv = res.time_interval(w, n, cc, s)
                    if iv is None:
                        if res.failed(w, n, cc, s):
                            _mark_failed(ax, x, color)
                        continue
                    xs.append(x)
                    ys.append(iv.estimate)
                    ivs.append(iv)
                    values += [iv.estimate, iv.high or iv.estimate]
                    r = res.comparison(w, n, s) if s else None
                    if r is not None:
                        top = iv.high if iv.known else iv.estimate
                        check = res.precision_check(w, n)
                        mark = MISSED_MARK if check and s in check["missed"] else ""
                        missed_any = missed_any or bool(mark)
                        ax.annotate(_ratio_label(r) + mark, (x, top), xytext=(0, 4), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=6.5, rotation=90)
                ax.bar(xs, ys, width=width * 0.95, color=color, label=_series_label(s),
                       yerr=_yerr(ivs, ys), error_kw=ERR_STYLE)
            ax.set_yscale("log")
            ax.set_title(f"{n} ranks")
            _group_ticks(ax, workloads)
        for ax in axes[::cols]:
            ax.set_ylabel("median time per iteration (ms, log)")
        _log_limits(axes[0], values, headroom=5.0)
        for ax in axes:
            _log_ticks(ax)
        _legend(fig, ly, *_unique_handles(axes))
        if missed_any:
            target = res.config.get("precision")
            fig.text(0.01, 0.005, f"{MISSED_MARK} the ratio's 95 % interval is wider than the study's "
                                  f"±{target:.0%} precision target (measuring stopped at its cap)",
                     fontsize=7, ha="left", va="bottom")
        return _save(fig, out_dir, "iteration_time")


# -- Figs. 8b / 9b ------------------------------------------------------------------------

BUSY_LABEL = "crypto busy (overlaps the phases)"


def fig_decomposition(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """Paper Figs. 8b/9b: CC-on time per iteration split into data, bounce, forward,
    backward, exposed communication and optimizer (share of their sum, stacked); crypto
    busy time overlaps those phases, so it is a marker, not a layer. One panel per
    schedule (rows) and world size (columns); the median total is written on top.

    Example::

        fig_decomposition(results, "out/figures")   # [.../phase_decomposition.png, ...svg]
    """
    res = _res(results)

    def present(w, n, s):
        return res.phase_ms(w, n, s) is not None or res.failed(w, n, "on", s)

    if not any(res.phase_ms(w, n, s) for s in res.schedules for n in res.world_sizes
               for w in res.workloads):
        return []
    scheds = [s for s in res.schedules if any(present(w, n, s) for n in res.world_sizes for w in res.workloads)]
    sizes = [n for n in res.world_sizes if any(present(w, n, s) for s in scheds for w in res.workloads)]
    workloads = [w for w in res.workloads if any(present(w, n, s) for s in scheds for n in sizes)]
    with _style():
        fig, axes, ly = _grid(len(scheds), len(sizes), _panel_width(len(workloads), 0.5),
                              title="Where CC-on time goes — measured (cf. paper Figs. 8b, 9b); "
                                    "median total (95 % interval) on top", legend_ncols=4,
                              legend=[PHASE_STYLE[k][0] for k in PHASES] + [BUSY_LABEL],
                              rotated=_rotated(workloads), panel_h=PANEL_H - 0.3)
        top = 100.0
        for r, s in enumerate(scheds):
            for c, n in enumerate(sizes):
                ax = axes[r][c]
                for j, w in enumerate(workloads):
                    ph = res.phase_ms(w, n, s)
                    total = sum(ph[k] for k in PHASES) if ph else 0.0
                    if total <= 0:
                        if res.failed(w, n, "on", s):
                            _mark_failed(ax, j, "#C44E52")
                        continue
                    bottom = 0.0
                    for k in PHASES:
                        share = 100.0 * ph[k] / total
                        label, color = PHASE_STYLE[k]
                        ax.bar(j, share, bottom=bottom, width=0.62, color=color, label=label)
                        bottom += share
                    busy = 100.0 * ph["crypto_busy_ms"] / total
                    if busy > 0:
                        ax.plot([j], [busy], "D", color="black", ms=5, zorder=5, label=BUSY_LABEL)
                        top = max(top, busy)
                    iv = res.time_interval(w, n, "on", s)
                    text = _fmt_ms(iv.estimate if iv is not None else total)
                    if iv is not None and iv.known:
                        text += f"\n({_fmt_ms(iv.low)}–{_fmt_ms(iv.high)})"
                    ax.annotate(text, (j, 100), xytext=(0, 2),
                                textcoords="offset points", ha="center", va="bottom", fontsize=6)
                ax.set_title(f"CC-on {s}, {n} ranks")
                _group_ticks(ax, workloads)
            axes[r][0].set_ylabel("share of iteration (%)")
        axes[0][0].set_ylim(0, top * 1.1 + 12)
        handles, labels = _unique_handles([ax for row in axes for ax in row])
        order = [PHASE_STYLE[k][0] for k in PHASES] + [BUSY_LABEL]
        pairs = sorted(zip(labels, handles), key=lambda p: order.index(p[0]))
        _legend(fig, ly, [h for _, h in pairs], [lab for lab, _ in pairs])
        return _save(fig, out_dir, "phase_decomposition")


# -- Fig. 11 --------------------------------------------------------------------------------

def fig_scaling(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """Paper Fig. 11: CC-on time at n ranks normalised to 2 ranks (or the smallest world
    size measured), per workload, against the theory line (n-1)/(base-1) -- the growth
    of the 4(n-1) crypto operations per all-reduce. CC-off with the same normalisation
    is marked, since on a shared CPU compute slows with n too. One panel per schedule.

    Example::

        fig_scaling(results, "out/figures")   # [] with a single world size
    """
    res = _res(results)
    panels = []
    for s in res.schedules:
        sizes = [n for n in res.world_sizes if any(res.total_ms(w, n, "on", s) for w in res.workloads)]
        if len(sizes) < 2:
            continue
        base = 2 if 2 in sizes else sizes[0]
        higher = [n for n in sizes if n > base]
        wls = [w for w in res.workloads if res.total_ms(w, base, "on", s)
               and any(res.total_ms(w, n, "on", s) or res.failed(w, n, "on", s) for n in higher)]
        if wls and higher:
            panels.append((s, base, higher, wls))
    if not panels:
        return []
    workloads = [w for w in res.workloads if any(w in p[3] for p in panels)]
    all_higher = sorted({n for p in panels for n in p[2]})
    bases = sorted({p[1] for p in panels})
    base_text = " or ".join(map(str, bases))
    theory_text = "(n−1)" if bases == [2] else "(n−1)/(base−1)"

    def labels_for(n: int) -> tuple[str, str, str]:
        """Legend labels of size n: its bar, its CC-off tick, its theory line."""
        base = next(p[1] for p in panels if n in p[2])
        theory = (n - 1) / (base - 1) if base > 1 else float("nan")
        return (f"CC-on, {n} ranks / {base}", f"CC-off, {n} ranks / {base}",
                f"theory (n−1)/({base}−1) = {theory:g}, n = {n}")

    note = scaling_load_note(res, [(s, base, higher, wls) for s, base, higher, wls in panels])
    from matplotlib.patches import Patch

    with _style():
        fig, axes, ly, cols = _panels(len(panels), _panel_width(len(workloads), 0.3 + 0.22 * len(all_higher)),
                              title=f"CC-on time at n ranks / at {base_text} ranks — measured (cf. "
                                    f"paper Fig. 11), with intervals from both medians' 95 % intervals; "
                                    f"dashed: theory {theory_text}{note}",
                              legend=[lab for n in all_higher for lab in labels_for(n)],
                              legend_ncols=len(all_higher), rotated=_rotated(workloads))
        top = 1.0
        legend: dict[str, tuple] = {}  # key -> (handle, label)
        for ax, (s, base, higher, wls) in zip(axes, panels):
            width = 0.8 / len(higher)
            color = _series_color(s, res.schedules.index(s))
            for i, n in enumerate(higher):
                k = all_higher.index(n)
                hatch, theory_ls = SIZE_HATCH[k % len(SIZE_HATCH)], SIZE_THEORY_STYLE[k % len(SIZE_THEORY_STYLE)]
                xs, ys, ivs, ox, oy = [], [], [], [], []
                for j, w in enumerate(workloads):
                    on_n, on_b = res.total_ms(w, n, "on", s), res.total_ms(w, base, "on", s)
                    x = j - 0.4 + width * (i + 0.5)
                    if on_n is None or not on_b:
                        if on_b and res.failed(w, n, "on", s):
                            _mark_failed(ax, x, color)
                        continue
                    xs.append(x)
                    ys.append(on_n / on_b)
                    ivs.append(_quotient_interval(res.time_interval(w, n, "on", s),
                                                  res.time_interval(w, base, "on", s)))
                    # The label sits on the bar's interval; ``top`` (the shared y axis's
                    # reach, over every panel) is only ever raised.
                    label_y = ivs[-1].high if ivs[-1] is not None else on_n / on_b
                    top = max(top, label_y)
                    ax.annotate(f"{on_n / on_b:.2f}", (x, label_y), xytext=(0, 3),
                                textcoords="offset points", ha="center", va="bottom", fontsize=6.5,
                                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})
                    off_n, off_b = res.total_ms(w, n, "off"), res.total_ms(w, base, "off")
                    if off_n is not None and off_b:
                        ox.append(x)
                        oy.append(off_n / off_b)
                on_lab, off_lab, theory_lab = labels_for(n)
                ax.bar(xs, ys, width=width * 0.85, color=color, hatch=hatch, edgecolor="white", lw=0,
                       yerr=_yerr(ivs, ys), error_kw=ERR_STYLE)
                # The legend's bar is grey: the panels' colours are their schedules'.
                legend.setdefault(f"on{n}", (Patch(facecolor="#9A9A9A", hatch=hatch, edgecolor="white"), on_lab))
                top = max([top] + [iv.high for iv in ivs if iv is not None])
                if oy:
                    legend.setdefault(f"off{n}", (ax.plot(ox, oy, "_", color="black", ms=12, mew=2.2)[0],
                                                  off_lab))
                top = max([top] + ys + oy)
                if base > 1:
                    theory = (n - 1) / (base - 1)
                    top = max(top, theory)
                    legend.setdefault(f"theory{n}", (ax.axhline(theory, color="#555555", ls=theory_ls, lw=1.2),
                                                     theory_lab))
            ax.axhline(1.0, color="black", lw=0.6)
            ax.set_title(f"CC-on {s}, normalised to {base} ranks", color=color)
            _group_ticks(ax, workloads)
        for ax in axes[::cols]:
            ax.set_ylabel("time per iteration, normalised")
        # Headroom for the labels above the highest interval (they are drawn in points).
        axes[0].set_ylim(0, top * 1.2)
        # One legend column per n (legends fill column by column): bar, CC-off tick, theory.
        order = [f"{kind}{n}" for n in all_higher for kind in ("on", "off", "theory")]
        pairs = sorted(legend.items(), key=lambda kv: order.index(kv[0]))
        _legend(fig, ly, [h for _, (h, _lab) in pairs], [lab for _, (_h, lab) in pairs])
        return _save(fig, out_dir, "scaling")


def _load_text(load: Mapping[str, Any] | None) -> str | None:
    before, after = (load or {}).get("load_before"), (load or {}).get("load_after")
    if not (isinstance(before, list) and before and isinstance(after, list) and after):
        return None
    return f"{max(before[0], after[0]):.1f}"


def scaling_load_note(res: Results, panels: list[tuple]) -> str:
    """The sentence the scaling figure adds when a quotient is below 1 (more ranks took
    less time): the two world sizes ran in separate launches, at different times, so the
    figure says so, with the load average each launch saw where the results record it,
    rather than let the bar read as a speed-up. Empty when no quotient is below 1.
    ``panels``: ``(schedule, base, higher sizes, workloads)`` as the figure draws them."""
    faster = [(w, n, base) for s, base, higher, wls in panels for n in higher for w in wls
              for cc, sch in (("on", s), ("off", None))
              if (a := res.total_ms(w, n, cc, sch)) is not None and (b := res.total_ms(w, base, cc, sch))
              and a / b < 1]
    if not faster:
        return ""
    w, n, base = faster[0]
    la, lb = _load_text(res.launch_load(w, n)), _load_text(res.launch_load(w, base))
    loads = (f"; e.g. {w}: load average up to {lb} during its {base}-rank launch, {la} during its {n}-rank one"
             if la and lb else "; this results file does not record their load")
    return (f". Below 1 ({n} ranks faster than {base}): two separate launches, run at different times and "
            f"loads{loads}: their conditions differed, it is not a speed-up from more ranks")


def _quotient_interval(a: Interval | None, b: Interval | None) -> Interval | None:
    """a / b for medians of separate launches: [a.low / b.high, a.high / b.low], which holds
    both 95 % intervals (conservative); None unless both are known."""
    if a is None or b is None or not (a.known and b.known) or b.low <= 0:
        return None
    return Interval(a.estimate / b.estimate, a.low / b.high, a.high / b.low, min(a.n, b.n))


# -- schedules ------------------------------------------------------------------------------

def fig_schedule_overhead(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """CC-on/CC-off time ratio of each schedule (the paper's naive one, ccddp's
    pipelined one) per workload, with its 95 % interval; one panel per world size. A ratio
    whose interval contains 1 gets no bar: only its interval, labelled ≈1 (no measurable
    difference), so it is never drawn as a speed-up or a slowdown.

    Example::

        fig_schedule_overhead(results, "out/figures")   # [.../schedule_overhead.png, ...svg]
    """
    res = _res(results)
    scheds = res.schedules
    sizes = [n for n in res.world_sizes if any(res.comparison(w, n, s) for w in res.workloads for s in scheds)]
    if not sizes:
        return []
    workloads = [w for w in res.workloads if any(res.comparison(w, n, s) for n in sizes for s in scheds)]
    width = 0.8 / len(scheds)
    comps = [c for w in workloads for n in sizes for s in scheds if (c := res.comparison(w, n, s))]
    extent = [c.estimate for c in comps] + [x for c in comps if c.known for x in (c.low, c.high)] + [1.0]
    log = max(extent) / max(min(extent), 1e-9) > 12
    with _style():
        fig, axes, ly, cols = _panels(len(sizes), _panel_width(len(workloads), 0.3 + 0.22 * len(scheds)),
                              title="Overhead of each CC-on schedule: CC-on / CC-off — measured, with 95 % "
                                    "intervals; ≈1: no measurable difference (interval contains 1)",
                              legend=[f"CC-on {s} / CC-off" for s in scheds], rotated=_rotated(workloads))
        for ax, n in zip(axes, sizes):
            for i, s in enumerate(scheds):
                color = _series_color(s, i)
                xs, ys, ivs = [], [], []
                for j, w in enumerate(workloads):
                    r = res.comparison(w, n, s)
                    x = j - 0.4 + width * (i + 0.5)
                    if r is None:
                        if res.failed(w, n, "on", s):
                            _mark_failed(ax, x, color)
                        continue
                    if shows_difference(r):
                        xs.append(x)
                        ys.append(r.estimate)
                        ivs.append(r)
                    elif r.known:  # the interval alone, no bar
                        ax.vlines(x, r.low, r.high, color=color, lw=2.2)
                        ax.hlines([r.low, r.high], x - width * 0.25, x + width * 0.25, color=color, lw=1.2)
                    top = r.high if r.known else max(r.estimate, 1.0)
                    ax.annotate(_ratio_label(r), (x, top), xytext=(0, 4), textcoords="offset points",
                                ha="center", va="bottom", fontsize=6.5,
                                rotation=90 if len(scheds) > 1 else 0)
                ax.bar(xs, ys, width=width * 0.9, color=color, label=f"CC-on {s} / CC-off",
                       yerr=_yerr(ivs, ys), error_kw=ERR_STYLE)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_title(f"{n} ranks")
            _group_ticks(ax, workloads)
        if log:
            axes[0].set_yscale("log")
            axes[0].set_ylim(min(extent) / 1.5, max(extent) * 4)
        else:
            axes[0].set_ylim(0, max(extent) * 1.3)
        for ax in axes[::cols]:
            ax.set_ylabel("CC-on / CC-off time per iteration" + (" (log)" if log else ""))
        _legend(fig, ly, *_unique_handles(axes))
        return _save(fig, out_dir, "schedule_overhead")


# -- projections ------------------------------------------------------------------------------

def fig_projection(results: Mapping[str, Any] | Results, out_dir: str | Path) -> list[Path]:
    """Slowdown (CC-on/CC-off) against number of GPUs from the performance model rows in
    ``projections`` (``ccddp simulate --json``): one panel per hardware profile, one
    line per workload and schedule. Labelled as projected, never as measured.

    Example::

        fig_projection(results, "out/figures")   # [] when results has no projections
    """
    res = _res(results)
    rows = []
    for p in res.projections:
        g, sd = p.get("gpus"), p.get("slowdown")
        if (isinstance(g, int) and not isinstance(g, bool) and g > 0 and isinstance(sd, (int, float))
                and math.isfinite(sd) and sd > 0):
            rows.append(p)
    if not rows:
        return []
    profiles = list(dict.fromkeys(str(p.get("profile", "?")) for p in rows))
    wl_order = res.workloads + [w for w in dict.fromkeys(str(p.get("workload")) for p in rows)
                                if w not in res.workloads]
    line_labels = sorted({f"{p.get('workload')} ({p.get('schedule')})" for p in rows})
    with _style():
        fig, axes, ly, cols = _panels(len(profiles), 4.6, title="PROJECTED slowdown vs number of GPUs — "
                              "performance model (ccddp simulate), NOT measured; each panel has its own "
                              "y-axis (the profiles differ by far more than the workloads)",
                              legend=line_labels, legend_ncols=3, rotated=False, panel_h=PANEL_H + 0.6,
                              sharey=False)
        all_sd, all_g = [], []
        for ax, prof in zip(axes, profiles):
            lines: dict[tuple, list] = {}
            for p in rows:
                if str(p.get("profile", "?")) == prof:
                    lines.setdefault((str(p.get("workload")), str(p.get("schedule"))), []).append(p)
            keys = sorted(lines, key=lambda k: (wl_order.index(k[0]), k[1]))
            for wl, sch in keys:
                pts = sorted((p["gpus"], p["slowdown"]) for p in lines[(wl, sch)])
                color = WORKLOAD_COLORS[wl_order.index(wl) % len(WORKLOAD_COLORS)]
                ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", ms=3.5,
                        ls=SCHEDULE_LINESTYLE.get(sch, ":"), color=color, label=f"{wl} ({sch})")
                all_sd += [v for _, v in pts]
                all_g += [g for g, _ in pts]
            ax.set_xscale("log", base=2)
            ax.set_title(PROFILE_TITLES.get(prof, f"profile {prof}") + " (model)", color="#C44E52")
            ax.set_xlabel("GPUs")
            ax.grid(True, which="major", axis="both", alpha=0.3)
            ax.text(0.02, 0.97, "PROJECTED (model)\nnot measured", transform=ax.transAxes,
                    ha="left", va="top", fontsize=8.5, color="#C44E52", fontweight="bold",
                    bbox={"boxstyle": "round", "fc": "white", "ec": "#C44E52", "alpha": 0.9})
        handles, labels = _unique_handles(axes)
        pairs = sorted(zip(labels, handles), key=lambda p: (wl_order.index(p[0].rsplit(" (", 1)[0]), p[0]))
        # Long handles: a dashed or dotted line shows its pattern around the marker.
        _legend(fig, ly, [h for _, h in pairs], [lab for lab, _ in pairs], handlelength=3.6)
        for ax in axes:
            ys = [v for line in ax.get_lines() for v in line.get_ydata()]
            if ys and max(ys) / min(ys) > 12:
                ax.set_yscale("log")
            elif ys:
                lo, hi = min(ys), max(ys)
                pad = max(0.02, 0.08 * (hi - lo))
                ax.set_ylim(max(0.0, min(lo, 1.0) - pad), hi + pad * 2.5)
            ax.axhline(1.0, color="black", lw=0.6)
        for ax in axes[::cols]:
            ax.set_ylabel("projected slowdown, CC-on / CC-off")
        gs = sorted(set(all_g))
        for ax in axes:
            ax.set_xticks(gs)
            ax.set_xticklabels([str(g) for g in gs])
            ax.minorticks_off()
        return _save(fig, out_dir, "projected_slowdown")


#: Every figure in report order: name (file stem) -> function.
FIGURES: dict[str, Callable[[Any, Any], list[Path]]] = {
    "allreduces_per_iteration": fig_allreduces,
    "iteration_time": fig_iteration_time,
    "phase_decomposition": fig_decomposition,
    "scaling": fig_scaling,
    "schedule_overhead": fig_schedule_overhead,
    "projected_slowdown": fig_projection,
}


def write_figures(results: Mapping[str, Any] | Results, out_dir: str | Path) -> dict[str, list[Path]]:
    """Draw every figure into ``out_dir``; returns name -> paths for those drawn.

    A figure that cannot be drawn from these results has its old files (same name, from
    an earlier run) removed, so the directory never shows a stale figure.

    Example::

        drawn = write_figures(results, "out/figures")
        sorted(drawn)   # e.g. ['allreduces_per_iteration', 'iteration_time', ...]
    """
    res = _res(results)
    out = Path(out_dir)
    drawn: dict[str, list[Path]] = {}
    for name, fn in FIGURES.items():
        paths = fn(res, out)
        if paths:
            drawn[name] = paths
        else:
            for ext in ("png", "svg"):
                (out / f"{name}.{ext}").unlink(missing_ok=True)
    return drawn


__all__ = ["FIGURES", "write_figures", "fig_allreduces", "fig_iteration_time",
           "fig_decomposition", "fig_scaling", "fig_schedule_overhead", "fig_projection"]
