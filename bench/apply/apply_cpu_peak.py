#!/usr/bin/env python3
"""One schedule's step peak on the CPU, under `mutwo.apply` and under the
worker's executor, side by side: the CPU rehearsal of a GPU point.

    apply_cpu_peak.py --model M --schedule S.json --out DIR
                      [--bin BUILD/bin] [--batch N] [--loss-spec L]
                      [--variants eager,applied,applied_no_swaps]
                      [--optimizer adam:foreach] [--prefetch-ahead K]

M is a model of apply_zoo_gpu.py's suite at its GPU-tier size and batch
(--batch to change it); S a schedule planned for it (apply_zoo_gpu.py
writes them beside its points; .json or .json.gz). Variants: `eager` (the
unmodified model), `applied` (strict apply), `applied_no_swaps` (the
schedule's SWAP decisions as RETAIN, strict=False). Each is measured as
`mutwo verify` measures a CPU step (`cpu_step_peak_bytes`: parameters,
gradients, optimizer state and inputs held when the step starts, plus the
highest count of the CPU allocator's bytes over one step after 3 warm-up
steps). A swapped tensor's host copy is outside that count, as on the GPU
(and as the worker's CPU swap keeps it outside its counting allocator).
With --bin the same schedule (and its no-swap twin for applied_no_swaps)
runs through `mutwo-worker execute --device cpu` on the model scripted
here (the schedule's graph fingerprint must match). One JSON line per
measurement on stdout:

  {"model", "variant", "system": "apply" | "worker", "peak_bytes",
   "budget_bytes", "predicted_peak_bytes", ...}

Example (the 2026-11-29 GPU run's mobilenet_v2 low schedule):

    zcat bench/results/apply-zoo/2026-11-29-h200-5/schedules/mobilenet_v2.1029295308B.schedule.json.gz > /tmp/s.json
    /usr/bin/python3 bench/apply/apply_cpu_peak.py --model mobilenet_v2 \\
        --schedule /tmp/s.json --out /tmp/cpu_peak --bin build/bin
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from apply_zoo_cpu import same_threads_env  # noqa: E402
from apply_zoo_gpu import (build_model, by_name, fresh_model,  # noqa: E402
                           swaps_as_retain)


def schedule_doc(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.JSONDecoder().raw_decode(f.read())[0]


def apply_peak(args, m, doc, label):
    import torch
    import mutwo
    from mutwo._verify import cpu_step_peak_bytes, make_optimizer
    dev = torch.device("cpu")
    schedule = None if doc is None else \
        mutwo.Schedule.from_json(json.dumps(doc))
    model, inputs, loss_fn, applied = fresh_model(
        m, dev, schedule, strict=(label != "applied_no_swaps"),
        **({} if schedule is None else
           {"prefetch_ahead": args.prefetch_ahead}))
    opt = make_optimizer(args.optimizer, model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(*inputs)).backward()
        opt.step()
    for _ in range(3):
        step()
    t = time.perf_counter()
    peak = cpu_step_peak_bytes(step, model, opt, inputs)
    res = {"system": "apply", "peak_bytes": peak,
           "seconds": round(time.perf_counter() - t, 2)}
    if applied is not None:
        s = applied.stats()
        res.update(dropped=s.dropped, swapped_out=s.swapped_out,
                   swapped_in=s.swapped_in, replays=sum(s.replays.values()))
        applied.remove()
    return res


def worker_peak(args, m, doc, label, model_path):
    path = os.path.join(args.out, f"{m['name']}.{label}.schedule.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    p = subprocess.run(
        [os.path.join(args.bin, "mutwo-worker"), "execute", model_path,
         "--schedule", path, "--device", "cpu", "--warmup", "1",
         "--iterations", "1", "--baseline=false", "--output", "json"],
        capture_output=True, text=True, env=same_threads_env())
    try:
        v = json.loads(p.stdout)
    except ValueError:
        return {"system": "worker", "error": p.stderr.strip()[-500:]}
    return {"system": "worker",
            "peak_bytes": int(v["scheduled"]["peak_bytes"]),
            "within_budget": v.get("within_budget", False),
            "rc": p.returncode}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin", default="",
                    help="BUILD/bin with mutwo-worker: the worker's peak "
                    "of the same schedule too")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--loss-spec", default="")
    ap.add_argument("--variants", default="eager,applied,applied_no_swaps")
    ap.add_argument("--optimizer", default="adam:foreach")
    ap.add_argument("--prefetch-ahead", type=int, default=2)
    args = ap.parse_args()
    import torch
    torch.manual_seed(0)
    m = by_name(args.model, "gpu")
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    doc = schedule_doc(args.schedule)
    os.makedirs(args.out, exist_ok=True)
    model_path = os.path.join(args.out, f"{m['name']}.pt")
    if args.bin:
        torch.jit.script(build_model(m)).save(model_path)
    base = {"model": m["name"], "batch": m["batch"],
            "budget_bytes": int(doc.get("budget_bytes", 0)),
            "predicted_peak_bytes": int(doc.get("predicted_peak_bytes", 0))}
    for label in args.variants.split(","):
        if label not in ("eager", "applied", "applied_no_swaps"):
            raise SystemExit(f"unknown variant {label!r}")
        d = {"eager": None, "applied": doc,
             "applied_no_swaps": swaps_as_retain(doc)}[label]
        rows = [apply_peak(args, m, d, label)]
        if args.bin and d is not None:
            rows.append(worker_peak(args, m, d, label, model_path))
        for r in rows:
            print(json.dumps(dict(base, variant=label, **r)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
