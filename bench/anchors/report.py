#!/usr/bin/env python3
"""mutwo beside the anchors, from one run on one card: the anchors
(anchors.py: eager, torch.utils.checkpoint per block and sqrt(n),
torch.compile at several activation_memory_budget values) beside mutwo's
executed schedules (bench/gpu/run_benchmark.py: `mutwo-worker execute` at
N budgets plus its sqrt_n / per_block policies), and mutwo's schedules under
torch.compile (anchors.py's mutwo_compile points) beside
compile's own activation_memory_budget points: the dominance line says
whether at least one mutwo_compile point is at or under both the peak and
the step time of a compile:B point.

    report.py --anchors anchors.jsonl --mutwo DIR[,DIR] --out DIR

Writes DIR/report.md (tables, bars, dominance), DIR/summary.json and
DIR/<model>.png (peak vs step time, every system's points; matplotlib via
client/plot/mutwo_plot.py). GB = 1e9 bytes. Step times are relative to the
eager step without checkpointing measured in the same run.
"""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "plot"))

import mutwo_plot  # noqa: E402  (the project's one renderer)

ANCHOR_COLORS = {"eager": "#4d4d4d", "ckpt_block": "#2ca02c",
                 "ckpt_sqrt": "#1f77b4", "compile": "#9467bd",
                 "mutwo_compile": "#d62728"}
# The goals at the benchmark batch, what a user would need to prefer mutwo:
# (model, GB, max overhead vs eager).
BARS = [("resnet152", 4.0, 0.20), ("resnet152", 8.0, 0.03),
        ("transformer", 3.3, 0.10)]  # issue 27's bars


def gb(n):
    return n / 1e9


def load_anchors(path):
    points = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                p = json.loads(line)
                points.setdefault(p["model"], []).append(p)
    return points


def load_mutwo(directories):
    """run_benchmark.py's results per model from one or more directories
    (comma-separated): the points of runs with different losses are
    merged, each point labelled with its run's loss."""
    runs = {}
    for directory in directories.split(","):
        for path in sorted(glob.glob(os.path.join(directory, "*_b*.json"))):
            if path.endswith("_profile.json") or ".schedule" in path:
                continue
            with open(path) as f:
                run = json.load(f)
            if "points" not in run:
                continue
            loss = run.get("loss", "")
            for p in run["points"]:
                p["loss"] = loss
            if run["model"] in runs:
                merged = runs[run["model"]]
                merged["points"] += run["points"]
                merged["losses"].append(loss)
            else:
                run["losses"] = [loss]
                runs[run["model"]] = run
    return runs


def loss_label(loss):
    """'' for torch's cross_entropy (the anchors' loss), else ' chunked'
    and the like (the loss kind without its target)."""
    kind = (loss or "").split(":")[0].split("@")[0]
    if kind in ("", "cross_entropy"):
        return ""
    return " " + kind.replace("_cross_entropy", "")


def mutwo_points(run):
    out = []
    for p in run["points"]:
        if "measured_peak_bytes" not in p:
            continue
        suffix = loss_label(p.get("loss"))
        label = ("mutwo%s %.2f GB" % (suffix, gb(p["budget_bytes"]))
                 if p["policy"] == "mutwo" else p["policy"] + suffix)
        out.append({"system": label, "policy": p["policy"],
                    "peak_bytes": p["measured_peak_bytes"],
                    "step_ms": p["measured_iteration_ms"],
                    "predicted_ms": p["predicted_iteration_ms"],
                    "predicted_peak_bytes": p["predicted_peak_bytes"],
                    "budget_bytes": p["budget_bytes"],
                    "within_budget": p.get("within_budget"),
                    "gradients_match": p.get("gradients_match")})
    return out


def is_mutwo_compile(point):
    return point.get("method") == "mutwo_compile" or \
        point["system"].startswith("mutwo_compile")


