#!/usr/bin/env python3
"""mutwo.apply on a GPU: eager PyTorch models trained in a plain
loop with a schedule from the planner, beside `mutwo-worker execute` of the
same schedule, on one card in one run.

For each model (ResNet-152 and the Transformer of bench/gpu/make_models.py,
batch 64, fp32, Adam): the eager module is scripted for the worker, profiled
(`mutwo-worker profile`), planned at budgets placed between the floor and the
baseline peak (`mutwo plan`), and each schedule is
  - executed by `mutwo-worker execute` (TorchScript step: peak, step time),
  - applied with `mutwo.apply` to the eager module in a fresh process:
    gradients against the unmodified eager step (TF32 off, same RNG), then
    `torch.cuda.max_memory_allocated` and the median step time over
    --iterations steps (forward, cross entropy, backward, Adam step).
The eager step without a schedule runs the same way. Optional probes:
`--ddp` (DistributedDataParallel, world size 1, NCCL, wrapping the applied
model) and `--compile` (torch.compile of the applied model).

    apply_bench.py --bin build-gpu/bin --out DIR [--models resnet152,transformer]
                   [--batch 64] [--fractions 0.25,0.6] [--iterations 6]
Writes DIR/apply_results.json and prints one JSON line per point.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
from make_models import SPECS, batch_of, build  # noqa: E402


def loss_of(out, y):
    import torch.nn.functional as F
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def grads_of(model, x, y, seed):
    import torch
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    loss_of(model(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def child(args):
    """One measurement in a fresh process (clean allocator statistics)."""
    import torch
    import mutwo
    tf32 = (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False  # the gradient check
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model = build(args.model).to(dev).train()
    x, y = batch_of(args.model, args.batch, dev)
    result = {"model": args.model, "batch": args.batch, "mode": args.mode,
              "schedule": args.schedule or None}
    applied = None
    if args.schedule:
        plain = copy.deepcopy(model)
        applied = mutwo.apply(model, args.schedule)
        g_plain = grads_of(plain, x, y, seed=7)
        g_applied = grads_of(model, x, y, seed=7)
        scale = max(g.abs().max().item() for g in g_plain.values())
        diff = max((g_plain[n] - g_applied[n]).abs().max().item()
                   for n in g_plain)
        result.update(grad_max_abs_diff=diff, grad_scale=scale,
                      gradients_match=(set(g_plain) == set(g_applied) and
                                       diff <= 1e-4 * scale),
                      frames=applied.frames, report=applied.report())
        del plain, g_plain, g_applied
        model.zero_grad(set_to_none=True)
    step_model = model
    if args.mode == "ddp":
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl" if cuda else "gloo", rank=0,
                                world_size=1)
        step_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index or 0] if cuda else None)
    elif args.mode == "compile":
        step_model = torch.compile(model)
    # Timing with PyTorch's defaults, as the worker's LibTorch step runs.
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of(step_model(x), y).backward()
        opt.step()

    t0 = time.time()
    for _ in range(2):  # warm-up: Adam state, cuDNN, compile
        step()
    sync()
    result["warmup_s"] = time.time() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if applied is not None:
        applied.reset_stats()
    times = []
    for _ in range(args.iterations):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    if cuda:
        result.update(peak_bytes=torch.cuda.max_memory_allocated(),
                      reserved_bytes=torch.cuda.max_memory_reserved())
    result.update(step_ms=statistics.median(times), step_ms_all=times)
    if applied is not None:
        s = applied.stats()
        result.update(dropped=s.dropped, swapped_out=s.swapped_out,
                      swapped_in=s.swapped_in,
                      replays=sum(s.replays.values()),
                      unmatched=len(applied.unmatched()))
    print(json.dumps(result))


def run(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def spec_args(name, batch, device):
    a = []
    for i in SPECS[name]["inputs"]:
        a += ["--input", i]
    return a + ["--batch", str(batch), "--loss", SPECS[name]["loss"],
                "--optimizer", "adam", "--device", device]


def run_child(args, model, mode, schedule, log):
    cmd = [sys.executable, __file__, "--child", "--model", model, "--mode",
           mode, "--device", args.device, "--batch", str(args.batch), "--iterations",
           str(args.iterations)] + (["--schedule", schedule] if schedule else [])
    rc, out, err = run(cmd, timeout=600)
    log.write(err)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if rc != 0 or not lines:
        return {"model": model, "mode": mode, "schedule": schedule,
                "error": err.strip()[-800:]}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--mode", default="eager",
                    choices=["eager", "ddp", "compile"])
    ap.add_argument("--schedule", default="")
    ap.add_argument("--bin")
    ap.add_argument("--out")
    ap.add_argument("--models", default="resnet152,transformer")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fractions", default="0.25,0.6",
                    help="budgets at floor + f * (baseline - floor)")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    import torch
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "apply_bench.log"), "a")
    worker = os.path.join(args.bin, "mutwo-worker")
    cli = os.path.join(args.bin, "mutwo")
    results = {"device": (torch.cuda.get_device_name(0)
                          if args.device.startswith("cuda") else "cpu"),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "batch": args.batch, "points": []}

    def emit(point):
        results["points"].append(point)
        print(json.dumps(point), flush=True)
        with open(os.path.join(args.out, "apply_results.json"), "w") as f:
            json.dump(results, f, indent=1)

    for name in args.models.split(","):
        base = os.path.join(args.out, f"{name}_b{args.batch}")
        torch.jit.script(build(name).train()).save(base + ".pt")
        rc, out, err = run([worker, "profile", base + ".pt"] +
                           spec_args(name, args.batch, args.device) + ["--output", "json"])
        if rc != 0:
            emit({"model": name, "error": "profile: " + err.strip()[-800:]})
            continue
        with open(base + "_profile.json", "w") as f:
            f.write(out)
        rc, out, err = run([cli, "plan", base + "_profile.json", "--budget",
                            "1B", "--output", "json"])
        floor = int(json.loads(out)["floor_bytes"])
        baseline = int(json.loads(out)["baseline_peak_bytes"])
        eager = run_child(args, name, "eager", "", log)
        eager.update(system="eager", floor_bytes=floor,
                     baseline_predicted_bytes=baseline)
        emit(eager)
        for i, f in enumerate(float(v) for v in args.fractions.split(",")):
            # At least the floor (+0.05%, as run_benchmark.py): at small
            # batches the floor can lie above the baseline peak.
            budget = int(max(floor * 1.0005 + 1,
                             floor + f * (baseline - floor)))
            sched = f"{base}_{budget}B.schedule.json"
            rc, out, err = run([cli, "plan", base + "_profile.json", "--budget",
                                f"{budget}B", "--output", "json"])
            if rc != 0:
                emit({"model": name, "budget_bytes": budget,
                      "error": "plan: " + err.strip()[-800:]})
                continue
            with open(sched, "w") as fh:
                fh.write(out)
            s = json.loads(out)
            point = {"model": name, "system": "mutwo-worker execute",
                     "budget_bytes": budget, "fraction": f,
                     "predicted_peak_bytes": int(s["predicted_peak_bytes"]),
                     "predicted_iteration_ms": s["predicted_iteration_ms"]}
            rc, out, err = run([worker, "execute", base + ".pt", "--schedule",
                                sched] + spec_args(name, args.batch, args.device) +
                               ["--iterations", str(args.iterations),
                                "--output", "json"])
            if rc == 0:
                v = json.loads(out)
                point.update(peak_bytes=int(v["scheduled"]["peak_bytes"]),
                             step_ms=v["scheduled"]["iteration_ms"],
                             baseline_peak_bytes=int(v["baseline"]["peak_bytes"]),
                             baseline_step_ms=v["baseline"]["iteration_ms"],
                             gradients_match=v["gradients_match"])
            else:
                point["error"] = "execute: " + err.strip()[-800:]
            emit(point)
            p = run_child(args, name, "eager", sched, log)
            p.update(system="mutwo.apply", budget_bytes=budget, fraction=f)
            emit(p)
            if args.ddp and i == 0:
                p = run_child(args, name, "ddp", sched, log)
                p.update(system="mutwo.apply + DDP", budget_bytes=budget)
                emit(p)
            if args.compile and i == 0:
                p = run_child(args, name, "compile", sched, log)
                p.update(system="mutwo.apply + torch.compile",
                         budget_bytes=budget)
                emit(p)


if __name__ == "__main__":
    sys.exit(main())
