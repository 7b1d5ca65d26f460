#!/usr/bin/env python3
"""mutwo::ScheduledStep beside the worker, per point: peak, gradients, time.

For each model: `mutwo-worker profile`, `mutwo plan` at budgets placed
floor + f x (baseline - floor) for each --fractions f, then per schedule
  - `mutwo-worker execute` (the worker's scheduled step: peak, step time),
  - `scheduled_step_bench` (bench/apply/scheduled_step_bench.cc: the same
    schedule through mutwo::ScheduledStep in a LibTorch loop of its own,
    beside the unmodified loop: gradients, peak, step time).
Bars per point: gradients equal, ScheduledStep's peak <= the budget, and
(with --time_bar) its step time <= (1 + bar) x the worker's scheduled step.
Prints one JSON line per point and a summary line; exits 1 when a bar fails.

    scheduled_step_zoo.py --bin BUILD/bin --out DIR
        (--gpu_models resnet152,transformer --models_dir DIR   # bench/gpu/make_models.py
         | --fixtures transformer,cnn --fixtures_dir BUILD/test_models)
        [--device cuda:0] [--fractions 0.1,0.5] [--iterations 5]
        [--optimizer adam] [--time_bar 0.10]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(argv, timeout=1200):
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def gpu_models(names, models_dir):
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    from make_models import SPECS  # noqa: E402
    for name in names:
        spec = SPECS[name]
        yield (name, os.path.join(models_dir, name + ".pt"), spec["inputs"],
               spec["loss"], spec["batch"])


def fixtures(names, fixtures_dir, batch):
    """Lines of tests/testing/make_models.py's models.txt: NAME FLAGS."""
    flags = {}
    with open(os.path.join(fixtures_dir, "models.txt")) as f:
        for line in f:
            parts = shlex.split(line)
            if parts:
                flags[parts[0]] = parts[1:]
    for name in names:
        if name not in flags:
            raise SystemExit(f"--fixtures {name}: not in {fixtures_dir}/"
                             "models.txt")
        words, inputs, loss = flags[name], [], "mean"
        for i in range(0, len(words) - 1, 2):
            if words[i] == "--input":
                inputs.append(words[i + 1])
            elif words[i] == "--loss":
                loss = words[i + 1]
        yield (name, os.path.join(fixtures_dir, name + ".pt"), inputs, loss,
               batch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu_models", default="")
    ap.add_argument("--models_dir", default="")
    ap.add_argument("--fixtures", default="")
    ap.add_argument("--fixtures_dir", default="")
    ap.add_argument("--fixture_batch", type=int, default=8)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--fractions", default="0.1,0.5")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--time_bar", type=float, default=-1,
                    help="fail a point whose step is slower than (1 + bar) "
                    "x the worker's; < 0: report only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.gpu_models:
        models = list(gpu_models(args.gpu_models.split(","), args.models_dir))
    else:
        models = list(fixtures(args.fixtures.split(","), args.fixtures_dir,
                               args.fixture_batch))
    worker = os.path.join(args.bin, "mutwo-worker")
    cli = os.path.join(args.bin, "mutwo")
    bench = os.path.join(args.bin, "scheduled_step_bench")
    points, failures = [], 0
    for name, path, inputs, loss, batch in models:
        common = sum((["--input", i] for i in inputs), []) + [
            "--batch", str(batch), "--loss", loss, "--optimizer",
            args.optimizer, "--device", args.device]
        base = os.path.join(args.out, f"{name}_b{batch}")
        rc, out, err, _ = run([worker, "profile", path] + common +
                              ["--output", "json"])
        if rc != 0:
            print(json.dumps({"model": name, "error": "profile: " +
                              err.strip()[-400:]}), flush=True)
            failures += 1
            continue
        with open(base + "_profile.json", "w") as f:
            f.write(out)
        rc, out, err, _ = run([cli, "plan", base + "_profile.json",
                               "--budget", "floor", "--output", "json"])
        s = json.loads(out)
        floor, baseline = int(s["budget_bytes"]), int(s["baseline_peak_bytes"])
        for f in (float(x) for x in args.fractions.split(",")):
            budget = int(floor + f * (baseline - floor))
            sched = f"{base}_f{f}.schedule.json"
            rc, out, err, _ = run([cli, "plan", base + "_profile.json",
                                   "--budget", f"{budget}B", "--output",
                                   "json"])
            point = {"model": name, "batch": batch, "fraction": f,
                     "budget_bytes": budget}
            if rc != 0:
                point["error"] = "plan: " + (err.strip() or out)[-400:]
                print(json.dumps(point), flush=True)
                failures += 1
                continue
            with open(sched, "w") as fh:
                fh.write(out)
            plan = json.loads(out)
            point.update(recomputed=plan.get("recomputed", 0),
                         swapped=plan.get("swapped", 0),
                         predicted_peak_bytes=int(plan["predicted_peak_bytes"]))
            rc, out, err, _ = run([worker, "execute", path, "--schedule", sched]
                                  + common + ["--iterations",
                                              str(args.iterations),
                                              "--output", "json"])
            if rc in (0, 1) and out.strip().startswith("{"):
                v = json.loads(out)
                point["worker_peak_bytes"] = int(v["scheduled"]["peak_bytes"])
                point["worker_iteration_ms"] = v["scheduled"]["iteration_ms"]
            else:
                point["worker_error"] = err.strip()[-400:]
            rc, out, err, _ = run(
                [bench, path, sched] + [f"--input={i}" for i in inputs] +
                [f"--loss={loss}", f"--optimizer={args.optimizer}",
                 f"--device={args.device}",
                 f"--iterations={args.iterations}"])
            if out.strip().startswith("{"):
                b = json.loads(out)
                point.update(
                    step_peak_bytes=b["scheduled_peak_bytes"],
                    step_iteration_ms=b["scheduled_iteration_ms"],
                    loop_peak_bytes=b["baseline_peak_bytes"],
                    loop_iteration_ms=b["baseline_iteration_ms"],
                    gradients_equal=b["gradients_equal"],
                    max_abs_grad_diff=b["max_abs_grad_diff"],
                    within_budget=b["within_budget"], device=b["device"])
            else:
                point["error"] = "scheduled_step_bench: " + err.strip()[-400:]
            bars = []
            if "error" in point:
                bars.append("ran")
            else:
                if not point["gradients_equal"]:
                    bars.append("gradients")
                if not point["within_budget"]:
                    bars.append("budget")
                if "worker_iteration_ms" in point:
                    ratio = (point["step_iteration_ms"] /
                             point["worker_iteration_ms"])
                    point["time_ratio"] = round(ratio, 3)
                    if args.time_bar >= 0 and ratio > 1 + args.time_bar:
                        bars.append("time")
            point["failed_bars"] = bars
            failures += bool(bars)
            points.append(point)
            print(json.dumps(point), flush=True)
    with open(os.path.join(args.out, "scheduled_step.jsonl"), "w") as f:
        for p in points:
            f.write(json.dumps(p) + "\n")
    print(json.dumps({"summary": True, "points": len(points),
                      "failed": failures}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
