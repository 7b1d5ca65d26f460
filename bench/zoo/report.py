#!/usr/bin/env python3
"""Writes docs/zoo.md from one or more zoo_results.json files (run_zoo.py).

    report.py RESULTS.json [RESULTS.json ...] [-o docs/zoo.md]

One section per results file (CPU tier, GPU tier, ...): device, the command
that reproduces it, date, commit; one row per model; a totals line against
the bars.
"""
import argparse
import json
import os
import sys

PRED_TOLERANCE = 0.05
PRED_SHARE = 0.95


def mb(n):
    return f"{n / 1e6:.1f}M" if n is not None else ""


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def point_reason(p):
    if p.get("stage_failed"):
        return f"{p['stage_failed']} at {p['fraction']:.0%}: {p.get('error', '')}"
    bad = []
    if not p.get("gradients_match"):
        bad.append(f"gradients differ at {p['fraction']:.0%} "
                   f"(max |diff| {p.get('max_abs_grad_diff')})")
    if not p.get("within_budget"):
        bad.append(f"over budget at {p['fraction']:.0%} "
                   f"(+{(p['measured_over_budget'] - 1) * 100:.1f}%)")
    return "; ".join(bad)


def name_cell(r):
    extra = []
    if r.get("image_size"):
        extra.append(f"{r['image_size']}px")
    if r.get("config"):
        extra.append(r["config"])
    if r.get("batch_reduced_from"):
        extra.append(f"batch {r.get('batch')}: {r['batch_reduced_from']} "
                     f"does not fit the card")
    return r["name"] + (f" ({', '.join(extra)})" if extra else "")


def floor_cell(r):
    """Floor / simulated baseline peak: 1.00 means no schedule can lower
    the peak (it lies outside the activations' lifetime, e.g. in the
    optimizer step), so the sweep has a single budget."""
    f, b = r.get("floor_bytes"), r.get("simulated_baseline_bytes")
    if not f or not b:
        return "-"
    return f"{f / b:.2f}"


def first_round_cell(ex):
    """Points within budget in the first round (before the closed loop
    re-planned any), and the most rounds a point took."""
    if not ex:
        return "-"
    first = sum(1 for p in ex
                if p.get("first_round", {}).get("within_budget",
                                                p.get("within_budget")))
    rounds = max(p.get("rounds", 1) for p in ex)
    return f"{first}/{len(ex)}" + (f", max {rounds} rounds" if rounds > 1 else "")


def model_row(r):
    if r.get("excluded"):
        return [r["name"], r.get("family", ""), mb(r.get("params")), "-", "-",
                "-", "-", "-", "-", "-", "-", "-", r["excluded"]]
    pts = r["points"]
    ex = [p for p in pts if p.get("executed")]
    failures = [f"{f['stage']}: {f.get('error')}" for f in r["failures"]]
    reasons = []
    for p in pts:
        why = point_reason(p)
        if why:
            reasons.append(why)
    # One line per distinct reason (execute errors repeat across budgets).
    seen = []
    for x in failures + reasons:
        if x not in seen:
            seen.append(x)
    worst_budget = max((p["measured_over_budget"] for p in ex
                        if p.get("measured_over_budget") is not None),
                       default=None)
    worst_pred = max((abs(p["predicted_over_measured"] - 1) for p in ex
                      if p.get("predicted_over_measured") is not None),
                     default=None)
    return [name_cell(r), r.get("family", ""), mb(r.get("params")),
            "yes" if r["scripted"] else "no",
            "yes" if r["profiled"] else ("no" if r["scripted"] else "-"),
            floor_cell(r),
            f"{len(ex)}/{len(pts)}" if r["profiled"] else "-",
            f"{sum(1 for p in ex if p['gradients_match'])}/{len(ex)}" if ex else "-",
            f"{sum(1 for p in ex if p['within_budget'])}/{len(ex)}" if ex else "-",
            first_round_cell(ex),
            f"{worst_budget:.3f}" if worst_budget is not None else "-",
            f"{worst_pred * 100:.1f}%" if worst_pred is not None else "-",
            ("; ".join(seen) or "")]


