#!/usr/bin/env python3
"""Where a scheduled step's time goes, against the eager step, on one card.

For one anchor model (bench/gpu/make_models.py) and batch: profile once,
plan mutwo schedules at budget positions from the floor (0) to the baseline
peak (1), and execute each schedule with every build given (--bins
LABEL=DIR,...), alternating builds per schedule, so two builds of mutwo are
compared on the same card in the same run. Each execution reports its own
unscheduled step (mutwo's interpreter, no hooks) beside the scheduled one;
the profile reports the plain TorchScript module's step; the eager step
comes from bench/anchors/anchors.py in a child process. One JSON line per
measurement on stdout:

  {"model", "batch", "system": "eager" | "torchscript" | LABEL,
   "position", "budget_bytes", "decisions", "unscheduled_ms",
   "scheduled_ms", "scheduled_peak_bytes", "predicted_ms", ...}

Usage (GPU machine):
  python3 bench/executor/step_overhead.py --bins new=/tmp/b1/bin,old=/tmp/b0/bin \\
      --model resnet152 --models_dir /tmp/models --out /tmp/so
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpu"))
from make_models import SPECS  # noqa: E402
from run_benchmark import common_args, run  # noqa: E402


def emit(record):
    print(json.dumps(record), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", required=True,
                    help="LABEL=DIR,...: builds to compare (DIR/mutwo-worker)")
    ap.add_argument("--model", required=True, choices=sorted(SPECS))
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--models_dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--positions", default="1,0.75,0.5,0.25,0")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--eager", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bins = [item.split("=", 1) for item in args.bins.split(",")]
    spec = SPECS[args.model]
    batch = args.batch or spec["batch"]
    model = os.path.join(args.models_dir, args.model + ".pt")
    common = common_args(spec, batch, args.device, args.optimizer)
    base = {"model": args.model, "batch": batch}

    if args.eager:
        rc, out, err, _ = run([sys.executable,
                            os.path.join(HERE, "..", "anchors", "anchors.py"),
                            "--child", "--model", args.model, "--system",
                            "eager", "--device", args.device, "--iterations",
                            str(args.iterations), "--batch", str(batch)])
        if rc == 0:
            e = json.loads(out.strip().splitlines()[-1])
            emit({**base, "system": "eager", "step_ms": e["step_ms"],
                  "peak_bytes": e["peak_bytes"], "device": e["device"]})
        else:
            emit({**base, "system": "eager", "error": err.strip()[-400:]})

    worker0 = os.path.join(bins[0][1], "mutwo-worker")
    cli = os.path.join(bins[0][1], "mutwo")
    profile_path = os.path.join(args.out, f"{args.model}_b{batch}_profile.json")
    rc, out, err, _ = run([worker0, "profile", model] + common +
                       ["--output", "json"])
    if rc != 0:
        raise SystemExit(f"profile failed: {err.strip()[-400:]}")
    with open(profile_path, "w") as f:
        f.write(out)
    profile = json.loads(out)
    emit({**base, "system": "torchscript",
          "step_ms": profile["measured"]["module_iteration_ms"],
          "peak_bytes": int(profile["measured"]["module_peak_bytes"]),
          "profiled_step_ms": profile["measured"]["iteration_ms"],
          "nodes": len(profile["nodes"])})
    rc, out, err, _ = run([cli, "plan", profile_path, "--budget", "1B",
                        "--output", "json"])
    floor = int(json.loads(out)["floor_bytes"])
    baseline = int(json.loads(out)["baseline_peak_bytes"])
    for position in [float(p) for p in args.positions.split(",")]:
        budget = int((floor + (baseline - floor) * position) * 1.0005) + 1
        sched = os.path.join(args.out, f"{args.model}_b{batch}_{budget}.json")
        rc, out, err, _ = run([cli, "plan", profile_path, "--budget",
                            f"{budget}B", "--output", "json"])
        if rc != 0:
            emit({**base, "position": position, "error": err.strip()[-300:]})
            continue
        with open(sched, "w") as f:
            f.write(out)
        planned = json.loads(out)
        for label, directory in bins:
            t0 = time.time()
            rc, out, err, _ = run(
                [os.path.join(directory, "mutwo-worker"), "execute", model,
                 "--schedule", sched] + common +
                ["--iterations", str(args.iterations), "--output", "json"])
            record = {**base, "system": label, "position": position,
                      "budget_bytes": budget,
                      "decisions": planned.get("recomputed", 0) +
                      planned.get("swapped", 0),
                      "predicted_ms": planned["predicted_iteration_ms"],
                      "predicted_peak_bytes":
                      int(planned["predicted_peak_bytes"]),
                      "execute_s": round(time.time() - t0, 1)}
            try:
                v = json.loads(out)
                record.update({
                    "unscheduled_ms": v["baseline"]["iteration_ms"],
                    "unscheduled_peak_bytes": int(v["baseline"]["peak_bytes"]),
                    "scheduled_ms": v["scheduled"]["iteration_ms"],
                    "scheduled_peak_bytes": int(v["scheduled"]["peak_bytes"]),
                    "gradients_match": v["gradients_match"],
                    "within_budget": v["within_budget"]})
            except (ValueError, KeyError):
                record["error"] = err.strip()[-400:]
            emit(record)


if __name__ == "__main__":
    main()