def compile_dominance(ok):
    """mutwo under torch.compile against compile's activation_memory_budget
    points: for each compile:B point, the fastest mutwo_compile point at or
    under both its peak and its step time. The bar: at least one
    compile:B point is matched."""
    ours = [a for a in ok if is_mutwo_compile(a)]
    theirs = [a for a in ok if a["system"].startswith("compile:")]
    lines, pairs = [], []
    if not ours:
        return lines, None
    for a in sorted(theirs, key=lambda a: -a["peak_bytes"]):
        match = [m for m in ours if m["peak_bytes"] <= a["peak_bytes"] and
                 m["step_ms"] <= a["step_ms"]]
        best = min(match, key=lambda m: m["step_ms"]) if match else None
        pairs.append({"compile": a["system"], "matched": best is not None,
                      "by": best["system"] if best else None})
        lines.append(f"- {a['system']} ({gb(a['peak_bytes']):.2f} GB, "
                     f"{a['step_ms']:.1f} ms): " + (
                         f"matched by {best['system']} "
                         f"({gb(best['peak_bytes']):.2f} GB, "
                         f"{best['step_ms']:.1f} ms)" if best else
                         "no mutwo_compile point at or under both"))
    met = any(p["matched"] for p in pairs)
    lines.insert(0, "- mutwo under torch.compile vs compile's "
                 "activation_memory_budget: " +
                 ("met" if met else "NOT met") + " (at least one compile:B "
                 "point with a mutwo_compile point at or under its peak and "
                 "step time)")
    for m in ours:
        notes = []
        if m.get("swaps_ignored"):
            notes.append(f"{m['swaps_ignored']} SWAP decisions kept on the "
                         f"device ({gb(m.get('swapped_bytes', 0)):.2f} GB)")
        if "budget_bytes" in m:
            notes.append(f"planned budget {gb(m['budget_bytes']):.2f} GB, "
                         f"{'within' if m['peak_bytes'] <= m['budget_bytes'] else 'OVER'}")
        unmatched = [l for l in m.get("policy_report", "").splitlines()
                     if "not matched" in l]
        if unmatched:
            notes.append(f"{len(unmatched)} decisions no op matched")
        if "max_grad_diff_vs_eager_rel" in m:
            notes.append("gradients vs eager: max |diff| %.1e of the "
                         "largest" % m["max_grad_diff_vs_eager_rel"])
        if notes:
            lines.append(f"  - {m['system']}: " + "; ".join(notes))
    return lines, {"met": met, "pairs": pairs}


def model_report(model, anchors, run):
    # mutwo_compile rows say their loss as the worker's rows do.
    ok = [dict(a, system=a["system"] + loss_label(a.get("loss")))
          for a in anchors if "peak_bytes" in a]
    eager = next((a for a in ok if a["system"] == "eager"), None)
    lines = [f"### {model}, batch {ok[0]['batch'] if ok else '?'}", ""]
    other = [l for l in (run or {}).get("losses", []) if loss_label(l)]
    if other:
        # The anchors run torch's F.cross_entropy; say when mutwo's step
        # computes the loss another way (docs/loss.md).
        lines += ["mutwo rows named `" + loss_label(other[0]).strip() +
                  f"`: mutwo's step with the loss `{other[0]}` (docs/loss.md;"
                  " the anchors: F.cross_entropy)", ""]
    if eager is None:
        return lines + ["no eager step measured", ""], {}
    ref = eager["step_ms"]
    mpts = mutwo_points(run) if run else []
    # mutwo's answers: its planned schedules (policy mutwo; the highest
    # budget is the step without a schedule).
    answers = [m for m in mpts if m["policy"] == "mutwo"]
    lines += ["| system | peak GB | step ms | vs eager | predicted ms | "
              "pred/meas |", "| --- | --- | --- | --- | --- | --- |"]
    for a in sorted(ok, key=lambda a: -a["peak_bytes"]):
        lines.append(f"| {a['system']} | {gb(a['peak_bytes']):.2f} | "
                     f"{a['step_ms']:.1f} | {a['step_ms'] / ref - 1:+.0%} | | |")
    for m in sorted(mpts, key=lambda m: -m["peak_bytes"]):
        lines.append(f"| {m['system']} | {gb(m['peak_bytes']):.2f} | "
                     f"{m['step_ms']:.1f} | {m['step_ms'] / ref - 1:+.0%} | "
                     f"{m['predicted_ms']:.1f} | "
                     f"{m['predicted_ms'] / m['step_ms']:.2f} |")
    for a in anchors:
        if "error" in a:
            lines.append(f"| {a['system']} | failed: "
                         f"{a['error'].splitlines()[-1][:120]} | | | | |")
    lines.append("")
    # Dominance: every anchor point has a mutwo answer with <= peak and
    # <= step time, from the worker's executor or mutwo's plan under
    # torch.compile (issue 27); the mutwo_compile points are also compared
    # with compile's own below.
    answers = answers + [a for a in ok if is_mutwo_compile(a)]
    dom = []
    for a in [a for a in ok if not is_mutwo_compile(a)]:
        match = [m for m in answers if m["peak_bytes"] <= a["peak_bytes"] and
                 m["step_ms"] <= a["step_ms"]]
        best = min(match, key=lambda m: m["step_ms"]) if match else None
        dom.append({"anchor": a["system"], "matched": best is not None,
                    "by": best["system"] if best else None})
        if best:
            lines.append(f"- {a['system']} ({gb(a['peak_bytes']):.2f} GB, "
                         f"{a['step_ms']:.1f} ms): matched by {best['system']} "
                         f"({gb(best['peak_bytes']):.2f} GB, "
                         f"{best['step_ms']:.1f} ms)")
        else:
            under = [m for m in answers if m["peak_bytes"] <= a["peak_bytes"]]
            near = min(under, key=lambda m: m["step_ms"]) if under else None
            lines.append(f"- {a['system']} ({gb(a['peak_bytes']):.2f} GB, "
                         f"{a['step_ms']:.1f} ms): NOT matched; fastest mutwo "
                         "point at or under its peak: " +
                         (f"{near['system']} ({gb(near['peak_bytes']):.2f} GB,"
                          f" {near['step_ms']:.1f} ms, "
                          f"{near['step_ms'] / a['step_ms'] - 1:+.0%})"
                          if near else "none"))
    bars = []
    for bmodel, limit, over in BARS:
        if bmodel != model:
            continue
        fit = [m for m in answers if gb(m["peak_bytes"]) <= limit]
        best = min(fit, key=lambda m: m["step_ms"]) if fit else None
        met = best is not None and best["step_ms"] <= ref * (1 + over)
        bars.append({"bar": f"<= {limit} GB at <= {over:+.0%}", "met": met,
                     "best": best and {"system": best["system"],
                                       "peak_gb": gb(best["peak_bytes"]),
                                       "overhead": best["step_ms"] / ref - 1}})
        lines.append(f"- bar <= {limit} GB at <= {over:+.0%}: " +
                     ("met" if met else "missed") + (
                         f" (best {best['system']}: "
                         f"{gb(best['peak_bytes']):.2f} GB at "
                         f"{best['step_ms'] / ref - 1:+.0%})" if best else
                         " (no mutwo point at or under it)"))
    cdom_lines, cdom = compile_dominance(ok)
    lines += cdom_lines
    errs = [abs(m["predicted_ms"] / m["step_ms"] - 1) for m in mpts]
    within = sum(e <= 0.10 for e in errs)
    lines += [f"- predicted step time within ±10% of measured: {within} of "
              f"{len(errs)} points", ""]
    summary = {"eager_step_ms": ref, "eager_peak_bytes": eager["peak_bytes"],
               "dominance": dom, "compile_dominance": cdom, "bars": bars,
               "prediction_within_10pct":
               [within, len(errs)], "anchors": ok, "mutwo": mpts}
    return lines, summary