def section(res):
    tier = res.get("tier", "?").upper()
    s = res["summary"]
    out = [f"## {tier} tier: {res.get('device_name') or res.get('device')}", ""]
    out.append(f"- device: `{res.get('device')}` ({res.get('device_name')}), "
               f"LibTorch {res.get('libtorch')}; models scripted with torch "
               f"{res.get('torch_python')}, torchvision {res.get('torchvision')}")
    out.append(f"- date: {res.get('date')}, commit: `{res.get('commit')}`, "
               f"wall time {s.get('seconds')} s")
    out.append(f"- reproduce: `{res.get('command')}`")
    out.append(f"- budgets: fractions {', '.join(f'{f:g}' for f in res.get('fractions', []))}"
               f" of the way floor -> simulated baseline peak (identical byte "
               f"budgets are planned once); warm-up {res.get('warmup')}, "
               f"iterations {res.get('iterations')}; optimizer "
               f"{res.get('optimizer', 'adam')}; closed loop: at most "
               f"{res.get('rounds', 1)} rounds per point, a re-plan below the "
               f"budget by the overshoot + {res.get('replan_margin', 0.01):.0%}"
               f" of it (as mutwo-server does)")
    if res.get("size_rule"):
        out.append(f"- size rule: {res['size_rule']}")
    if res.get("jobs", 1) > 1:
        out.append(f"- {res['jobs']} models ran at once on the device (each "
                   f"point its own process: peaks are per process; step "
                   f"times were taken on a shared device)")
    if res.get("complete") is False:
        out.append("- **incomplete**: the run stopped before its last model; "
                   "the rows are the models it finished")
    out.append("")
    bars = s["bars"]
    ok = lambda b: "PASS" if b else "FAIL"
    out.append(
        f"**Totals:** {s['in_tier']} models in the tier "
        f"({s['excluded_by_size']} excluded by size), {s['scripted']} scripted, "
        f"{s['profiled']} profiled; points executed {s['executed']}/{s['points']} "
        f"({ok(bars['every_point_executed'])}), gradients equal "
        f"{s['gradients_match']}/{s['executed']} "
        f"({ok(bars['every_point_gradients_equal'])}), peak within budget "
        f"{s['within_budget']}/{s['executed']} "
        f"({ok(bars['every_point_within_budget'])}), predicted peak within "
        f"+-5% at {s['predicted_within_5pct']}/{s['executed']} = "
        f"{s['predicted_share']:.0%} (bar >= 95%: "
        f"{ok(bars['predicted_peak_within_5pct_at_95pct'])}); "
        f"all scripted and profiled: "
        f"{ok(bars['all_in_tier_scripted_and_profiled'])}. Suite "
        f"{'GREEN' if s['green'] else 'NOT green'}: "
        f"{len(s['failing_models'])} failing model(s).")
    out.append("")
    head = ["model", "family", "params", "scripted", "profiled",
            "floor/baseline", "points executed", "gradients equal", "peak <= budget",
            "first round <= budget", "worst measured/budget",
            "worst abs(pred/meas-1)", "failures"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    rows = [model_row(r) for r in res["models"]]
    # In-tier models first (in run order), excluded ones after.
    rows = ([x for x in rows if not x[-1].startswith("cpu tier: excluded")] +
            [x for x in rows if x[-1].startswith("cpu tier: excluded")])
    for row in rows:
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    out.append("")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--output", default="docs/zoo.md")
    args = ap.parse_args()
    sections = []
    for path in args.results:
        with open(path) as f:
            sections.append(json.load(f))
    order = {"cpu": 0, "gpu": 1}
    sections.sort(key=lambda r: order.get(r.get("tier"), 2))
    lines = [
        "# Model-zoo conformance suite",
        "",
        "Generated by `bench/zoo/report.py` from "
        + ", ".join(f"`{p}`" for p in args.results) + "; do not edit by hand.",
        "",
        "The suite runs every torchvision classification and "
        "segmentation model plus the families written in `bench/zoo/models.py` "
        "(GPT-style decoder, `nn.TransformerEncoder`, 2-layer LSTM LM, U-Net, "
        "top-1 mixture of experts), and on a GPU (the EXT tier, "
        "`bench/zoo/models_ext.py`) one timm model of every timm family "
        "(scripted, or traced where scripting fails) and Hugging Face "
        "`transformers` GPT-2, BERT, a Llama-style decoder and T5 (traced), "
        "through `mutwo-worker profile` -> "
        "`mutwo plan` at budgets from the floor to the baseline peak -> "
        "`mutwo-worker execute`, in train mode. A point measured over its "
        "budget is planned again below it by the overshoot plus 1% and "
        "executed again, at most 3 rounds, as mutwo-server's closed loop "
        "does; the bars judge the last round, *first round <= budget* shows "
        "the first.",
        "",
        "Bars, per point: the schedule executed; gradients equal the "
        "unmodified step's; measured peak <= budget. Per run: predicted peak "
        "within +-5% of measured at >= 95% of executed points. A model that "
        "is not scripted or not profiled fails the run.",
        "",
        "Run it: CPU tier `ctest -R zoo` in the build directory (or "
        "`bench/zoo/ctest_cpu.sh /usr/bin/python3 build/bin RESULTS_DIR`); "
        "GPU tier `bench/zoo/run_gpu.sh RESULTS_DIR` on a GPU node, or "
        "`bench/zoo/run_gpu_cards.sh run RUN OUT` one shard per card "
        "(`SUITE=ext TIMM=families` for the EXT tier); then "
        "`bench/zoo/report.py RESULTS_DIR/zoo_results.json ... -o docs/zoo.md`. "
        "See `bench/zoo/README.md`.",
        "",
        "Columns: *floor/baseline* is the planner's floor over the simulated "
        "baseline peak (1.00: the peak lies outside the activations' lifetime, "
        "e.g. in the Adam step, so the sweep collapses to one budget); *points "
        "executed* counts distinct budgets; *worst measured/budget* > 1 is an "
        "over-budget point; *worst abs(pred/meas-1)* is the worst predicted-peak "
        "error.",
        "",
    ]
    for res in sections:
        lines += section(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
