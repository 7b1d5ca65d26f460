#!/usr/bin/env python3
"""Tables (Markdown, stdout) and SVG plots from a GPU benchmark run
(run_benchmark.py's JSON files), for docs/benchmarks.md:

    report.py RESULTS_DIR SVG_DIR

- SVG_DIR/<model>_b<batch>_tradeoff.svg: measured peak vs measured time
  overhead (against the baseline step timed in the same process), one
  series per policy, mutwo's predictions as hollow marks;
- SVG_DIR/<model>_peak_vs_batch.svg: measured peak vs batch size for the
  baseline, sqrt(n), per-block and mutwo's lowest feasible budget.

Only the standard library (no plotting package on the GPU machine).
"""
import glob
import json
import os
import sys

GIB = 2 ** 30
COLORS = {"none": "#444444", "sqrt_n": "#1f77b4", "per_block": "#2ca02c",
          "mutwo": "#d62728", "mutwo predicted": "#d62728"}


def svg_chart(path, title, xlabel, ylabel, series, xfmt="{:g}"):
    """series: list of (name, [(x, y)], hollow, line)."""
    w, h, ml, mr, mt, mb = 640, 400, 70, 170, 40, 50
    pts = [p for _, s, _, _ in series for p in s]
    if not pts:
        return
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = 0.0, max(p[1] for p in pts) * 1.08
    if x1 == x0:
        x1 = x0 + 1
    x0, x1 = x0 - 0.04 * (x1 - x0), x1 + 0.04 * (x1 - x0)

    def X(v):
        return ml + (v - x0) / (x1 - x0) * (w - ml - mr)

    def Y(v):
        return h - mb - (v - y0) / (y1 - y0) * (h - mt - mb)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2 - mr / 2}" y="22" text-anchor="middle" '
           f'font-size="14">{title}</text>',
           f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
           f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>',
           f'<text x="{(ml + w - mr) / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>',
           f'<text x="16" y="{(mt + h - mb) / 2}" text-anchor="middle" '
           f'transform="rotate(-90 16 {(mt + h - mb) / 2})">{ylabel}</text>']
    for i in range(6):
        xv = x0 + (x1 - x0) * i / 5
        yv = y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{X(xv)}" y="{h - mb + 16}" text-anchor="middle">'
                   f'{xfmt.format(xv)}</text>')
        out.append(f'<text x="{ml - 6}" y="{Y(yv) + 4}" text-anchor="end">'
                   f'{yv:.1f}</text>')
        out.append(f'<line x1="{ml}" y1="{Y(yv)}" x2="{w - mr}" y2="{Y(yv)}" '
                   f'stroke="#eeeeee"/>')
    for k, (name, s, hollow, line) in enumerate(series):
        c = COLORS.get(name, "#9467bd")
        s = sorted(s)
        if line and len(s) > 1:
            d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}"/>')
        for x, y in s:
            fill = "none" if hollow else c
            out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" '
                       f'fill="{fill}" stroke="{c}"/>')
        ly = mt + 10 + 18 * k
        out.append(f'<circle cx="{w - mr + 16}" cy="{ly}" r="4" '
                   f'fill="{"none" if hollow else c}" stroke="{c}"/>')
        out.append(f'<text x="{w - mr + 26}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def load(results):
    runs = []
    for path in sorted(glob.glob(os.path.join(results, "*_b*.json"))):
        if path.endswith("_profile.json") or ".schedule." in path:
            continue
        with open(path) as f:
            r = json.load(f)
        if "points" in r:
            runs.append(r)
    runs.sort(key=lambda r: (r["model"], r["batch"]))
    return runs


def gb(b):
    return f"{b / 1e9:.2f} GB"


def table(run):
    print(f"\n#### {run['model']}, batch {run['batch']}\n")
    print(f"Profile: {run['nodes']} nodes, {run['activations']} activations; "
          f"module step {run['module_iteration_ms']:.1f} ms, peak "
          f"{gb(run['module_peak_bytes'])}; profiled in {run['profile_s']:.1f} s; "
          f"planner floor {gb(run.get('floor_bytes', 0))}.\n")
    print("| policy | budget | predicted peak | measured peak | peak error | "
          "predicted ms | measured ms | time error | baseline ms | overhead | "
          "recomputed / swapped | within budget | gradients |")
    print("| --- " * 13 + "|")
    for p in run["points"]:
        if "measured_peak_bytes" not in p:
            why = "infeasible" if not p["feasible"] else p.get("execute_error", "not run")[:60]
            print(f"| {p['policy']} | {gb(p['budget_bytes']) if p['policy'] == 'mutwo' else '-'} "
                  f"| {gb(p['predicted_peak_bytes'])} | {why} | | | | | | | | | |")
            continue
        pe = p["measured_peak_bytes"] / p["predicted_peak_bytes"] - 1
        te = p["measured_iteration_ms"] / p["predicted_iteration_ms"] - 1
        ov = p["measured_iteration_ms"] / p["baseline_iteration_ms"] - 1
        within = (p["measured_peak_bytes"] <= p["budget_bytes"]
                  if p["policy"] == "mutwo" else "-")
        print(f"| {p['policy']} | {gb(p['budget_bytes']) if p['policy'] == 'mutwo' else '-'} "
              f"| {gb(p['predicted_peak_bytes'])} | {gb(p['measured_peak_bytes'])} "
              f"| {pe:+.1%} | {p['predicted_iteration_ms']:.1f} | "
              f"{p['measured_iteration_ms']:.1f} | {te:+.1%} | "
              f"{p['baseline_iteration_ms']:.1f} | {ov:+.1%} | "
              f"{p['recomputed']} / {p['swapped']} | {within} | "
              f"{'match' if p.get('gradients_match') else 'DIFFER'} |")


def plots(runs, svg_dir):
    os.makedirs(svg_dir, exist_ok=True)
    by_model = {}
    for run in runs:
        by_model.setdefault(run["model"], []).append(run)
        series = {}
        predicted = []
        for p in run["points"]:
            if "measured_peak_bytes" not in p:
                continue
            ov = 100 * (p["measured_iteration_ms"] / p["baseline_iteration_ms"] - 1)
            series.setdefault(p["policy"], []).append(
                (ov, p["measured_peak_bytes"] / GIB))
            if p["policy"] == "mutwo":
                pov = 100 * (p["predicted_iteration_ms"] /
                             run["points"][0]["predicted_iteration_ms"] - 1)
                predicted.append((pov, p["predicted_peak_bytes"] / GIB))
        s = [(k, v, False, k == "mutwo") for k, v in series.items()]
        if predicted:
            s.append(("mutwo predicted", predicted, True, False))
        svg_chart(os.path.join(svg_dir, f"{run['model']}_b{run['batch']}_tradeoff.svg"),
                  f"{run['model']}, batch {run['batch']}: peak vs time",
                  "time overhead vs baseline (%)", "peak (GiB)", s)
    for model, rs in by_model.items():
        series = {}
        for run in rs:
            best = {}
            for p in run["points"]:
                if "measured_peak_bytes" not in p:
                    continue
                k = p["policy"]
                v = p["measured_peak_bytes"] / GIB
                if k == "mutwo":
                    k = "mutwo (lowest budget)"
                    v = min(v, best.get(k, v))
                best[k] = v
            for k, v in best.items():
                series.setdefault(k, []).append((run["batch"], v))
        svg_chart(os.path.join(svg_dir, f"{model}_peak_vs_batch.svg"),
                  f"{model}: measured peak vs batch size", "batch size",
                  "peak (GiB)", [(k, v, False, True) for k, v in series.items()])


def main():
    results, svg_dir = sys.argv[1], sys.argv[2]
    runs = load(results)
    for run in runs:
        table(run)
    plots(runs, svg_dir)
    searches = {}
    for path in sorted(glob.glob(os.path.join(results, "*_max_batch.json"))):
        with open(path) as f:
            searches[os.path.basename(path)[:-len("_max_batch.json")]] = json.load(f)
    if searches:
        for model, m in searches.items():
            p = m["prediction"]
            print(f"\nmax batch {model}: predicted "
                  f"{p['max_batch_without_checkpointing']} without / "
                  f"{p['max_batch_with_schedule']} with a schedule; measured "
                  f"{m.get('true_without')} / {m.get('true_with_schedule')}")


if __name__ == "__main__":
    main()
