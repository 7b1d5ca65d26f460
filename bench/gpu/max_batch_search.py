#!/usr/bin/env python3
"""The max batch size check: mutwo's prediction (`mutwo max-batch`
from the profiles at <= 3 batch sizes) against the largest batch that really
trains, found by measured search on the card:

- without a schedule: step_probe.py runs the plain training step (the
  TorchScript module, Adam, no checkpointing) at batch B in a fresh
  process, as a user would; B fits when it does not run out of memory;
- with a schedule: `mutwo plan PROFILES... --batch B --budget CAPACITY`
  (the profile fitted to B) executed by `mutwo-worker execute --baseline=false`
  (the unmodified step does not fit there); B fits when the scheduled step
  does not run out of memory, its measured peak is within the capacity, and
  its time is within the overhead cap of the plain step's per-sample time
  at the largest batch that fits without a schedule, scaled to B (the plain
  step cannot be timed at B).

The search brackets the prediction: it probes the prediction, then walks up
(or down) by `--step` of the prediction until the answer flips, then
bisects until the bracket is within `--resolution` of the largest fitting
batch.

    max_batch_search.py --bin BIN --model M.pt --kind transformer --args "..."
        --profiles P1 P2 P3
        --out OUT.json [--capacity_fraction 0.95] [--max_overhead 0.25]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time


ENV = dict(os.environ)


def run(cmd, timeout=600):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout, env=ENV)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return -1, "", "timeout", time.time() - t0


def with_batch(args, batch):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--batch":
            skip = True
            continue
        out.append(a)
    return out + ["--batch", str(batch)]


class Prober:
    def __init__(self, opts, per_sample_ms, log):
        self.o = opts
        self.per_sample_ms = per_sample_ms
        self.log = log
        self.worker = os.path.join(opts.bin, "mutwo-worker")
        self.cli = os.path.join(opts.bin, "mutwo")
        self.args = shlex.split(opts.args)
        self.tmp = tempfile.mkdtemp(prefix="maxbatch_")
        self.reference_batch = 0

    def without(self, batch):
        rc, out, err, dt = run([sys.executable, os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "step_probe.py"),
            self.o.model, self.o.kind, str(batch)])
        probe = {"batch": batch, "seconds": round(dt, 1)}
        if rc != 0:
            probe.update(fits=False, error=err.strip()[-300:])
        else:
            probe.update(json.loads(out))
            if probe["fits"]:
                # The per-sample time of the plain step at the largest batch
                # that fits: the reference for the scheduled step's overhead.
                if batch > self.reference_batch:
                    self.reference_batch = batch
                    self.per_sample_ms = probe["iteration_ms"] / batch
        self.log.append(dict(probe, schedule=False))
        print(f"  without schedule, batch {batch}: "
              f"{'fits' if probe['fits'] else 'does not fit'}",
              file=sys.stderr)
        return probe["fits"]

    def with_schedule(self, batch):
        sched = os.path.join(self.tmp, f"b{batch}.schedule.json")
        rc, out, err, t_plan = run([self.cli, "plan"] + self.o.profiles +
                                   ["--batch", str(batch), "--budget",
                                    self.o.capacity, "--output", "json"])
        probe = {"batch": batch, "plan_s": round(t_plan, 2)}
        if rc not in (0, 3):
            probe.update(fits=False, error=err.strip()[-300:])
            self.log.append(dict(probe, schedule=True))
            return False
        schedule = json.loads(out)
        probe.update(feasible=schedule["feasible"],
                     predicted_peak_bytes=int(schedule["predicted_peak_bytes"]),
                     budget_bytes=int(schedule["budget_bytes"]),
                     predicted_iteration_ms=schedule["predicted_iteration_ms"],
                     recomputed=schedule.get("recomputed", 0),
                     swapped=schedule.get("swapped", 0))
        if not schedule["feasible"]:
            probe["fits"] = False
            self.log.append(dict(probe, schedule=True))
            print(f"  with schedule, batch {batch}: infeasible",
                  file=sys.stderr)
            return False
        with open(sched, "w") as f:
            f.write(out)
        rc, out, err, dt = run([self.worker, "execute", self.o.model,
                                "--schedule", sched, "--baseline=false",
                                "--warmup", "1", "--iterations", "2",
                                "--output", "json"] +
                               with_batch(self.args, batch))
        probe["execute_s"] = round(dt, 1)
        if rc != 0:
            probe.update(fits=False, error=err.strip()[-300:])
        else:
            v = json.loads(out)
            peak = int(v["scheduled"]["peak_bytes"])
            ms = v["scheduled"]["iteration_ms"]
            reference_ms = self.per_sample_ms * batch
            overhead = ms / reference_ms - 1 if reference_ms > 0 else 0
            probe.update(oom=bool(v.get("oom")), measured_peak_bytes=peak,
                         measured_iteration_ms=ms,
                         reference_iteration_ms=reference_ms,
                         overhead=overhead)
            probe["fits"] = (not probe["oom"] and peak <= probe["budget_bytes"]
                             and overhead <= self.o.max_overhead)
        self.log.append(dict(probe, schedule=True))
        print(f"  with schedule, batch {batch}: "
              f"{'fits' if probe['fits'] else 'does not fit'} "
              f"({probe.get('overhead', 0):+.0%})", file=sys.stderr)
        return probe["fits"]


def search(fits, prediction, step, resolution, limit, known_fit=0):
    """Largest fitting batch near `prediction` (0 if batch 1 fails);
    `known_fit`, when > 0, is a batch known to fit (a failing prediction
    then bisects down to it instead of walking)."""
    known_fail = None
    b = max(1, prediction)
    if known_fit >= b:
        known_fit = 0
    if fits(b):
        known_fit = b
        while known_fail is None:
            nxt = int(known_fit * (1 + step)) + 1
            if nxt > limit:
                return known_fit
            if fits(nxt):
                known_fit = nxt
            else:
                known_fail = nxt
    else:
        known_fail = b
        while known_fit == 0:  # (skipped when a fitting batch is known)
            nxt = int(known_fail * (1 - step))
            if nxt < 1:
                return 0
            if fits(nxt):
                known_fit = nxt
            else:
                known_fail = nxt
    while known_fail - known_fit > max(1, int(known_fit * resolution)):
        mid = (known_fit + known_fail) // 2
        if fits(mid):
            known_fit = mid
        else:
            known_fail = mid
    return known_fit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kind", required=True, choices=["resnet152", "transformer"],
                    help="which benchmark model (for step_probe.py's inputs)")
    ap.add_argument("--args", required=True,
                    help="--input/--loss/--optimizer/--device flags, quoted")
    ap.add_argument("--profiles", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--capacity_fraction", type=float, default=0.95)
    ap.add_argument("--max_overhead", type=float, default=0.25)
    ap.add_argument("--step", type=float, default=0.05)
    ap.add_argument("--resolution", type=float, default=0.02)
    ap.add_argument("--skip_with_schedule", action="store_true")
    ap.add_argument("--expandable_segments", action="store_true",
                    help="probe with PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True (less fragmentation)")
    o = ap.parse_args()
    if o.expandable_segments:
        ENV["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    largest = max((json.load(open(p)) for p in o.profiles),
                  key=lambda p: int(p["batch_size"]))
    capacity_bytes = int(int(largest["device"]["total_bytes"]) *
                         o.capacity_fraction)
    o.capacity = f"{capacity_bytes}B"
    cli = os.path.join(o.bin, "mutwo")
    rc, out, err, t_predict = run([cli, "max-batch"] + o.profiles +
                                  ["--capacity", o.capacity,
                                   "--max_overhead", str(o.max_overhead),
                                   "--output", "json"])
    if rc != 0:
        raise SystemExit(f"max-batch: {err}")
    prediction = json.loads(out)
    per_sample_ms = (largest["measured"]["module_iteration_ms"] /
                     int(largest["batch_size"]))
    log = []
    prober = Prober(o, per_sample_ms, log)
    result = {"prediction": prediction, "predict_s": t_predict,
              "alloc_conf": ENV.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "capacity_bytes": capacity_bytes,
              "capacity_fraction": o.capacity_fraction,
              "per_sample_ms": per_sample_ms, "probes": log}
    p_without = int(prediction["max_batch_without_checkpointing"])
    print(f"predicted max batch without a schedule {p_without}",
          file=sys.stderr)
    result["true_without"] = search(prober.without, p_without, o.step,
                                    o.resolution, 1 << 20)
    result["reference_batch"] = prober.reference_batch
    if not o.skip_with_schedule:
        p_with = int(prediction["max_batch_with_schedule"])
        print(f"predicted max batch with a schedule {p_with}", file=sys.stderr)
        # A schedule fits at least where the plain step does.
        result["true_with_schedule"] = search(
            prober.with_schedule, p_with, o.step, o.resolution, 1 << 20,
            known_fit=result["true_without"])
    with open(o.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in result if k.startswith("true")}),
          file=sys.stderr)


if __name__ == "__main__":
    main()
