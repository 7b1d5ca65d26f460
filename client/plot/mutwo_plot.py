#!/usr/bin/env python3
"""mutwo's one plot renderer (matplotlib): `mutwo plot` writes plot data
(JSON, format "mutwo-plot/1") and runs this script on it; the GPU
benchmark's report (bench/gpu/report.py) imports it.

    mutwo_plot.py DATA.json OUT.svg|OUT.png|OUT.pdf
    mutwo_plot.py DATA.json OUT.pickle [--timeline planned|baseline|measured]

The pickle form writes a timeline in the pickle format of
torch.cuda.memory._dump_snapshot ({"segments", "device_traces"}), for
https://pytorch.org/memory_viz and torch.cuda._memory_viz, and beside it
OUT.html: the same snapshot as one self-contained page (allocated memory
over the step, the largest blocks with when they were allocated and freed)
that opens offline in any browser (torch 1.13's own viewer fails on such
pickles with "string indices must be integers").

    mutwo_plot.py SNAPSHOT.pickle OUT.html

writes that page for an existing snapshot pickle.

Plot data kinds (every byte figure is in bytes, every time in ms):

- "timeline": one training step, the x axis is time. Each series gives, per
  timeline position, its end time (`end_ms`), the high-water mark during it
  (`peak_bytes`) and what is held after it (`after_bytes`); the curve drawn
  is the high-water mark over each op's duration. Also the budget, whether
  the schedule is feasible (and why not), the predicted and measured peaks
  and, for the snapshot export, the activations' live intervals.
- "batch": peak memory vs batch size: series of points, infeasible requests
  (drawn as red crosses at their budget), the device capacity and the
  predicted max batch.
- "pareto": peak memory vs iteration-time overhead: series of points per
  policy (mutwo's curve, sqrt_n, per_block, the baseline), predicted or
  measured.

Exit codes: 0 written, 2 bad data or arguments, 3 matplotlib is missing
(the caller may try another Python).
"""

import json
import math
import os
import pickle
import sys

FORMAT = "mutwo-plot/1"

# One colour per policy everywhere (CLI plots, benchmark report).
POLICY_COLORS = {
    "none": "#4d4d4d",
    "baseline": "#4d4d4d",
    "sqrt_n": "#1f77b4",
    "per_block": "#2ca02c",
    "mutwo": "#d62728",
}
# Markers per policy; the baseline's are the largest and drawn first, so a
# policy that matches it stays visible on top of it.
POLICY_MARKERS = {"none": "s", "baseline": "s", "sqrt_n": "D",
                  "per_block": "^", "mutwo": "o"}
# Budgets of a batch plot, in order.
BUDGET_COLORS = ["#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22"]
BUDGET_COLOR = "#d62728"
CAPACITY_COLOR = "#000000"
INFEASIBLE_COLOR = "#d62728"

