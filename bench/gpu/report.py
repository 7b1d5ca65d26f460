#!/usr/bin/env python3
"""Tables (Markdown, stdout) and SVG plots from a GPU benchmark run
(run_benchmark.py's JSON files), for docs/benchmarks.md. The plots are
drawn by mutwo's one renderer, client/plot/mutwo_plot.py (matplotlib):

    report.py RESULTS_DIR SVG_DIR

- SVG_DIR/<model>_b<batch>_tradeoff.svg: measured peak vs measured time
  overhead (against the baseline step timed in the same process), one
  series per policy, mutwo's predictions as hollow marks;
- SVG_DIR/<model>_peak_vs_batch.svg: measured peak vs batch size for the
  baseline, sqrt(n), per-block and mutwo's lowest feasible budget.

Without matplotlib (a GPU machine may lack it) the tables are printed and
the plots skipped: copy the results and run it where matplotlib is.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "client", "plot"))
import mutwo_plot  # noqa: E402  (the CLI's renderer: one look for every plot)


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


def tradeoff_data(run):
    """Measured peak vs measured time overhead (against the baseline step
    timed in the same process), one series per policy; mutwo's predictions
    as hollow marks."""
    series = {}
    predicted = []
    for p in run["points"]:
        if "measured_peak_bytes" not in p:
            continue
        series.setdefault(p["policy"], []).append({
            "peak_bytes": p["measured_peak_bytes"],
            "overhead": p["measured_iteration_ms"] / p["baseline_iteration_ms"] - 1})
        if p["policy"] == "mutwo":
            predicted.append({
                "peak_bytes": p["predicted_peak_bytes"],
                "overhead": p["predicted_iteration_ms"] /
                run["points"][0]["predicted_iteration_ms"] - 1})
    out = [{"name": "%s (measured)" % k, "policy": k, "source": "measured",
            "line": False, "marker": mutwo_plot.POLICY_MARKERS.get(k, "o"),
            "points": v} for k, v in series.items()]
    if predicted:
        out.append({"name": "mutwo (predicted)", "policy": "mutwo",
                    "source": "predicted", "line": False, "points": predicted})
    return {"format": mutwo_plot.FORMAT, "kind": "pareto",
            "title": "%s, batch %d: peak vs time" % (run["model"], run["batch"]),
            "series": out}


def peak_vs_batch_data(model, runs):
    """Measured peak vs batch size per policy (mutwo: its lowest budget)."""
    series = {}
    for run in runs:
        best = {}
        for p in run["points"]:
            if "measured_peak_bytes" not in p:
                continue
            k = p["policy"]
            v = p["measured_peak_bytes"]
            if k == "mutwo":
                v = min(v, best.get(k, v))
            best[k] = v
        for k, v in best.items():
            series.setdefault(k, []).append({"batch": run["batch"],
                                             "peak_bytes": v})
    names = {"mutwo": "mutwo (lowest budget)", "none": "baseline (none)"}
    return {"format": mutwo_plot.FORMAT, "kind": "batch",
            "title": "%s: measured peak vs batch size" % model,
            "series": [{"name": names.get(k, k), "policy": k,
                        "source": "measured", "points": v}
                       for k, v in series.items()]}


def plots(runs, svg_dir):
    try:
        mutwo_plot._pyplot()
    except ImportError:
        print("report.py: no matplotlib (Debian: python3-matplotlib); "
              "tables only, no plots", file=sys.stderr)
        return
    os.makedirs(svg_dir, exist_ok=True)
    by_model = {}
    for run in runs:
        by_model.setdefault(run["model"], []).append(run)
        mutwo_plot.save(
            mutwo_plot.figure(tradeoff_data(run)),
            os.path.join(svg_dir, f"{run['model']}_b{run['batch']}_tradeoff.svg"))
    for model, rs in by_model.items():
        mutwo_plot.save(mutwo_plot.figure(peak_vs_batch_data(model, rs)),
                        os.path.join(svg_dir, f"{model}_peak_vs_batch.svg"))


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
