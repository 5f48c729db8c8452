"""``report.md``: a characterization written up from its ``results.json`` alone.

The report states what ran (machine, versions, shapes per workload including any dtype
reduction), keeps measured, computed and projected numbers apart, embeds the figures of
:mod:`ccddp.report.figures` by relative path, and tabulates CC-on/CC-off ratios, the
4·k·(n-1) crypto-operation check of every CC-on run, and the failed runs with their
errors. It holds no timestamp of its own, so regenerating it from the same results
gives the same file.

Example::

    from ccddp.report.markdown import write_report

    path = write_report("out/results.json", "out")   # out/report.md, out/figures/*
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from ccddp.report.crypto_ops import check_runs, mark
from ccddp.report.figures import write_figures
from ccddp.report.results import SCHEMA, Results
from ccddp.stats import METHOD, Verdict, interval_text, ratio_text, verdict

FIGURES_DIR = "figures"

CAPTIONS = {
    "allreduces_per_iteration": (
        "Parameters and all-reduces per iteration (cf. paper Fig. 6)",
        "Bars: DDP's gradient buckets at its default caps (1 MiB first, 25 MiB), i.e. the k "
        "all-reduce calls per iteration, **computed** from DDP's own bucketing in the listed "
        "dtype (not timed); line: parameters (millions, log). × marks the k **measured** in "
        "the runs, in each run's own parameter dtype (a bfloat16 run packs twice the "
        "parameters into a bucket, so fewer calls); ★ marks the paper's count where it "
        "gives one."),
    "iteration_time": (
        "Time per iteration, CC-off vs CC-on (cf. paper Figs. 8a, 9a, 10)",
        "**Measured** median time per iteration on rank 0 with its 95 % interval (error "
        "bar), one panel per world size (log scale). CC-off is gloo's all-reduce; CC-on "
        "seals every ring hop with AES-GCM, with the paper's naive schedule and/or ccddp's "
        "pipelined one. The label on a CC-on bar is CC-on/CC-off (Hodges-Lehmann median of "
        "per-round ratios); ≈1 means its 95 % interval contains 1: no measurable difference. "
        "\"failed\" marks a run that did not finish."),
    "phase_decomposition": (
        "Where CC-on time goes (cf. paper Figs. 8b, 9b)",
        "**Measured** CC-on phases as a share of their sum: data, bounce (sealing and "
        "opening the input batch, the paper's CPU→GPU step), forward, backward compute, "
        "exposed communication (after backward until every bucket is reduced) and "
        "optimizer. ◆ is crypto busy time (seal + open, all threads), which overlaps the "
        "phases and can exceed 100 % with several crypto threads. Median total on top, "
        "its 95 % interval below it."),
    "scaling": (
        "Scaling with the number of ranks (cf. paper Fig. 11)",
        "**Measured** CC-on time at n ranks over the time at 2 ranks (or the smallest world "
        "size measured). Dashed: the theory line (n−1)/(2−1): a ring all-reduce does 4(n−1) "
        "crypto operations per rank, so crypto-bound time grows with n−1 (the paper's "
        "\"theoretical maximum\"). The black tick is CC-off with the same normalisation: "
        "on a shared CPU compute also slows with more ranks, which GPUs do not. The two "
        "world sizes ran in separate launches, so the error bar spans the quotients of both "
        "medians' 95 % intervals (conservative), and a value below 1 reflects the two launches' "
        "conditions (the table *How far to trust each launch* gives each one's load), not a "
        "speed-up. Bars take their schedule's colour, as in every figure; hatching tells "
        "world sizes apart."),
    "schedule_overhead": (
        "Overhead of each CC-on schedule",
        "**Measured** CC-on/CC-off per workload and world size, for the paper's naive "
        "schedule (seal the whole chunk, send, open, reduce) and ccddp's pipelined one "
        "(segments sealed while earlier ones are in flight): the Hodges-Lehmann median of "
        "per-round ratios with its 95 % interval (Wilcoxon signed-rank). 1 = no overhead. A ratio whose interval contains "
        "1 is drawn as its interval alone, labelled ≈1 (no measurable difference)."),
    "projected_slowdown": (
        "Projected slowdown vs number of GPUs — model, not measured",
        "**Projected** by ccddp's performance model (`ccddp simulate`) for the hardware "
        "profile named in each panel; nothing in this figure was measured. It shows "
        "where the trends measured above lead at GPU counts this machine does not have. "
        "paper-h100 is the paper's emulation (software AES-GCM on every hop); h100-cc is "
        "NVIDIA confidential computing as it runs in production. Each panel has its own "
        "y-axis: the two differ by far more than the workloads do."),
}


def _cell(x: Any) -> str:
    """One table cell: pipes escaped, newlines folded, so any error text stays in its row."""
    text = "–" if x is None or x == "" else str(x)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
    """Markdown table; ``align``: one of ``l``/``r`` per column (default: first left)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def _ms(v: Any) -> str | None:
    return f"{v:.1f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _count(v: Any) -> str | None:
    """1,557,611,200 for an int; anything else as it is (a hand-edited file may hold text)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return None if v is None else str(v)


def _input_shape(s: Mapping[str, Any]) -> str:
    parts = []
    if s.get("image_size") is not None:
        parts.append(f"image {s['image_size']}×{s['image_size']}")
    if s.get("seq_len") is not None:
        parts.append(f"{s['seq_len']} tokens")
    if isinstance(s.get("fanouts"), (list, tuple)):
        parts.append("fanouts " + "/".join(str(f) for f in s["fanouts"]))
    if s.get("num_nodes") is not None:
        parts.append(f"{_count(s['num_nodes'])} nodes")
    return ", ".join(parts) or "–"


def _provenance(res: Results, drawn: set[str]) -> list[str]:
    cfg, m = res.config, res.machine
    cores = m.get("cores")
    lines = ["## Measured, computed, projected", ""]
    lines.append(
        f"- **Measured here**: every time, phase and crypto count in the tables and in "
        f"the figures marked measured comes from `ccddp train` runs on this machine: "
        f"one process per rank, CPU tensors over gloo. CC-off = gloo's all-reduce; CC-on "
        f"= AES-GCM-256 sealed ring all-reduce on every hop, input batches sealed through "
        f"the bounce path, parameters and buffers broadcast sealed. The variants of one "
        f"workload and world size ran in one launch, taking turns (a round runs each "
        f"variant once), after {cfg.get('warmup', '?')} warm-up iterations each; "
        f"{_rounds_text(res)}. Times are medians on rank 0 with their 95 % interval; each "
        f"CC-on/CC-off ratio is the {METHOD}.")
    lines.append("- **Computed, not timed**: parameters and buckets per workload (Fig. 6) "
                 "from DDP's own bucket assignment at its default caps.")
    lines.append("- **From the paper** (for reference, never measured here): the paper's "
                 "all-reduce counts in Fig. 6 and the (n−1) theory line of Fig. 11.")
    if "projected_slowdown" in drawn or res.projections:
        lines.append("- **Projected (performance model, not measured)**: the projection "
                     "figure and table, rows of `ccddp simulate` for the profiles named "
                     "there.")
    else:
        lines.append("- **Projected**: nothing; this results file has no model projections.")
    lines.append(
        f"- The ranks share {cores if cores else 'the'} CPU cores: compute and crypto compete "
        f"for them, as they would not on separate GPUs. Compare ratios and trends with the "
        f"paper, not absolute times.")
    rates = [r for r in res.data.get("aes_gcm_rates") or [] if isinstance(r, Mapping)
             and all(isinstance(r.get(k), (int, float)) for k in ("seal_gbps", "open_gbps"))]
    if rates:
        lines.append(
            "- CC-on cost on CPU ranks follows the CPU's AES-GCM rate. Measured on this machine "
            "(one thread, the secure channel, as `ccddp bench channel`) when the runs started: "
            + "; ".join(f"seal {r['seal_gbps']:.2f} GB/s, open {r['open_gbps']:.2f} GB/s"
                        + (f" ({r['date']})" if r.get("date") else "") for r in rates)
            + (f"; AES instructions: {', '.join(m['aes_flags'])}" if m.get("aes_flags") else "") + ".")
    return lines + [""]


def _rounds_text(res: Results) -> str:
    """How many rounds the runs measured, e.g. "9–14 measured rounds per launch"."""
    counts = sorted({len(Results.round_ms(r)) for r in res.runs if res.is_ok(r)} - {0})
    if not counts:
        return "the runs have no rounds (variants were not measured in turns)"
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    budget, precision = res.config.get("budget_s"), res.config.get("precision")
    if budget and precision:
        return (f"{span} measured rounds per launch (after {res.config.get('steps', '?')}, stopped once every "
                f"CC-on/CC-off interval was within ±{precision:.0%}, or at {budget:g} s)")
    return f"{span} measured rounds per launch" + (f" (as many as {budget:g} s held)" if budget else "")


def _machine(res: Results) -> list[str]:
    m = res.machine
    keys = [("hostname", "host"), ("cpu", "CPU"), ("cores", "cores"), ("memory_gb", "memory (GB)"),
            ("gpu", "GPU"), ("os", "OS"), ("python", "Python"), ("torch", "torch"),
            ("cryptography", "cryptography"), ("date", "date of the run")]
    rows = [[label, m.get(k)] for k, label in keys if k in m]
    rows += [[k, v] for k, v in m.items() if k not in dict(keys)]
    cfg = res.config
    crows = [["workloads", ", ".join(map(str, cfg.get("workloads") or res.workloads))],
             ["world sizes", ", ".join(map(str, cfg.get("world_sizes") or res.world_sizes))],
             ["CC-on schedules", ", ".join(map(str, cfg.get("schedules") or res.schedules))],
             ["measured iterations per variant (fewest) / warm-up",
              f"{cfg.get('steps', '?')} / {cfg.get('warmup', '?')}"],
             ["measuring time per launch", f"{cfg['budget_s']:g} s" if cfg.get("budget_s") else "–"],
             ["stop once every ratio is within", f"±{cfg['precision']:.0%}" if cfg.get("precision") else "–"],
             ["workload size preset", cfg.get("size")], ["quick", cfg.get("quick")],
             ["runs", f"{len(res.runs) - len(res.failed_runs)} ok, {len(res.failed_runs)} failed"]]
    return (["## Machine and versions", ""] + _table(["", ""], rows, "ll")
            + ["## Configuration", ""] + _table(["", ""], crows, "ll"))


def _shapes(res: Results) -> list[str]:
    rows = []
    for w in res.workloads:
        for s in res.shapes(w) or [{}]:
            if not s:
                if w in res.measured_workloads():
                    continue
                rows.append([w, "no successful run", None, None, None, None, None])
                continue
            batch = s.get("batch_size")
            paper = s.get("paper_batch_size")
            reduced = s.get("dtype_reduced")
            rows.append([
                w, s.get("size"),
                None if batch is None else f"{batch}" + (f" (paper {paper})" if paper else ""),
                _input_shape(s), s.get("dtype"),
                ("**yes**: " + str(s.get("dtype_reason") or "reason not recorded")) if reduced
                else "no (float32, as the paper)",
                _count(s.get("num_params")),
            ])
    if not rows:
        return []
    full = ("architectures are full size (so gradient bytes and bucket counts are the paper's); batch, "
            "input size and, where memory forces it, the parameter dtype are reduced to fit this machine.")
    if any(row[1] == "tiny" for row in rows):
        # A quick or test run: its models are not the paper's, and the report must not say so.
        text = ("Size `tiny` is a reduced architecture (a quick look: its gradient bytes and bucket counts "
                "are not the paper's); at size `default` " + full)
    else:
        text = full[0].upper() + full[1:]
    return (["## Shapes used per workload", "", text, ""]
            + _table(["workload", "size", "batch per rank", "input", "param dtype",
                      "dtype reduced", "parameters"], rows, "llrllll"))


def _buckets(res: Results) -> list[str]:
    rows = []
    for w in res.workloads:
        b = res.buckets.get(w, {})
        measured = res.measured_allreduces(w)
        if not b and not measured:
            continue
        rows.append([w, _count(b.get("num_params")),
                     None if b.get("num_buckets") is None else f"{b['num_buckets']} ({b.get('dtype', '?')})",
                     ", ".join(map(str, measured)) or None, b.get("paper_allreduce_calls")])
    if not rows:
        return []
    return (["## All-reduces per iteration (Fig. 6 data)", ""]
            + _table(["workload", "parameters", "k at default caps (dtype)",
                      "k measured in runs", "paper Fig. 6"], rows))


def _figures(drawn: dict[str, list[Path]], out_dir: Path) -> list[str]:
    lines = ["## Figures", ""]
    if not drawn:
        return lines + ["No figure could be drawn: no run produced a usable result.", ""]
    for name, paths in drawn.items():
        title, text = CAPTIONS.get(name, (name, ""))
        png = next(p for p in paths if p.suffix == ".png")
        svg = next((p for p in paths if p.suffix == ".svg"), None)
        rel = png.relative_to(out_dir).as_posix()
        lines += [f"### {title}", "", f"![{title}]({rel})", "", text
                  + (f" ([SVG]({svg.relative_to(out_dir).as_posix()}))" if svg else ""), ""]
    return lines


def _ratio_cell(res: Results, w: str, n: int, s: str, against: str | None = None) -> str | None:
    c = res.comparison(w, n, s, against)
    if c is not None:
        check = res.precision_check(w, n) if against is None else None
        return ratio_text(c) + (" †" if check and s in check["missed"] else "")
    failed = res.failed(w, n, "on", s) or (res.failed(w, n, "off") if against is None
                                            else res.failed(w, n, "on", against))
    return "failed" if failed else None


def _ms_cell(res: Results, w: str, n: int, cc: str, s: str | None = None) -> str | None:
    iv = res.time_interval(w, n, cc, s)
    if iv is None:
        return "failed" if res.failed(w, n, cc, s) else None
    return f"{iv.estimate:.1f} {interval_text(iv, 0)}"


RATIO_FOOTNOTE = (
    f"Ratios: the {METHOD}, so a ratio is not the quotient of the two medians printed beside "
    "it. A ratio whose interval contains 1 is written \"no measurable difference\". Times: "
    "median ms per iteration on rank 0, 95 % interval in parentheses.")

FASTER_NOTE = (
    "Why CC-on can measure faster than CC-off here: on CPU ranks the two variants do not "
    "run the same communication code. CC-off is gloo's own all-reduce; CC-on is ccddp's ring "
    "on its own worker thread over a second connection per link, which can overlap "
    "transfers with backward differently, and the operating system places the ranks' "
    "threads on the shared cores differently. Where that difference outweighs the AES-GCM "
    "work, the whole interval falls below 1. It is a property of this host's communication "
    "path, not a speed-up that confidentiality brings; on GPUs the crypto is added to "
    "transfers that do not share the compute's cores.")


def _ratios(res: Results) -> list[str]:
    scheds = res.schedules
    header = ["workload", "ranks", "CC-off ms"]
    for s in scheds:
        header += [f"CC-on {s} ms", f"{s} / off"]
    both = "naive" in scheds and "pipelined" in scheds
    if both:
        header.append("naive / pipelined")
    rows = []
    for w in res.workloads:
        for n in res.world_sizes:
            off = res.total_ms(w, n, "off")
            if off is None and not any(res.total_ms(w, n, "on", s) for s in scheds):
                continue
            row: list[Any] = [w, n, _ms_cell(res, w, n, "off")]
            for s in scheds:
                row += [_ms_cell(res, w, n, "on", s), _ratio_cell(res, w, n, s)]
            if both:
                row.append(_ratio_cell(res, w, n, "naive", "pipelined"))
            rows.append(row)
    lines = ["## CC-on / CC-off per iteration (measured)", ""]
    if not rows:
        return lines + ["No workload has a usable run.", ""]
    lines += ["Ratio = CC-on / CC-off at the same world size (the paper's slowdown). "
              "`naive / pipelined` above 1 means the pipelined schedule is faster.", ""]
    lines += _table(header, rows)
    lines += [RATIO_FOOTNOTE, ""]
    target = res.config.get("precision")
    if any(" †" in str(c) for row in rows for c in row):
        lines += [f"† The interval is wider than the ±{target:.0%} the study aimed for: measuring stopped "
                  "before it got that precise (see *How far to trust each launch* below).", ""]
    verdicts = [verdict(c) for w in res.workloads for n in res.world_sizes for s in scheds
                if (c := res.comparison(w, n, s)) is not None]
    if Verdict.FASTER in verdicts:
        lines += [FASTER_NOTE, ""]
    # The paper reports averages per GPU count; give the same summary, counting verdicts
    # (an average of estimates would turn "no measurable difference" into a number).
    summary = []
    for n in res.world_sizes:
        for s in scheds:
            cs = {w: c for w in res.workloads if (c := res.comparison(w, n, s)) is not None}
            if not cs:
                continue
            count = {v: sum(verdict(c) is v for c in cs.values()) for v in Verdict}
            slower = {w: c for w, c in cs.items() if verdict(c) is Verdict.SLOWER}
            worst = max(slower, key=lambda w: slower[w].estimate) if slower else None
            summary.append([n, s, len(cs), count[Verdict.SLOWER], count[Verdict.NO_DIFFERENCE],
                            count[Verdict.FASTER], count[Verdict.UNKNOWN],
                            f"{ratio_text(slower[worst])} ({worst})" if worst else None])
    if summary:
        lines += ["Per world size and schedule, over workloads:", ""]
        lines += _table(["ranks", "schedule", "workloads", "CC-on slower", "no measurable difference",
                         "CC-on faster", "no interval", "largest slowdown"], summary, "rlrrrrrl")
    return lines


STOP_TEXT = {"precision": "precision reached", "round cap": "round cap",
             "steps": "the fewest rounds (the budget held no more)"}


def _load_cell(load: Mapping[str, Any] | None) -> str:
    if not load:
        return "not recorded"
    before, after = load.get("load_before"), load.get("load_after")
    if not (isinstance(before, list) and isinstance(after, list) and before and after):
        return "not recorded"
    return f"{before[0]:.1f} → {after[0]:.1f} ({load.get('cores', '?')} cores)"


def _others_cell(load: Mapping[str, Any] | None) -> str:
    share = load.get("others_share") if load else None
    return f"{share:.0%}" if isinstance(share, (int, float)) else "not recorded"


def _trust(res: Results) -> list[str]:
    """Per launch: did it reach the precision target, why did it stop, and how loaded the
    machine was; a plain verdict first, so a reader knows which numbers to trust."""
    target, budget = res.config.get("precision"), res.config.get("budget_s")
    launches = [(w, n) for w in res.workloads for n in res.world_sizes
                if res.run(w, n, "off") is not None]
    checks = {(w, n): res.precision_check(w, n) for w, n in launches}
    loads = {(w, n): res.launch_load(w, n) for w, n in launches}
    if not launches or (not target and not any(loads.values())):
        return []
    lines = ["## How far to trust each launch", ""]
    if target:
        missed = [(w, n) for (w, n), c in checks.items() if c and not c["met"]]
        if missed:
            lines.append(
                f"**{len(missed)} of {len(launches)} launches missed the ±{target:.0%} precision target** "
                f"({', '.join(f'{w} at {n} ranks' for w, n in missed)}): measuring stopped at its cap "
                f"({budget:g} s or the round cap) before every CC-on/CC-off interval was that narrow. Their "
                "ratios are less certain than the others': read their intervals (marked † above), not "
                "their point estimates, and do not compare them across world sizes.")
            hot = [loads[k] for k in missed if loads[k]]
            if hot:
                peak = max(max(ld["load_before"][0], ld["load_after"][0]) for ld in hot
                           if ld.get("load_before") and ld.get("load_after"))
                share = max((ld.get("others_share") or 0.0) for ld in hot)
                lines[-1] += (f" While they ran, the 1-minute load average reached {peak:.1f} on "
                              f"{hot[0].get('cores', '?')} cores and other processes took up to {share:.0%} of "
                              "the CPU: the machine was shared, and times measured under load vary.")
            elif not any(loads.values()):
                lines[-1] += (" This results file records no load per launch (it predates that record): "
                              "a launch that missed its target may have run on a loaded machine.")
        else:
            lines.append(f"Every launch reached the ±{target:.0%} precision target: each CC-on/CC-off "
                         "ratio above is within it.")
        lines.append("")
    shares = [ld["others_share"] for ld in loads.values() if ld and isinstance(ld.get("others_share"), (int, float))]
    if shares and max(shares) >= 0.25:
        lines += [f"The machine was shared: other processes took {min(shares):.0%}–{max(shares):.0%} of the CPU "
                  "during the launches. Absolute times are slower than on a quiet machine and vary with the "
                  "load; the CC-on/CC-off ratios are paired round by round, so they hold.", ""]
    rows = []
    for w, n in launches:
        c, load = checks[(w, n)], loads[(w, n)]
        if c:
            stop = c["stop"]
            why = (f"time cap ({budget:g} s)" if stop == "time cap" and budget else STOP_TEXT.get(stop, stop)) \
                if stop else ("not recorded (older file); precision reached" if c["met"]
                      else "not recorded (older file); a cap")
            widest = f"±{c['widest']:.1%}" if c["widest"] is not None else "no interval"
            verdict = f"met ±{c['target']:.0%}" if c["met"] else \
                f"**missed ±{c['target']:.0%}** ({', '.join(c['missed'])})"
        else:
            why, widest, verdict = "–", "–", "no target"
        rounds = c["rounds"] if c and c["rounds"] is not None else len(Results.round_ms(res.run(w, n, "off")))
        rows.append([w, n, rounds, why, widest, verdict, _load_cell(load), _others_cell(load)])
    lines += ["Why each launch stopped measuring, its widest CC-on/CC-off interval (half-width, "
              "relative), and the machine's load while it ran: the 1-minute load average before → "
              "after, and the share of all cores' time that processes outside the launch took.", ""]
    lines += _table(["workload", "ranks", "rounds", "stopped because", "widest interval", "precision",
                     "load average", "other processes' CPU"], rows, "lrrllllr")
    return lines


def _ops(res: Results) -> list[str]:
    checks = check_runs(res)
    lines = ["## Crypto operations per iteration (CC-on runs)", ""]
    if not checks:
        return lines + ["No CC-on run produced a result.", ""]
    lines += ["Per rank, steady-state iteration: k = gradient all-reduce calls (DDP "
              "buckets), seals and opens counted by the secure channel (one per ring-step "
              "message, whatever its segmentation). A ring all-reduce over n ranks does "
              "2(n−1) seals + 2(n−1) opens per rank, for the naive and the pipelined "
              "schedule alike, so an iteration must show 4·k·(n−1) (paper §IV-B). "
              f"{mark(True)} = seals and opens both equal 2·k·(n−1) in the steady iteration "
              f"and in every measured iteration listed; {mark(False)} = they do not; "
              f"{mark(None)} = counts missing. Secure broadcasts and the input bounce path "
              "are counted apart and not included.", ""]
    order = res.workloads
    sched_order = res.schedules
    checks.sort(key=lambda c: (order.index(c["workload"]) if c["workload"] in order else len(order),
                               c["world_size"] or 0,
                               sched_order.index(c["schedule"]) if c["schedule"] in sched_order else 99))
    rows = []
    for c in checks:
        verdict = mark(c["ok"]) + (f" {c['mismatch']}" if c["ok"] is False and c["mismatch"] else "")
        rows.append([c["key"], c["world_size"], c["schedule"], c["allreduces"], c["seals"],
                     c["opens"], c["ops"], c["expected_ops"], verdict])
    return lines + _table(["run", "n", "schedule", "k", "seals/rank", "opens/rank",
                           "seals + opens", "expected 4·k·(n−1)", "check"], rows, "lrlrrrrrl")


def _failed(res: Results) -> list[str]:
    lines = ["## Failed runs", ""]
    failed = res.failed_runs
    if not failed:
        return lines + ["None.", ""]
    rows = []
    for r in failed:
        err = r.get("error") or ("status ok but no result" if r.get("status") == "ok"
                                 else f"status {r.get('status')!r}, no error recorded")
        rows.append([r.get("key") or "/".join(str(x) for x in Results.key_of(r) if x is not None),
                     r.get("status"), err])
    return lines + _table(["run", "status", "error"], rows, "lll")


def _projections(res: Results) -> list[str]:
    """Model slowdowns pivoted to one row per workload, profile and schedule, one column
    per GPU count (the CC-off/CC-on milliseconds stay in results.json)."""
    cells: dict[tuple, dict[int, float]] = {}
    gpus: set[int] = set()
    for p in res.projections:
        g, sd = p.get("gpus"), p.get("slowdown")
        if (not isinstance(g, int) or isinstance(g, bool) or g < 1
                or not isinstance(sd, (int, float)) or not math.isfinite(sd)):
            continue
        cells.setdefault((str(p.get("workload")), str(p.get("profile")), str(p.get("schedule"))), {})[g] = sd
        gpus.add(g)
    if not cells:
        return []
    order = res.workloads
    keys = sorted(cells, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[0], k[1], k[2]))
    cols = sorted(gpus)
    rows = [[*k, *[f"{cells[k][g]:.2f}×" if g in cells[k] else None for g in cols]] for k in keys]
    return (["## Projections (performance model — not measured)", "",
             "Slowdown CC-on / CC-off predicted by `ccddp simulate` for the hardware profiles "
             "named; predictions, not measurements on this machine.", ""]
            + _table(["workload", "profile", "schedule", *[f"{g} GPUs" for g in cols]], rows,
                     "lll" + "r" * len(cols)))


def _fidelity(res: Results) -> list[str]:
    """The model against the published numbers, when the results file carries them."""
    from ccddp.report.fidelity import fidelity_lines

    f = res.fidelity
    if not f.get("rows") or not f.get("summary"):
        return []
    return (["## Model fidelity (performance model against published numbers)", "",
             "Each published number the model speaks to: fitted (a profile constant was "
             "solved from it), input, or held out (predicted), with the error.", ""]
            + fidelity_lines(f["rows"], f["summary"]) + [""])


def render(res: Results, drawn: dict[str, list[Path]], out_dir: Path) -> str:
    """The markdown text for ``res`` with figures ``drawn`` (paths under ``out_dir``).

    Example::

        text = render(Results(data), write_figures(data, "out/figures"), Path("out"))
    """
    lines = ["# ccddp characterization report", "",
             f"Generated by `ccddp report` from `results.json` (schema `{SCHEMA}`) alone; "
             "`ccddp report DIR` regenerates this file and `figures/` from it.", ""]
    lines += _provenance(res, set(drawn))
    lines += _machine(res)
    lines += _shapes(res)
    lines += _ratios(res)
    lines += _trust(res)
    lines += _ops(res)
    lines += _failed(res)
    lines += _buckets(res)
    lines += _figures(drawn, out_dir)
    lines += _projections(res)
    lines += _fidelity(res)
    return "\n".join(lines).rstrip() + "\n"


def write_report(results_path_or_dict: str | Path | Mapping[str, Any] | Results,
                 out_dir: str | Path | None = None) -> Path:
    """Write ``out_dir/report.md`` and ``out_dir/figures/*`` from one results file.

    ``results_path_or_dict``: a path to ``results.json``, its loaded dict, or a
    :class:`~ccddp.report.results.Results`. ``out_dir`` defaults to the directory of
    the results file. Raises :class:`~ccddp.errors.ConfigError` for a missing,
    unreadable or wrong-schema file.

    Example::

        write_report("out/results.json", "out")   # -> Path('out/report.md')
    """
    if out_dir is None:
        if isinstance(results_path_or_dict, (str, Path)):
            out_dir = Path(results_path_or_dict).parent
        else:
            raise TypeError("out_dir is required when results are given as a dict")
    res = Results.load(results_path_or_dict)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = write_figures(res, out / FIGURES_DIR)
    path = out / "report.md"
    path.write_text(render(res, drawn, out), encoding="utf-8")
    return path


__all__ = ["write_report", "render", "CAPTIONS", "FIGURES_DIR"]