_UNITS = [(2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"),
          (2 ** 10, "KiB"), (1, "B")]


def byte_unit(max_bytes):
    """(divisor, name): the largest binary unit the maximum is >= 1 of."""
    for div, name in _UNITS:
        if max_bytes >= div:
            return div, name
    return 1, "B"


def format_bytes(n):
    div, name = byte_unit(abs(n))
    if div == 1:
        return "%d B" % n
    return "%.2f %s" % (n / div, name)


class PlotDataError(ValueError):
    pass


def _require(data, key, kind):
    if key not in data:
        raise PlotDataError("%s plot data has no %r" % (kind, key))
    return data[key]


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _new_figure(title, subtitle=None, subtitle_color=None):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    lines = 0
    if subtitle:
        # Wrapped to the figure's width, never cut: a long planner note
        # (a ViT's reserve and knee) stays readable in full.
        import textwrap
        subtitle = "\n".join(textwrap.wrap(subtitle, 110))
        lines = subtitle.count("\n") + 1
    ax.set_title(title, loc="left", fontsize=12,
                 pad=8 + 12 * lines if subtitle else 6)
    if subtitle:
        # Between the title and the axes: never on the data.
        ax.text(0, 1.015, subtitle, transform=ax.transAxes, ha="left",
                va="bottom", fontsize=9, color=subtitle_color or "#333333")
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def _byte_axis(ax, max_bytes, label):
    """Scales bytes to one binary unit; returns the divisor."""
    from matplotlib.ticker import MaxNLocator
    div, name = byte_unit(max_bytes)
    ax.set_ylabel("%s (%s)" % (label, name))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
    return div


def _legend_outside(ax):
    """The legend right of the axes, so it never covers data."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc="upper left",
                     bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     frameon=False, fontsize=9)


def _finish(fig):
    fig.tight_layout()
    return fig


def timeline_figure(data):
    series = _require(data, "series", "timeline")
    if not series:
        raise PlotDataError("timeline plot data has no series")
    timed = all(any(t > 0 for t in s.get("end_ms", [])) for s in series)
    feasible = data.get("feasible", True)
    title = data.get("title") or "Memory over one training step"
    subtitle = None
    color = None
    budget = data.get("budget_bytes", 0)
    floor = data.get("floor_bytes", 0)
    if not feasible:
        if 0 < budget < floor:
            subtitle = ("INFEASIBLE: the budget %s is below the lowest peak "
                        "this policy reaches (floor %s)" % (
                            format_bytes(budget), format_bytes(floor)))
        else:
            subtitle = "INFEASIBLE: " + (data.get("reason") or
                                         "the schedule does not fit")
        color = INFEASIBLE_COLOR
    elif data.get("reason"):
        subtitle = data["reason"]
    fig, ax = _new_figure(title, subtitle, color)

    tops = [data.get("budget_bytes", 0), data.get("predicted_peak_bytes", 0),
            data.get("measured_peak_bytes", 0)]
    for s in series:
        tops += s.get("peak_bytes", []) + s.get("after_bytes", [])
    div = _byte_axis(ax, max(tops), "allocated memory")
    ax.set_ylim(0, max(tops) / div * 1.08)

    styles = {
        ("baseline", "simulated"): dict(color=POLICY_COLORS["none"],
                                        linestyle="--", linewidth=1.4),
        ("baseline", "measured"): dict(color="#1f77b4", linestyle="-",
                                       linewidth=1.0, alpha=0.85),
        ("planned", "simulated"): dict(color=POLICY_COLORS["mutwo"],
                                       linestyle="-", linewidth=1.8),
    }
    end_of_step = 0.0
    planned_curve = None
    backward_marks = []
    for s in series:
        key = (s.get("role", "planned"), s.get("source", "simulated"))
        style = styles.get(key, dict(color="#9467bd", linewidth=1.2))
        peaks = [v / div for v in s["peak_bytes"]]
        if timed:
            edges = [0.0] + list(s["end_ms"])
        else:
            edges = [p - 0.5 for p in s["position"]] + [s["position"][-1] + 0.5]
        # The high-water mark during each op, held over the op's duration.
        ax.stairs(peaks, edges, baseline=None, label=s["name"], **style)
        end_of_step = max(end_of_step, edges[-1])
        if key == ("planned", "simulated"):
            planned_curve = (edges, peaks)
        fw = s.get("backward_start_ms") if timed else data.get("forward_positions")
        if fw:
            x = fw if timed else fw - 0.5
            # Curves whose backward passes start together share one line.
            close = 0.005 * max(edges[-1], 1e-9)
            if all(abs(x - other) > close for other in backward_marks):
                ax.axvline(x, color=style["color"], linestyle=":",
                           linewidth=1.0, label="backward starts%s" % (
                               "" if not backward_marks else
                               " (%s)" % (key[1] if key[1] == "measured"
                                          else key[0])))
                backward_marks.append(x)

    if planned_curve is not None:
        _mark_decisions(ax, data, planned_curve[0], timed, max(tops) / div)

    if budget > 0:
        text = data.get("budget_text")
        ax.axhline(budget / div, color=BUDGET_COLOR, linestyle="-.",
                   linewidth=1.2,
                   label="budget %s%s" % (format_bytes(budget),
                                          " (%s)" % text if text else ""))
    predicted = data.get("predicted_peak_bytes", 0)
    if predicted > 0 and planned_curve is not None:
        edges, peaks = planned_curve
        i = max(range(len(peaks)), key=lambda k: peaks[k])
        x = (edges[i] + edges[i + 1]) / 2
        over = budget > 0 and predicted > budget
        ax.plot([x], [predicted / div], linestyle="none",
                marker="X" if over else "o", markersize=9,
                color=INFEASIBLE_COLOR if over else POLICY_COLORS["mutwo"],
                markeredgecolor="black",
                label="predicted peak %s%s" % (
                    format_bytes(predicted),
                    " (over the budget: infeasible)" if over else ""))
    measured = data.get("measured_peak_bytes", 0)
    if measured > 0:
        ax.axhline(measured / div, color="#2ca02c", linestyle=":",
                   linewidth=1.6,
                   label="measured peak of the schedule %s" %
                   format_bytes(measured))
    ax.set_xlim(0, end_of_step * 1.01 if timed else end_of_step)
    if timed:
        ax.set_xlabel("time from the start of the step (ms)")
    else:
        ax.set_xlabel("timeline position (forward ops, then backward steps; "
                      "the server sent no times)")
    _legend_outside(ax)
    return _finish(fig)


_DECISION_STYLES = {
    "RECOMPUTE": ("recomputed", "^", "#d62728"),
    "SWAP": ("swapped", "s", "#1f77b4"),
}


def _mark_decisions(ax, data, edges, timed, top):
    """What the schedule recomputed or swapped, and when: for each such
    activation, a bar in a lane under the curves from when the planned step
    frees it (after its last forward use, or its offload) to when it is
    rebuilt (its replay, or its prefetch), ending in a marker. One legend
    entry per action with the count; the lanes stack, largest first."""
    def start(position):
        # Position p runs over [edges[p], edges[p + 1]].
        return edges[max(0, min(position, len(edges) - 1))]

    def end(position):
        return edges[max(0, min(position + 1, len(edges) - 1))]

    marked = [a for a in data.get("activations", [])
              if a.get("action") in _DECISION_STYLES
              and len(a.get("planned", [])) >= 2]
    if not marked:
        return
    marked.sort(key=lambda a: -a.get("size", 0))
    lane = top * 0.035
    counts = {}
    for i, a in enumerate(marked):
        word, marker, color = _DECISION_STYLES[a["action"]]
        counts[a["action"]] = counts.get(a["action"], 0) + 1
        freed = end(a["planned"][0][1])
        rebuilt = start(a["planned"][1][0])
        y = lane * (1 + i % 8)
        first = counts[a["action"]] == 1
        n = sum(1 for b in marked if b["action"] == a["action"])
        ax.plot([freed, rebuilt], [y, y], color=color, linewidth=2.0,
                alpha=0.7, solid_capstyle="butt",
                label=("%s (%d): freed -> %s" % (
                    word, n, "replayed" if a["action"] == "RECOMPUTE"
                    else "fetched back")) if first else "_nolegend_")
        ax.plot([rebuilt], [y], linestyle="none", marker=marker,
                markersize=6, color=color, markeredgecolor="black",
                label="_nolegend_", gid="rebuilt:%s" % a.get("name", "?"))


def _batch_ticks(ax, batches):
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
    batches = sorted(set(batches))
    if len(batches) <= 12:
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))


def batch_figure(data):
    series = _require(data, "series", "batch")
    infeasible = data.get("infeasible", [])
    mb = data.get("max_batch") or {}
    capacity = data.get("capacity_bytes", 0) or mb.get("capacity_bytes", 0)
    title = data.get("title") or "Peak memory vs batch size"
    subtitle = None
    if infeasible:
        subtitle = "%d (batch, budget) request(s) infeasible, marked x" % len(
            infeasible)
    fig, ax = _new_figure(title, subtitle,
                          INFEASIBLE_COLOR if infeasible else None)
    batches = [p["batch"] for s in series for p in s["points"]]
    batches += [p["batch"] for p in infeasible]
    values = [p["peak_bytes"] for s in series for p in s["points"]]
    values += [p["budget_bytes"] for p in infeasible]
    if not batches:
        raise PlotDataError("batch plot data has no points")
    data_max = max(values) if values else 1
    # The capacity and the max batch are drawn where they do not squash the
    # measured points (a CPU worker's capacity is its host memory);
    # otherwise they are named in the legend only.
    max_batches = [(mb.get(k, 0), k) for k in ("without", "with")
                   if mb.get(k, 0) > 0]
    draw_capacity = 0 < capacity <= 4 * data_max
    x_hi = max(batches)
    if draw_capacity:
        x_hi = max([x_hi] + [b for b, _ in max_batches
                             if b <= 8 * max(batches)])
    top = max(values + ([capacity] if draw_capacity else []))
    div = _byte_axis(ax, top, "peak memory")
    ax.set_ylim(0, top / div * 1.1)

    n_budget = 0
    for s in series:
        policy = s.get("policy", "")
        source = s.get("source", "measured")
        color = s.get("color")
        if not color:
            if s.get("budget"):
                color = BUDGET_COLORS[n_budget % len(BUDGET_COLORS)]
            else:
                color = POLICY_COLORS.get(policy, "#9467bd")
        if s.get("budget") and source == "measured":
            n_budget += 1
        pts = sorted((p["batch"], p["peak_bytes"] / div) for p in s["points"])
        if not pts:
            continue
        xs, ys = zip(*pts)
        predicted = source == "predicted"
        is_baseline = policy in ("none", "baseline") and not s.get("budget")
        # Predicted: dashed with hollow, larger markers, drawn above the
        # measured series, so both stay visible where they coincide; the
        # baseline is wide and underneath for the same reason.
        ax.plot(xs, ys, linestyle="--" if predicted else "-",
                linewidth=3.0 if is_baseline else 1.5,
                marker=POLICY_MARKERS.get(policy, "o"),
                markersize=9 if predicted or is_baseline else 5,
                markerfacecolor="none" if predicted else color,
                markeredgewidth=1.5, color=color, label=s["name"],
                zorder=2 if is_baseline else 4 if predicted else 3)
    by_budget = {}
    for p in infeasible:
        by_budget.setdefault(p.get("budget", ""), []).append(p)
    for text, pts in by_budget.items():
        whys = sorted({p.get("why", "below the floor") for p in pts})
        ax.plot([p["batch"] for p in pts], [p["budget_bytes"] / div for p in pts],
                linestyle="none", marker="x", markersize=10,
                markeredgewidth=2.5, color=INFEASIBLE_COLOR, zorder=5,
                label="%sinfeasible (%s), x at the budget" % (
                    "budget %s: " % text if text else "", ", ".join(whys)))
    if capacity > 0:
        label = "device capacity %s" % format_bytes(capacity)
        if draw_capacity:
            ax.axhline(capacity / div, color=CAPACITY_COLOR, linestyle="-.",
                       linewidth=1.2, label=label)
        else:
            ax.plot([], [], linestyle="none", label=label + " (off the chart)")
    fit_slope = mb.get("bytes_per_sample", 0)
    if fit_slope > 0 and draw_capacity:
        x0 = min(batches)
        ax.plot([x0, x_hi], [(mb.get("bytes_intercept", 0) + fit_slope * x0) / div,
                             (mb.get("bytes_intercept", 0) + fit_slope * x_hi) / div],
                color="#7f7f7f", linestyle=":", linewidth=1.0,
                label="baseline fit (extrapolation)")
    for b, which in max_batches:
        text = "max batch %d %s checkpointing, %s" % (
            b, "without" if which == "without" else "with",
            "verified by a step" if mb.get(which + "_verified") else
            "predicted")
        if draw_capacity and b <= x_hi:
            ax.axvline(b, color=POLICY_COLORS["none" if which == "without"
                                              else "mutwo"],
                       linestyle="--", linewidth=1.0, label=text)
        else:
            ax.plot([], [], linestyle="none", label=text + " (off the chart)")
    span = x_hi - min(batches)
    pad = max(span * 0.05, 0.5 * min(batches) if span == 0 else 0)
    ax.set_xlim(max(0, min(batches) - pad), x_hi + pad)
    shown = sorted(set(batches) | {b for b, _ in max_batches
                                   if draw_capacity and b <= x_hi})
    _batch_ticks(ax, shown)
    ax.set_xlabel("batch size")
    _legend_outside(ax)
    return _finish(fig)


def pareto_figure(data):
    series = _require(data, "series", "pareto")
    base = data.get("baseline") or {}
    base_ms = base.get("iteration_ms", 0)
    title = data.get("title") or "Peak memory vs iteration time"
    fig, ax = _new_figure(title, data.get("subtitle"),
                          INFEASIBLE_COLOR if data.get("infeasible") else None)
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def overhead(p):
        if "overhead" in p:
            return 100.0 * p["overhead"]
        if base_ms <= 0:
            raise PlotDataError("pareto point without overhead and no "
                                "baseline iteration_ms")
        return 100.0 * (p["iteration_ms"] / base_ms - 1.0)

    values = [p["peak_bytes"] for s in series for p in s["points"]]
    if base.get("peak_bytes"):
        values.append(base["peak_bytes"])
    if not values:
        raise PlotDataError("pareto plot data has no points")
    budget = data.get("budget_bytes", 0)
    div = _byte_axis(ax, max(values + [budget]), "peak memory")
    xs_all = [0.0]
    for s in series:
        policy = s.get("policy", "")
        color = s.get("color") or POLICY_COLORS.get(policy, "#9467bd")
        predicted = s.get("source") == "predicted"
        hollow = s.get("hollow", predicted)
        pts = sorted((overhead(p), p["peak_bytes"] / div) for p in s["points"])
        if not pts:
            continue
        xs, ys = zip(*pts)
        xs_all += xs
        line = s.get("line", len(pts) > 1)
        ax.plot(xs, ys, linestyle=("--" if predicted else "-") if line else "none",
                marker=s.get("marker", "o"),
                markersize=9 if hollow else 8,
                markerfacecolor="none" if hollow else color,
                markeredgewidth=1.5, color=color, label=s["name"],
                zorder=4 if predicted else 3)
    if base.get("peak_bytes"):
        # Large and underneath: mutwo's curve starts at the baseline.
        ax.plot([0], [base["peak_bytes"] / div], linestyle="none", marker="s",
                markersize=12, color=POLICY_COLORS["none"], zorder=1,
                label="baseline (no checkpointing) %s" %
                format_bytes(base["peak_bytes"]))
    if budget > 0:
        ax.axhline(budget / div, color=BUDGET_COLOR, linestyle="-.",
                   linewidth=1.2, label="budget %s" % format_bytes(budget))
    floor = data.get("floor_bytes", 0)
    if floor > 0:
        # A budget, drawn as one: no point of the curve lies below it by
        # more than the allocator reserve its plans keep.
        ax.axhline(floor / div, color="#555555", linestyle=":",
                   linewidth=1.4,
                   label="floor %s (the lowest budget that fits)" %
                   format_bytes(floor))
    knee = data.get("knee")
    if knee:
        x = overhead(knee)
        xs_all.append(x)
        ax.plot([x], [knee["peak_bytes"] / div], linestyle="none",
                marker="P", markersize=14, color=POLICY_COLORS["mutwo"],
                markeredgecolor="black", zorder=6,
                label="knee (budget auto %s): peak %s, %+.1f%%" % (
                    format_bytes(knee.get("budget_bytes", 0)),
                    format_bytes(knee["peak_bytes"]), x))
    lo, hi = min(xs_all), max(xs_all)
    pad = max((hi - lo) * 0.06, 1.0)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(0, max(values + [budget]) / div * 1.1)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda v, _: "%g%%" % round(v, 6)))
    ax.set_xlabel(data.get("x_label") or
                  "iteration-time overhead vs the step without checkpointing")
    _legend_outside(ax)
    return _finish(fig)


FIGURES = {"timeline": timeline_figure, "batch": batch_figure,
           "pareto": pareto_figure}


def figure(data):
    if data.get("format", FORMAT) != FORMAT:
        raise PlotDataError("plot data format %r; this renderer reads %r"
                            % (data.get("format"), FORMAT))
    kind = data.get("kind")
    if kind not in FIGURES:
        raise PlotDataError("unknown plot kind %r (timeline, batch, pareto)"
                            % kind)
    return FIGURES[kind](data)


def save(fig, path):
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".svg", ".png", ".pdf"):
        raise PlotDataError("%s: write .svg, .png or .pdf" % path)
    import matplotlib
    tmp = path + ".tmp" + ext
    # SVG text stays text (small files, searchable, editable); no dates or
    # random ids, so one data set always gives the same file.
    metadata = {"Date": None} if ext == ".svg" else (
        {"CreationDate": None} if ext == ".pdf" else {})
    with matplotlib.rc_context({"svg.fonttype": "none",
                                "svg.hashsalt": "mutwo"}):
        # bbox_inches="tight": the legend outside the axes is never clipped.
        fig.savefig(tmp, dpi=150 if ext == ".png" else 100,
                    bbox_inches="tight", metadata=metadata)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle)
# ---------------------------------------------------------------------------

_ALIGN = 512


def _frames(name, position):
    return [{"filename": "mutwo", "line": int(position), "name": name}]


def snapshot(data, timeline="planned"):
    """A memory snapshot of one of the timeline's series: "planned" (the
    simulated schedule), "baseline" (simulated, no checkpointing) or
    "measured" (the profiler's measurement of the baseline step).

    Each activation is one block, allocated when its producer runs and freed
    after its last use (a recomputed or swapped one is freed early and
    allocated again before its backward use); fixed memory (parameters,
    gradients, optimizer state, inputs) is allocated before the trace starts;
    what the activations do not explain (other tensors, an op's temporaries)
    is one "other" block per op and one transient block during it, so the
    trace's allocated bytes follow the series' curve: after each op its
    `after_bytes`, during it its `peak_bytes`."""
    if data.get("kind") != "timeline":
        raise PlotDataError("a memory snapshot needs timeline plot data")
    wanted = {"planned": ("planned", "simulated"),
              "baseline": ("baseline", "simulated"),
              "measured": ("baseline", "measured")}
    if timeline not in wanted:
        raise PlotDataError("--timeline %r: planned, baseline or measured"
                            % timeline)
    matches = [s for s in data["series"]
               if (s.get("role"), s.get("source")) == wanted[timeline]]
    if not matches:
        raise PlotDataError("the plot data has no %s timeline" % timeline)
    s = matches[0]
    plan_key = "planned" if timeline == "planned" else "baseline"
    fixed = int(data.get("fixed_bytes", 0))
    positions = s["position"]
    ends = s.get("end_ms") or [float(p + 1) for p in positions]
    if not any(e > 0 for e in ends):
        ends = [float(p + 1) for p in positions]

    # Activation intervals [first, last] (inclusive positions).
    starts, stops = {}, {}
    for a in data.get("activations", []):
        for first, last in a.get(plan_key, []):
            starts.setdefault(first, []).append((a, first, last))
            stops.setdefault(last, []).append(a)

    trace = []
    next_addr = [_ALIGN * 2 + ((fixed + _ALIGN - 1) // _ALIGN) * _ALIGN]
    holes = []  # [addr, size] of freed ranges below next_addr, by address
    high = [next_addr[0]]  # the top's high-water mark: the pool's size

    def rounded(size):
        return max(_ALIGN, ((size + _ALIGN - 1) // _ALIGN) * _ALIGN)

    def alloc(size, name, position, t_ms):
        # First fit over the freed ranges, else the top: the pool stays
        # about as large as the peak, as an allocator's would.
        need = rounded(size)
        for i, (start, length) in enumerate(holes):
            if length >= need:
                addr = start
                if length == need:
                    del holes[i]
                else:
                    holes[i] = [start + need, length - need]
                break
        else:
            addr = next_addr[0]
            next_addr[0] += need
            high[0] = max(high[0], next_addr[0])
        trace.append({"action": "alloc", "addr": addr, "size": int(size),
                      "stream": 0, "frames": _frames(name, position),
                      "time_us": int(round(t_ms * 1000))})
        return addr

    def release(addr, size):
        holes.append([addr, rounded(size)])
        holes.sort()
        merged = []
        for start, length in holes:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += length
            else:
                merged.append([start, length])
        if merged and merged[-1][0] + merged[-1][1] == next_addr[0]:
            next_addr[0] = merged.pop()[0]
        holes[:] = merged

    def free(addr, size, name, position, t_ms):
        release(addr, size)
        for action in ("free_requested", "free_completed"):
            trace.append({"action": action, "addr": addr, "size": int(size),
                          "stream": 0, "frames": _frames(name, position),
                          "time_us": int(round(t_ms * 1000))})

    live = {}   # activation id -> (addr, size, name)
    live_bytes = 0
    other = None  # (addr, size)
    prev_pos, prev_end = -1, 0.0
    for k, pos in enumerate(positions):
        begin = prev_end
        end = ends[k]
        # Activations made in (prev_pos, pos].
        for p in range(prev_pos + 1, pos + 1):
            for a, first, last in starts.get(p, []):
                name = a.get("name") or "activation %d" % a["id"]
                label = "%s [%s]" % (name, a.get("action", "RETAIN").lower())
                addr = alloc(a["size"], label, p, begin)
                live[(a["id"], first)] = (addr, a["size"], label)
                live_bytes += a["size"]
        held = fixed + live_bytes + (other[1] if other else 0)
        transient = int(s["peak_bytes"][k]) - held
        if transient > 0:
            addr = alloc(transient, "op temporaries", pos, begin)
            free(addr, transient, "op temporaries", pos, end)
        # Activations whose last use was in (prev_pos, pos].
        for p in range(prev_pos + 1, pos + 1):
            for a in stops.get(p, []):
                for key in [key for key in live if key[0] == a["id"]]:
                    addr, size, label = live.pop(key)
                    free(addr, size, label, p, end)
                    live_bytes -= size
        want = int(s["after_bytes"][k]) - fixed - live_bytes
        if other is not None and other[1] != max(0, want):
            free(other[0], other[1], "other tensors", pos, end)
            other = None
        if other is None and want > 0:
            other = (alloc(want, "other tensors", pos, end), want)
        prev_pos, prev_end = pos, end

    segments = []
    if fixed > 0:
        segments.append(_segment(_ALIGN, fixed, [{
            "address": _ALIGN, "size": fixed, "requested_size": fixed,
            "state": "active_allocated",
            "frames": _frames("parameters, gradients, optimizer state, inputs",
                              0)}]))
    pool_start = _ALIGN * 2 + ((fixed + _ALIGN - 1) // _ALIGN) * _ALIGN
    pool_size = high[0] - pool_start
    if pool_size > 0:
        blocks = []
        cursor = pool_start
        # Blocks still allocated at the end of the trace stay allocated.
        held = [(v[0], v[1]) for v in live.values()]
        if other:
            held.append(tuple(other))
        for addr, size in sorted(held):
            if addr > cursor:
                blocks.append(_block(cursor, addr - cursor, "inactive"))
            blocks.append(_block(addr, rounded(size), "active_allocated", size))
            cursor = addr + rounded(size)
        if cursor < pool_start + pool_size:
            blocks.append(_block(cursor, pool_start + pool_size - cursor,
                                 "inactive"))
        segments.append(_segment(pool_start, pool_size, blocks))
    return {"segments": segments, "device_traces": [trace]}


def _block(address, size, state, requested=None):
    return {"address": address, "size": size,
            "requested_size": size if requested is None else requested,
            "state": state, "frames": []}


def _segment(address, total, blocks):
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": address, "total_size": total,
            "allocated_size": active, "active_size": active,
            "requested_size": sum(b["requested_size"] for b in blocks
                                  if b["state"] == "active_allocated"),
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}


def replay(snap):
    """(start bytes, [(time_us, allocated bytes after the event, position)])
    of a snapshot's trace: the start counts the blocks allocated before it
    (those active at the end that the trace never allocated)."""
    traced = {e["addr"] for e in snap["device_traces"][0]
              if e["action"] == "alloc"}
    start = sum(b["requested_size"] for seg in snap["segments"]
                for b in seg["blocks"]
                if b["state"] == "active_allocated" and b["address"] not in traced)
    out, now = [], start
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            now += e["size"]
        elif e["action"] == "free_completed":
            now -= e["size"]
        else:
            continue
        out.append((e["time_us"], now, e["frames"][0]["line"]))
    return start, out


def _escape(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;")
            .replace(">", "&gt;").replace('"', "&quot;"))


def snapshot_html(snap, title="memory snapshot", max_rows=300):
    """One self-contained HTML page for a snapshot (as snapshot() writes it,
    or a torch.cuda.memory._snapshot() with device_traces): allocated bytes
    over the trace as an inline SVG, and the largest allocations with their
    name, size and alloc/free times. No script, no network: it opens
    offline."""
    if not isinstance(snap, dict) or "device_traces" not in snap:
        raise PlotDataError("not a memory snapshot with device_traces "
                            "(torch.cuda.memory._dump_snapshot's pickle)")
    start, points = replay(snap)
    if not points:
        raise PlotDataError("the snapshot's trace has no allocation")
    peak = max([start] + [now for _, now, _ in points])
    peak_t = next(t for t, now, _ in points if now == peak) if any(
        now == peak for _, now, _ in points) else 0
    t_end = max(t for t, _, _ in points) or 1
    w, h, pad = 900, 300, 60
    x = lambda t: pad + (w - 2 * pad) * t / t_end
    y = lambda b: h - pad + (-(h - 2 * pad) * b / peak if peak else 0)
    path, now = ["M%.1f,%.1f" % (x(0), y(start))], start
    for t, after, _ in points:
        path.append("L%.1f,%.1f" % (x(t), y(now)))
        path.append("L%.1f,%.1f" % (x(t), y(after)))
        now = after
    # Blocks: alloc/free pairs by address, in trace order.
    open_at, blocks = {}, []
    for e in snap["device_traces"][0]:
        frame = (e.get("frames") or [{}])[0]
        name = frame.get("name", "?")
        if e["action"] == "alloc":
            open_at[e["addr"]] = (name, e["size"], e["time_us"])
        elif e["action"] == "free_completed" and e["addr"] in open_at:
            n, size, t0 = open_at.pop(e["addr"])
            blocks.append((n, size, t0, e["time_us"]))
    for n, size, t0 in open_at.values():
        blocks.append((n, size, t0, None))
    blocks.sort(key=lambda b: (-b[1], b[2]))
    rows = []
    for n, size, t0, t1 in blocks[:max_rows]:
        mark = (" class=\"recompute\"" if "[recompute]" in n else
                " class=\"swap\"" if "[swap" in n else "")
        rows.append("<tr%s><td>%s</td><td>%s</td><td>%.3f</td><td>%s</td>"
                    "</tr>" % (mark, _escape(n), format_bytes(size),
                               t0 / 1000.0, "held at the end" if t1 is None
                               else "%.3f" % (t1 / 1000.0)))
    ticks = []
    for i in range(5):
        b = peak * i / 4
        ticks.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                     % (pad - 4, y(b) + 4, _escape(format_bytes(int(b)))))
    return """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>%(title)s</title>
<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 8px;
text-align:right}td:first-child{text-align:left}tr.recompute{background:#fde}
tr.swap{background:#def}svg text{font-size:11px}</style></head><body>
<h1>%(title)s</h1>
<p>Allocated memory over the step: starts at %(start)s (held before the
trace: parameters, gradients, optimizer state, inputs), peaks at
<b>%(peak)s</b> at %(peak_ms).3f ms; the trace ends at %(end_ms).3f ms.
%(count)d allocations.</p>
<svg width="%(w)d" height="%(h)d" xmlns="http://www.w3.org/2000/svg">
<path d="%(path)s" fill="none" stroke="#1f77b4"/>
<line x1="%(pad)d" y1="%(py).1f" x2="%(xr)d" y2="%(py).1f" stroke="#d62728"
 stroke-dasharray="4"/>%(ticks)s
<text x="%(xm)d" y="%(yb)d" text-anchor="middle">time (ms)</text></svg>
<h2>Largest blocks</h2>
<p>Rows in red are recomputed activations, in blue swapped ones (allocated
again before their backward use).</p>
<table><tr><th>allocated by</th><th>size</th><th>allocated at (ms)</th>
<th>freed at (ms)</th></tr>
%(rows)s
</table></body></html>
""" % {"title": _escape(title), "start": format_bytes(start),
       "peak": format_bytes(peak), "peak_ms": peak_t / 1000.0,
       "end_ms": t_end / 1000.0, "count": len(blocks), "w": w, "h": h,
       "pad": pad, "path": " ".join(path), "py": y(peak), "xr": w - pad,
       "ticks": "".join(ticks), "xm": w // 2, "yb": h - pad // 3,
       "rows": "\n".join(rows)}


def _write(path, text_or_bytes):
    tmp = path + ".tmp"
    mode = "wb" if isinstance(text_or_bytes, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(text_or_bytes)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def main(argv):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="plot data JSON (- for stdin), or a "
                        "snapshot .pickle to convert to .html")
    parser.add_argument("out", help=".svg, .png, .pdf, .pickle (timeline; "
                        "writes .html beside it) or .html (from a .pickle)")
    parser.add_argument("--timeline", default="planned",
                        help="for .pickle: planned, baseline or measured")
    args = parser.parse_args(argv)
    if args.data.endswith(".pickle"):
        if not args.out.endswith(".html"):
            print("mutwo_plot: a snapshot pickle converts to .html only",
                  file=sys.stderr)
            return 2
        try:
            with open(args.data, "rb") as f:
                snap = pickle.load(f)
            _write(args.out, snapshot_html(
                snap, os.path.basename(args.data)))
        except PlotDataError as e:
            print("mutwo_plot: %s: %s" % (args.data, e), file=sys.stderr)
            return 2
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            print("mutwo_plot: %s" % e, file=sys.stderr)
            return 2
        return 0
    try:
        if args.data == "-":
            data = json.load(sys.stdin)
        else:
            with open(args.data) as f:
                data = json.load(f)
    except (OSError, ValueError) as e:
        print("mutwo_plot: %s: %s" % (args.data, e), file=sys.stderr)
        return 2
    try:
        if args.out.endswith(".pickle"):
            snap = snapshot(data, args.timeline)
            _write(args.out, pickle.dumps(snap))
            # Beside it, the page that opens offline.
            _write(args.out[:-len(".pickle")] + ".html", snapshot_html(
                snap, "%s: %s timeline" % (os.path.basename(args.out),
                                           args.timeline)))
            return 0
        try:
            _pyplot()
        except ImportError:
            return 3
        save(figure(data), args.out)
    except PlotDataError as e:
        print("mutwo_plot: %s" % e, file=sys.stderr)
        return 2
    except OSError as e:
        print("mutwo_plot: %s: %s" % (args.out, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
