#!/usr/bin/python3
"""The plot renderer (client/plot/mutwo_plot.py): each figure is drawn from
plot data, rendered to PNG and checked for its elements: the legend never
overlaps the axes (so it covers no data), the budget / capacity lines and
the infeasible markers are there, the timeline's x axis is time and its
curve is the peak during each op, ticks are round numbers (integers at the
batch sizes), predicted and measured series are both visible; and the
memory snapshot export replays to the timeline's curve and reads with
torch's own torch.cuda._memory_viz when torch is there.

Usage: test_mutwo_plot.py   (Debian's python3 with python3-matplotlib)
"""

import copy
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("MUTWO_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "client", "plot", "mutwo_plot.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import mutwo_plot as mp  # noqa: E402

MIB = 2 ** 20


def timeline_data(feasible=True):
    """Six positions (three forward ops, three backward steps); the planned
    step is longer (a replay) and peaks at 70 MiB during position 4, above
    what it holds after any position (60 MiB)."""
    return {
        "format": "mutwo-plot/1", "kind": "timeline",
        "title": "Memory over one training step: net, batch 32",
        "model": "net", "batch": 32, "policy": "MUTWO",
        "budget_bytes": (80 if feasible else 65) * MIB,
        "budget_text": "60%",
        "feasible": feasible,
        "reason": "" if feasible else "budget 65.00 MiB is below the floor 70.00 MiB",
        "predicted_peak_bytes": 70 * MIB,
        "baseline_peak_bytes": 100 * MIB,
        "floor_bytes": 70 * MIB,
        "measured_peak_bytes": 69 * MIB if feasible else 0,
        "fixed_bytes": 10 * MIB,
        "forward_positions": 3,
        "series": [
            {"name": "baseline, simulated", "role": "baseline",
             "source": "simulated", "position": [0, 1, 2, 3, 4, 5],
             "end_ms": [1.0, 2.0, 3.0, 5.0, 7.0, 9.0],
             "peak_bytes": [v * MIB for v in [40, 70, 100, 100, 80, 50]],
             "after_bytes": [v * MIB for v in [30, 60, 90, 70, 40, 10]],
             "backward_start_ms": 3.0},
            {"name": "MUTWO schedule, simulated", "role": "planned",
             "source": "simulated", "position": [0, 1, 2, 3, 4, 5],
             "end_ms": [1.0, 2.0, 3.0, 5.0, 8.0, 10.0],
             "peak_bytes": [v * MIB for v in [40, 50, 60, 60, 70, 50]],
             "after_bytes": [v * MIB for v in [30, 40, 50, 50, 40, 10]],
             "backward_start_ms": 3.0},
            {"name": "baseline, measured by the profiler", "role": "baseline",
             "source": "measured", "position": [0, 1, 2, 3, 4, 5],
             "end_ms": [1.0, 2.0, 3.0, 5.0, 7.0, 9.0],
             "peak_bytes": [v * MIB for v in [41, 71, 101, 99, 80, 50]],
             "after_bytes": [v * MIB for v in [30, 60, 90, 70, 40, 10]]},
        ],
        "activations": [
            {"id": 1, "name": "conv1 (aten::conv2d)", "size": 20 * MIB,
             "action": "RETAIN", "baseline": [[0, 5]], "planned": [[0, 5]]},
            {"id": 2, "name": "relu (aten::relu)", "size": 10 * MIB,
             "action": "RECOMPUTE", "baseline": [[1, 4]],
             "planned": [[1, 2], [4, 4]]},
        ],
    }


def batch_data(batches=(8, 16, 32), with_capacity=True):
    pts = lambda f: [{"batch": b, "peak_bytes": int(f(b))} for b in batches]
    data = {
        "format": "mutwo-plot/1", "kind": "batch",
        "title": "Peak memory vs batch size: net",
        "series": [
            {"name": "baseline (profiled)", "policy": "none",
             "source": "measured", "points": pts(lambda b: 10 * MIB + b * 2 * MIB)},
            {"name": "budget 60%: predicted", "budget": "60%",
             "source": "predicted", "points": pts(lambda b: 10 * MIB + b * 1.2 * MIB)},
            {"name": "budget 60%: measured", "budget": "60%",
             "source": "measured", "points": pts(lambda b: 10 * MIB + b * 1.2 * MIB)},
        ],
        "infeasible": [{"batch": batches[-1], "budget_bytes": 30 * MIB,
                        "budget": "30MiB"}],
    }
    if with_capacity:
        data["max_batch"] = {"capacity_bytes": 128 * MIB, "without": 59,
                             "with": 98, "bytes_per_sample": 2 * MIB,
                             "bytes_intercept": 10 * MIB,
                             "without_verified": True,
                             "with_verified": False}
    return data


def pareto_data():
    return {
        "format": "mutwo-plot/1", "kind": "pareto",
        "title": "Peak memory vs iteration time: net, batch 32",
        "baseline": {"peak_bytes": 100 * MIB, "iteration_ms": 10.0},
        "budget_bytes": 60 * MIB,
        "series": [
            {"name": "mutwo (predicted)", "policy": "mutwo", "source": "predicted",
             "line": True,
             "points": [{"peak_bytes": v * MIB, "iteration_ms": t}
                        for v, t in [(90, 10.2), (70, 10.8), (55, 11.9), (45, 13.5)]]},
            {"name": "sqrt_n (predicted)", "policy": "sqrt_n", "source": "predicted",
             "points": [{"peak_bytes": 60 * MIB, "iteration_ms": 13.0}]},
            {"name": "per_block (predicted)", "policy": "per_block",
             "source": "predicted",
             "points": [{"peak_bytes": 65 * MIB, "iteration_ms": 12.6}]},
        ],
    }


def render(fig):
    """Draws the figure as the PNG it writes; returns the renderer."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    return fig.canvas.get_renderer()


def labels(ax):
    return ax.get_legend_handles_labels()[1]


class FigureChecks:
    def check_legend_outside(self, fig):
        r = render(fig)
        ax = fig.axes[0]
        legend = ax.get_legend()
        self.assertIsNotNone(legend)
        lb = legend.get_window_extent(r)
        ab = ax.get_window_extent(r)
        self.assertFalse(lb.overlaps(ab),
                         "legend %s overlaps the axes %s" % (lb, ab))
        # Not clipped: the saved (tight) figure contains it.
        tight = fig.get_tightbbox(r).transformed(fig.dpi_scale_trans)
        self.assertLessEqual(lb.x1, tight.x1 + 1)
        self.assertGreaterEqual(lb.y0, tight.y0 - 1)

    def check_round_ticks(self, values):
        for v in values:
            self.assertAlmostEqual(v * 4, round(v * 4), places=6,
                                   msg="tick %r is not a round number" % v)


class TimelineTest(unittest.TestCase, FigureChecks):
    def test_time_axis_peak_during_budget_and_legend(self):
        fig = mp.timeline_figure(timeline_data())
        ax = fig.axes[0]
        self.check_legend_outside(fig)
        self.assertIn("time", ax.get_xlabel())
        self.assertIn("ms", ax.get_xlabel())
        self.assertIn("MiB", ax.get_ylabel())
        # The x axis spans the planned step's duration (10 ms), not positions.
        self.assertAlmostEqual(ax.get_xlim()[1], 10.1, places=3)
        from matplotlib.patches import StepPatch
        steps = {p.get_label(): p for p in ax.patches if isinstance(p, StepPatch)}
        planned = steps["MUTWO schedule, simulated"]
        values, edges, _ = planned.get_data()
        # The peak during each op (70 MiB during position 4), not the
        # memory after it (never above 50 MiB).
        self.assertEqual(max(values), 70)
        self.assertEqual(list(edges), [0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0])
        # Predicted and measured both drawn.
        self.assertIn("baseline, measured by the profiler", steps)
        self.assertIn("baseline, simulated", steps)
        names = labels(ax)
        budget = [n for n in names if n.startswith("budget 80.00 MiB")]
        self.assertEqual(len(budget), 1, names)
        budget_lines = [l for l in ax.lines if l.get_label() == budget[0]]
        self.assertEqual(list(budget_lines[0].get_ydata()), [80, 80])
        self.assertTrue(any(n.startswith("measured peak of the schedule")
                            for n in names), names)
        self.assertTrue(any(n.startswith("backward starts") for n in names))
        self.check_round_ticks(ax.get_yticks())
        self.assertFalse(any("INFEASIBLE" in t.get_text() for t in ax.texts))

    def test_recomputed_activation_is_marked_when(self):
        # relu is freed after position 2 (ends at 3 ms) and replayed for
        # position 4 (starts at 5 ms): a bar from 3 to 5 ms ending in a
        # marker, and a legend entry with the count.
        fig = mp.timeline_figure(timeline_data())
        ax = fig.axes[0]
        names = labels(ax)
        self.assertIn("recomputed (1): freed -> replayed", names)
        bar = [l for l in ax.lines
               if l.get_label() == "recomputed (1): freed -> replayed"][0]
        self.assertEqual(list(bar.get_xdata()), [3.0, 5.0])
        mark = [l for l in ax.lines
                if l.get_gid() == "rebuilt:relu (aten::relu)"]
        self.assertEqual(len(mark), 1)
        self.assertEqual(list(mark[0].get_xdata()), [5.0])
        self.check_legend_outside(fig)
        # A swapped one is marked as swapped.
        data = timeline_data()
        data["activations"][1]["action"] = "SWAP"
        self.assertIn("swapped (1): freed -> fetched back",
                      labels(mp.timeline_figure(data).axes[0]))

    def test_infeasible_schedule_is_marked(self):
        fig = mp.timeline_figure(timeline_data(feasible=False))
        ax = fig.axes[0]
        self.check_legend_outside(fig)
        banner = [t for t in ax.texts if t.get_text().startswith("INFEASIBLE")]
        self.assertEqual(len(banner), 1)
        self.assertIn("below the lowest peak this policy reaches (floor "
                      "70.00 MiB)", banner[0].get_text())
        # Above the axes, so it covers no data.
        r = render(fig)
        self.assertGreaterEqual(banner[0].get_window_extent(r).y0,
                                ax.get_window_extent(r).y1 - 1)
        peak = [l for l in ax.lines
                if l.get_label().startswith("predicted peak")]
        self.assertEqual(len(peak), 1)
        self.assertEqual(peak[0].get_marker(), "X")
        self.assertIn("infeasible", peak[0].get_label())
        self.assertEqual(list(peak[0].get_ydata()), [70])

    def test_a_long_note_is_wrapped_whole_above_the_axes(self):
        data = timeline_data()
        data["reason"] = ("auto: the knee of the Pareto curve, its point "
                          "6 of 14, the one that trades memory for time "
                          "best; planned for 1.50 GiB, the budget less a "
                          "reserve of 19.40 MiB (4 MiB + 1% of the budget) "
                          "for the CUDA caching allocator's block rounding")
        fig = mp.timeline_figure(data)
        ax = fig.axes[0]
        notes = [t for t in ax.texts if t.get_text().startswith("auto:")]
        self.assertEqual(len(notes), 1)
        text = notes[0].get_text()
        self.assertNotIn("...", text)
        self.assertEqual(" ".join(text.split()), " ".join(data["reason"].split()))
        self.assertGreaterEqual(text.count("\n"), 1)
        # Above the axes and below the title, overlapping neither.
        r = render(fig)
        box = notes[0].get_window_extent(r)
        self.assertGreaterEqual(box.y0, ax.get_window_extent(r).y1 - 1)
        self.assertLessEqual(box.y1, ax.title.get_window_extent(r).y0 + 1)

    def test_without_times_falls_back_to_positions(self):
        data = timeline_data()
        for s in data["series"]:
            s["end_ms"] = [0.0] * len(s["position"])
        ax = mp.timeline_figure(data).axes[0]
        self.assertIn("position", ax.get_xlabel())


class BatchTest(unittest.TestCase, FigureChecks):
    def test_capacity_max_batch_infeasible_and_both_series(self):
        fig = mp.batch_figure(batch_data())
        ax = fig.axes[0]
        self.check_legend_outside(fig)
        names = labels(ax)
        cap = [l for l in ax.lines if l.get_label().startswith("device capacity")]
        self.assertEqual(len(cap), 1, names)
        self.assertEqual(list(cap[0].get_ydata()), [128, 128])
        mb = [l for l in ax.lines if l.get_label().startswith("max batch")]
        self.assertEqual(sorted(l.get_xdata()[0] for l in mb), [59, 98])
        # Each says whether a step on a worker proved it.
        self.assertEqual(
            sorted(l.get_label() for l in mb),
            ["max batch 59 without checkpointing, verified by a step",
             "max batch 98 with checkpointing, predicted"])
        x = [l for l in ax.lines if "infeasible" in l.get_label()]
        self.assertEqual(len(x), 1)
        self.assertTrue(x[0].get_label().startswith("budget 30MiB: infeasible"))
        self.assertEqual(x[0].get_marker(), "x")
        self.assertEqual(list(x[0].get_ydata()), [30])
        # The predicted series is drawn above the measured one (hollow,
        # larger markers), so both stay visible where they coincide.
        pred = [l for l in ax.lines if l.get_label() == "budget 60%: predicted"][0]
        meas = [l for l in ax.lines if l.get_label() == "budget 60%: measured"][0]
        self.assertGreater(pred.get_zorder(), meas.get_zorder())
        self.assertEqual(pred.get_markerfacecolor(), "none")
        self.assertGreater(pred.get_markersize(), meas.get_markersize())
        # Ticks at the batch sizes (and the max batches), all integers.
        ticks = list(ax.get_xticks())
        self.assertTrue({8, 16, 32, 59, 98} <= set(ticks), ticks)
        self.assertTrue(all(float(t).is_integer() for t in ticks), ticks)
        self.check_round_ticks(ax.get_yticks())

    def test_one_batch_has_one_integer_tick(self):
        fig = mp.batch_figure(batch_data(batches=(8,), with_capacity=False))
        render(fig)
        ax = fig.axes[0]
        ticks = [t for t in ax.get_xticks()
                 if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        self.assertEqual(ticks, [8])

    def test_capacity_far_above_the_data_is_named_not_drawn(self):
        data = batch_data()
        data["max_batch"]["capacity_bytes"] = 500 * 2 ** 30
        data["max_batch"]["without"] = 250000
        fig = mp.batch_figure(data)
        ax = fig.axes[0]
        self.assertLess(ax.get_ylim()[1], 200)  # MiB: the data stay readable
        self.assertTrue(any("off the chart" in n and "capacity" in n
                            for n in labels(ax)))
        self.assertLess(ax.get_xlim()[1], 100)


class ParetoTest(unittest.TestCase, FigureChecks):
    def test_floor_and_knee_are_marked(self):
        data = pareto_data()
        data["floor_bytes"] = 46 * MIB
        data["knee"] = {"budget_bytes": 56 * MIB, "peak_bytes": 55 * MIB,
                        "iteration_ms": 11.9, "overhead": 0.19}
        fig = mp.pareto_figure(data)
        ax = fig.axes[0]
        self.check_legend_outside(fig)
        names = labels(ax)
        floor = [n for n in names if n.startswith("floor 46.00 MiB")]
        self.assertEqual(len(floor), 1, names)
        line = [l for l in ax.lines if l.get_label() == floor[0]][0]
        self.assertEqual(list(line.get_ydata()), [46, 46])  # a budget line
        knee = [l for l in ax.lines if l.get_label().startswith("knee")]
        self.assertEqual(len(knee), 1, names)
        self.assertIn("budget auto 56.00 MiB", knee[0].get_label())
        self.assertAlmostEqual(knee[0].get_xdata()[0], 19.0)
        self.assertEqual(list(knee[0].get_ydata()), [55])
        # Without them in the data, neither is drawn.
        plain = labels(mp.pareto_figure(pareto_data()).axes[0])
        self.assertFalse(any(n.startswith(("floor", "knee")) for n in plain))

    def test_curve_and_baseline_policies(self):
        fig = mp.pareto_figure(pareto_data())
        ax = fig.axes[0]
        self.check_legend_outside(fig)
        names = labels(ax)
        for want in ("mutwo (predicted)", "sqrt_n (predicted)",
                     "per_block (predicted)"):
            self.assertIn(want, names)
        curve = [l for l in ax.lines if l.get_label() == "mutwo (predicted)"][0]
        self.assertEqual(len(curve.get_xdata()), 4)
        self.assertAlmostEqual(curve.get_xdata()[0], 2.0)  # +2% overhead
        self.assertTrue(any(n.startswith("baseline") for n in names))
        self.assertTrue(any(n.startswith("budget") for n in names))
        ticks = ax.get_xticks()
        self.check_round_ticks(ticks)
        self.assertTrue(all(abs(t - round(t)) < 1e-9 for t in ticks), ticks)


class CommandLineTest(unittest.TestCase):
    def run_script(self, data, out, *extra):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.json")
            with open(path, "w") as f:
                json.dump(data, f)
            target = os.path.join(d, out)
            r = subprocess.run([sys.executable, SCRIPT, path, target, *extra],
                               capture_output=True, text=True)
            body = None
            if os.path.exists(target):
                with open(target, "rb") as f:
                    body = f.read()
            return r, body

    def test_every_kind_renders_svg_png_pdf(self):
        for data in (timeline_data(), batch_data(), pareto_data()):
            for out, magic in (("p.png", b"\x89PNG"), ("p.svg", b"<?xml"),
                               ("p.pdf", b"%PDF")):
                r, body = self.run_script(data, out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(body[:len(magic)], magic, (data["kind"], out))

    def test_bad_data_exit_2(self):
        r, body = self.run_script({"format": "mutwo-plot/1", "kind": "pie"},
                                  "p.png")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown plot kind", r.stderr)
        self.assertIsNone(body)
        r, _ = self.run_script(batch_data(), "p.gif")
        self.assertEqual(r.returncode, 2)


class SnapshotTest(unittest.TestCase):
    def check_follows_curve(self, data, which, series_index):
        snap = mp.snapshot(data, which)
        s = data["series"][series_index]
        start, points = mp.replay(snap)
        self.assertEqual(start, data["fixed_bytes"])
        # After each position's last event the allocated bytes are the
        # series' after_bytes; the high-water mark is its peak.
        after_position = {}
        for i, (t, now, position) in enumerate(points):
            if i + 1 == len(points) or points[i + 1][2] > position:
                after_position[position] = (t, now)
        for pos, end, after in zip(s["position"], s["end_ms"], s["after_bytes"]):
            self.assertEqual(after_position[pos],
                             (int(round(end * 1000)), after), (which, pos))
        self.assertEqual(max(now for _, now, _ in points), max(s["peak_bytes"]))
        # Freed ranges are reused: the pool is about the peak, not the sum
        # of every allocation; no two live blocks overlap.
        pool = sum(seg["total_size"] for seg in snap["segments"])
        self.assertLessEqual(pool, max(s["peak_bytes"]) + 16 * 512)
        live = {}
        for e in snap["device_traces"][0]:
            if e["action"] == "alloc":
                for a, size in live.items():
                    self.assertTrue(e["addr"] + e["size"] <= a or
                                    a + size <= e["addr"], "overlap")
                live[e["addr"]] = e["size"]
            elif e["action"] == "free_completed":
                del live[e["addr"]]
        return snap

    def test_planned_baseline_and_measured_timelines(self):
        data = timeline_data()
        snap = self.check_follows_curve(data, "planned", 1)
        self.check_follows_curve(data, "baseline", 0)
        self.check_follows_curve(data, "measured", 2)
        names = {e["frames"][0]["name"] for e in snap["device_traces"][0]}
        self.assertIn("relu (aten::relu) [recompute]", names)
        # The recomputed activation is allocated twice in the planned step,
        # once in the baseline.
        relu = lambda s: [e for e in s["device_traces"][0]
                          if e["action"] == "alloc" and
                          e["frames"][0]["name"].startswith("relu")]
        self.assertEqual(len(relu(snap)), 2)
        self.assertEqual(len(relu(mp.snapshot(data, "baseline"))), 1)

    def test_pickle_reads_with_torch_memory_viz(self):
        data = timeline_data()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.json")
            with open(path, "w") as f:
                json.dump(data, f)
            out = os.path.join(d, "step.pickle")
            r = subprocess.run([sys.executable, SCRIPT, path, out,
                                "--timeline=planned"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, "rb") as f:
                snap = pickle.load(f)
        self.assertEqual(set(snap), {"segments", "device_traces"})
        try:
            from torch.cuda import _memory_viz as mv
        except ImportError:
            self.skipTest("torch not installed: torch.cuda._memory_viz not "
                          "checked")
        # torch 1.13's functions read a list of segments; newer ones the
        # whole snapshot (and its device_traces).
        segments = snap["segments"] if not hasattr(mv, "trace") else snap
        stats = mv.stats(segments if isinstance(segments, list)
                         else segments["segments"]) if hasattr(mv, "stats") else None
        if stats is not None:
            self.assertEqual(int(str(stats["total_size"].value)),
                             sum(s["total_size"] for s in snap["segments"]))
        lines = mv.segments(segments, format_flamegraph=lambda text: text)
        self.assertIn("active_allocated", lines)
        if hasattr(mv, "trace"):
            mv.trace(snap)

    def test_html_beside_the_pickle_opens_offline(self):
        # torch 1.13's viewer fails on these pickles and the web viewer
        # needs the network: the page beside the pickle carries the data
        # itself (the peak, the blocks by name, recomputed ones marked) and
        # loads nothing.
        data = timeline_data()
        snap = mp.snapshot(data, "planned")
        _, points = mp.replay(snap)
        peak = max(now for _, now, _ in points)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.json")
            with open(path, "w") as f:
                json.dump(data, f)
            out = os.path.join(d, "timeline_b32.pickle")
            r = subprocess.run([sys.executable, SCRIPT, path, out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "timeline_b32.html")) as f:
                page = f.read()
            # An existing pickle converts the same way.
            again = os.path.join(d, "again.html")
            r = subprocess.run([sys.executable, SCRIPT, out, again],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(again) as f:
                converted = f.read()
            bad = os.path.join(d, "bad.pickle")
            with open(bad, "wb") as f:
                pickle.dump({"segments": []}, f)
            r = subprocess.run([sys.executable, SCRIPT, bad, again],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("device_traces", r.stderr)
        for html in (page, converted):
            self.assertIn("<b>%s</b>" % mp.format_bytes(peak), html)
            self.assertIn("relu (aten::relu) [recompute]", html)
            self.assertIn('class="recompute"', html)
            self.assertIn("<svg", html)
            self.assertNotIn("<script", html)
            self.assertNotIn("https://", html)
            self.assertNotIn("src=", html)

    def test_needs_a_timeline(self):
        with self.assertRaises(mp.PlotDataError):
            mp.snapshot(batch_data())
        with self.assertRaises(mp.PlotDataError):
            mp.snapshot(timeline_data(), "sideways")


if __name__ == "__main__":
    unittest.main(verbosity=2)