def plot(model, summary, path):
    ref = summary["eager_step_ms"]
    series = []
    groups = {}
    for a in summary["anchors"]:
        kind = a["system"].split(":")[0]
        groups.setdefault(kind, []).append(a)
    names = {"eager": "eager, no checkpointing",
             "ckpt_block": "eager, checkpoint per block",
             "ckpt_sqrt": "eager, checkpoint sqrt(n)",
             "compile": "torch.compile, activation_memory_budget",
             "mutwo_compile": "torch.compile + mutwo schedule (SAC)"}
    for kind, pts in groups.items():
        series.append({"name": names.get(kind, kind), "source": "measured",
                       "color": ANCHOR_COLORS.get(kind, "#8c564b"),
                       "marker": {"eager": "s", "compile": "v",
                                  "mutwo_compile": "^"}.get(kind, "D"),
                       "line": kind in ("compile", "mutwo_compile"),
                       "points": [{"peak_bytes": p["peak_bytes"],
                                   "overhead": p["step_ms"] / ref - 1}
                                  for p in pts]})
    m = [p for p in summary["mutwo"] if p["policy"] == "mutwo"]
    series.append({"name": "mutwo (measured)", "policy": "mutwo",
                   "source": "measured", "line": True,
                   "points": [{"peak_bytes": p["peak_bytes"],
                               "overhead": p["step_ms"] / ref - 1} for p in m]})
    series.append({"name": "mutwo (predicted)", "policy": "mutwo",
                   "source": "predicted", "line": True,
                   "points": [{"peak_bytes": p["predicted_peak_bytes"],
                               "overhead": p["predicted_ms"] / ref - 1}
                              for p in m]})
    data = {"format": mutwo_plot.FORMAT, "kind": "pareto",
            "title": f"{model}: peak memory vs step time",
            "x_label": "step time vs eager PyTorch without checkpointing",
            "series": series}
    mutwo_plot.save(mutwo_plot.figure(data), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchors", required=True)
    ap.add_argument("--mutwo", required=True,
                    help="run_benchmark.py's output directory; several, "
                    "comma-separated, are merged (one per loss)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no_plots", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    anchors = load_anchors(args.anchors)
    runs = load_mutwo(args.mutwo)
    device = next((a.get("device") for pts in anchors.values() for a in pts
                   if a.get("device")), "?")
    lines = [f"Card: {device}. GB = 1e9 bytes; 'vs eager' is the step time "
             "against eager PyTorch without checkpointing in the same run.",
             ""]
    summaries = {}
    for model in anchors:
        text, summary = model_report(model, anchors[model], runs.get(model))
        lines += text
        if summary:
            summaries[model] = summary
            if not args.no_plots:
                plot(model, summary, os.path.join(args.out, model + ".png"))
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"device": device, "models": summaries}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
