#!/usr/bin/env python3
"""The anchors mutwo is measured against, as a PyTorch user runs
them: one eager training step (forward, cross entropy, backward, Adam step;
fp32, PyTorch's default TF32 settings) of a bench/gpu/make_models.py model,
each system in a fresh process (clean allocator statistics):

  eager             no checkpointing
  ckpt_block        torch.utils.checkpoint(use_reentrant=False) per block
                    (ResNet bottleneck, encoder layer, GPT block, ViT layer)
  ckpt_sqrt         sqrt(n) segments of consecutive blocks, each checkpointed
  compile:B         torch.compile with
                    torch._functorch.config.activation_memory_budget = B
  mutwo_compile:GB  torch.compile(mutwo._compile.apply_compiled(model, S)):
                    mutwo's schedule S (planned for budget GB) as selective
                    activation checkpointing under the compiler;
                    one point per schedule of --mutwo_schedules DIR (the
                    *_b<batch>_mutwo_<budget>.schedule.json files
                    bench/gpu/run_benchmark.py writes), at most
                    --mutwo_compile_points of them, spread over the budgets;
                    its step computes the schedule's loss (a schedule
                    planned with chunked_cross_entropy: that loss, with
                    reuse_logits, as the worker; docs/loss.md)

    anchors.py --models resnet152,transformer --out FILE.jsonl
               [--compile_budgets 1.0,0.5,0.2,0.05] [--iterations 10]
               [--systems eager,...,mutwo_compile --mutwo_schedules DIR]
               [--warm_in_parallel N] [--rounds R]

--warm_in_parallel N: N children warm up (torch.compile takes 1-3 minutes
a point on ResNet-152) at once; each is still timed alone, after all
children are warm, with the others alive and waiting idle (their cached
blocks given back: each holds its parameters, gradients and optimizer
state); points record warmed_in_parallel.
--rounds R: every child is timed R times (--iterations steps each), in
turns, one child after the other; step_ms is the median over all its
steps, step_ms_rounds each round's. One timing per process moved a
point by up to 20% on an H200 host (bench/results/anchors/2026-11-29-h200-7/:
compile:1.0's own program measured 56.6 and 68.6 ms in two processes).

Appends one JSON line per point: model, batch, system, peak_bytes
(torch.cuda.max_memory_allocated over the timed steps), reserved_bytes,
step_ms (median), warmup_s; or error. mutwo_compile points also carry
method "mutwo_compile", schedule, budget_bytes, predicted_peak_bytes,
predicted_iteration_ms, loss (the schedule's loss kind), swaps_ignored
(SWAP decisions kept on the device: SAC cannot swap) and policy_report
(mutwo._compile's report: frames, decisions no op matched).
"""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpu"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))


def mutwo_schedules(directory, model, batch, points):
    """(budget label, path) of the feasible mutwo-policy schedules of
    `model` at `batch` in `directory`, at most `points`, spread evenly
    over the budgets (lowest and highest included)."""
    found = []
    pattern = os.path.join(directory, f"{model}_b{batch}_mutwo_*.schedule.json")
    for path in glob.glob(pattern):
        with open(path) as f:
            s = json.load(f)
        if s.get("feasible"):
            found.append((int(s["budget_bytes"]), path))
    found.sort()
    if points and len(found) > points:
        step = (len(found) - 1) / (points - 1) if points > 1 else 0
        found = [found[round(i * step)] for i in range(points)]
    return [("%.2fGB" % (b / 1e9), path) for b, path in found]


def wrap_blocks(blocks, group):
    """Checkpoints consecutive runs of `group` blocks: the first block of a
    run runs the whole run under checkpoint, the others pass their input
    through. Forward is replaced per instance, so the modules keep their
    attributes (nn.TransformerEncoder reads layers[0].self_attn)."""
    from torch.utils.checkpoint import checkpoint
    for start in range(0, len(blocks), group):
        run = blocks[start:start + group]
        forwards = [b.forward for b in run]

        def run_all(x, *args, _forwards=forwards, **kwargs):
            for f in _forwards:
                x = f(x, *args, **kwargs)
            return x

        def first(x, *args, _run_all=run_all, **kwargs):
            return checkpoint(_run_all, x, *args, use_reentrant=False,
                              **kwargs)

        run[0].forward = first
        for b in run[1:]:
            b.forward = lambda x, *a, **k: x


def child(args):
    import torch
    import torch.nn.functional as F
    from make_models import SPECS, batch_of, blocks, build
    dev = torch.device(args.device)
    batch = args.batch or SPECS[args.model]["batch"]
    model = build(args.model).to(dev)
    x, y = batch_of(args.model, batch, dev)
    system = args.system
    step_model = model
    extra = {}
    handle = None
    if system == "ckpt_block":
        wrap_blocks(blocks(args.model, model), 1)
    elif system == "ckpt_sqrt":
        n = len(blocks(args.model, model))
        wrap_blocks(blocks(args.model, model), math.ceil(math.sqrt(n)))
    elif system.startswith("compile:"):
        import copy
        import torch._functorch.config as fconfig
        fconfig.activation_memory_budget = float(system.split(":")[1])
        # Compared with eager the same way as mutwo_compile (below), so a
        # difference the compiler makes on its own is told apart from one
        # mutwo's policy makes.
        plain = copy.deepcopy(model)
        step_model = torch.compile(model)
    elif system.startswith("mutwo_compile:"):
        import copy
        import mutwo
        from mutwo._apply import _planned_with_chunked_loss
        from mutwo._compile import apply_compiled, compiled_schedule_of
        schedule = mutwo.Schedule.from_json(args.schedule)
        # The eager step's gradients are reported beside the compiled
        # step's (not judged: the compiler's fused kernels round
        # differently).
        plain = copy.deepcopy(model)
        apply_compiled(model, schedule, swaps="ignore")
        handle = compiled_schedule_of(model)
        step_model = torch.compile(model)
        extra = {"method": "mutwo_compile", "schedule": args.schedule,
                 "budget_bytes": schedule.budget_bytes,
                 "predicted_peak_bytes": schedule.predicted_peak_bytes,
                 "predicted_iteration_ms": schedule.predicted_iteration_ms,
                 "swaps_ignored": len(schedule.swapped),
                 "swapped_bytes": sum(d.size_bytes for d in schedule.swapped)}
    elif system != "eager":
        raise SystemExit(f"unknown system {system!r}")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    chunked = system.startswith("mutwo_compile:") and \
        _planned_with_chunked_loss(schedule)
    if chunked:
        extra["loss"] = "chunked_cross_entropy"

    def loss_of(out):
        if chunked:
            return mutwo.chunked_cross_entropy(out, y, reuse_logits=True)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def step():
        # The logits are not kept by a local during backward (the
        # Transformer's are 0.98 GB), as in mutwo's and apply_bench's steps.
        opt.zero_grad(set_to_none=True)
        loss_of(step_model(x)).backward()
        opt.step()

    t0 = time.time()
    if system.startswith(("compile:", "mutwo_compile:")):
        torch.manual_seed(0)
        loss_of(plain(x)).backward()
        eager_grads = {n: p.grad.detach().cpu() for n, p in
                       plain.named_parameters() if p.grad is not None}
        del plain
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        opt.zero_grad(set_to_none=True)
        loss_of(step_model(x)).backward()
        scale = max(g.abs().max().item() for g in eager_grads.values())
        worst = max((p.grad.detach().cpu() - eager_grads[n]).abs().max().item()
                    for n, p in model.named_parameters() if n in eager_grads)
        extra["max_grad_diff_vs_eager_rel"] = worst / scale if scale else 0.0
        del eager_grads
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warmup = time.time() - t0
    rounds = max(1, args.rounds) if args.turn_dir else 1
    if args.turn_dir:
        # Warm beside other children, which stay alive until all are timed:
        # give back the cached blocks while waiting.
        torch.cuda.empty_cache()
        say_warm(args.turn_dir, args.turn)
    times, round_ms = [], []
    for r in range(rounds):
        if args.turn_dir:
            # This child's turn in round r, then one untimed step (the
            # card idled and the cache was emptied while waiting).
            wait_for_go(args.turn_dir, args.turn, r)
            step()
            torch.cuda.synchronize()
        if r == 0:
            torch.cuda.reset_peak_memory_stats()
        these = []
        for _ in range(args.iterations):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            these.append((time.perf_counter() - t) * 1e3)
        times += these
        round_ms.append(statistics.median(these))
        if args.turn_dir:
            torch.cuda.empty_cache()
            say_done(args.turn_dir, args.turn, r)
    print(json.dumps({
        "model": args.model, "batch": batch, "system": system,
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.max_memory_reserved(),
        "step_ms": statistics.median(times), "step_ms_all": times,
        "rounds": rounds, "step_ms_rounds": round_ms,
        "warmup_s": warmup, "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, **extra,
        **({"policy_report": handle.report()} if handle else {})}))


def say_warm(turn_dir, turn):
    """(child) Says it is warm: turn_dir/ready.TURN."""
    open(os.path.join(turn_dir, f"ready.{turn}"), "w").close()


def say_done(turn_dir, turn, round_):
    """(child) Says its timed steps of round ROUND are over."""
    open(os.path.join(turn_dir, f"done.{turn}.{round_}"), "w").close()


def wait_for_go(turn_dir, turn, round_):
    """(child) Waits for turn_dir/go.TURN.ROUND; gives up when the parent
    is gone."""
    go = os.path.join(turn_dir, f"go.{turn}.{round_}")
    parent = os.getppid()
    while not os.path.exists(go):
        if os.getppid() != parent:
            raise SystemExit("anchors.py: the parent is gone")
        time.sleep(0.01)


def run_in_turns(commands, width, timeout, rounds=1):
    """Runs the child command lines `commands` (each gets --turn_dir,
    --turn and --rounds): they warm up (compile) `width` at a time, and a
    warm child stays alive, its cached memory given back; once all are
    warm, each of `rounds` rounds times every child once, one at a time in
    order, with the others waiting idle (nothing else runs on the card or
    the host's cores during a timed window). Over several rounds a drift
    of the machine falls on every point alike, not on whichever point ran
    when it came. A child that is not warm within `timeout` seconds of its
    wave's start, or takes longer than that for one turn, is killed.
    Yields (index, returncode or None when killed, stdout, stderr, seconds
    from start to exit) in order."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="anchors-turns-") as d:
        procs, killed = {}, set()

        def ready(k):
            return (os.path.exists(os.path.join(d, f"ready.{k}"))
                    or procs[k][0].poll() is not None)

        def kill(k):
            procs[k][0].kill()
            procs[k][0].wait()
            killed.add(k)

        for start in range(0, len(commands), width):
            wave = range(start, min(start + width, len(commands)))
            for k in wave:
                out = open(os.path.join(d, f"out.{k}"), "w+")
                err = open(os.path.join(d, f"err.{k}"), "w+")
                procs[k] = (subprocess.Popen(
                    commands[k] + ["--turn_dir", d, "--turn", str(k),
                                   "--rounds", str(rounds)],
                    stdout=out, stderr=err, text=True), out, err, time.time())
            deadline = time.time() + timeout
            while not all(ready(k) for k in wave) and time.time() < deadline:
                time.sleep(0.2)
            for k in wave:
                if not ready(k):
                    kill(k)
        for r in range(rounds):
            for k in sorted(procs):
                p = procs[k][0]
                if k in killed or p.poll() is not None:
                    continue
                open(os.path.join(d, f"go.{k}.{r}"), "w").close()
                done = os.path.join(d, f"done.{k}.{r}")
                deadline = time.time() + timeout
                while not os.path.exists(done) and p.poll() is None and \
                        time.time() < deadline:
                    time.sleep(0.01)
                if not os.path.exists(done) and p.poll() is None:
                    kill(k)
        for k in sorted(procs):
            p, out, err, t0 = procs[k]
            code = None
            if k not in killed:
                try:
                    code = p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    kill(k)
            out.seek(0)
            err.seek(0)
            yield k, code, out.read(), err.read(), time.time() - t0
            out.close()
            err.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--system")
    ap.add_argument("--models", default="resnet152,transformer,gpt,vit_b_16")
    ap.add_argument("--systems", default="eager,ckpt_block,ckpt_sqrt")
    ap.add_argument("--compile_budgets", default="1.0,0.5,0.2,0.05")
    ap.add_argument("--batch", type=int, default=0,
                    help="default: make_models.SPECS' batch")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out")
    ap.add_argument("--schedule", help="(child) a mutwo schedule JSON")
    ap.add_argument("--turn_dir", help="(child) run_in_turns' folder")
    ap.add_argument("--turn", type=int, default=0, help="(child)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --warm_in_parallel: time every point this "
                    "many times, in turns (step_ms is the median over all "
                    "rounds' steps)")
    ap.add_argument("--warm_in_parallel", type=int, default=1,
                    help="children warming up (compiling) at once; each is "
                    "still timed alone, once all of its group are warm "
                    "(1: one child after another)")
    ap.add_argument("--mutwo_schedules", "--mutwo-schedules",
                    help="directory of mutwo schedule JSONs "
                    "(bench/gpu/run_benchmark.py --out) for mutwo_compile")
    ap.add_argument("--mutwo_compile_points", type=int, default=4,
                    help="mutwo_compile: at most this many schedules per "
                    "model (0: all)")
    args = ap.parse_args()
    if args.child:
        return child(args)
    systems = [s for s in args.systems.split(",") if s]
    systems += [f"compile:{b}" for b in args.compile_budgets.split(",") if b]
    if "mutwo_compile" in systems and not args.mutwo_schedules:
        raise SystemExit("--systems mutwo_compile needs --mutwo_schedules DIR"
                         " (bench/gpu/run_benchmark.py's --out)")
    from make_models import SPECS
    for model in args.models.split(","):
        runs = []
        for system in systems:
            if system != "mutwo_compile":
                runs.append((system, None))
                continue
            batch = args.batch or SPECS[model]["batch"]
            found = mutwo_schedules(args.mutwo_schedules, model, batch,
                                    args.mutwo_compile_points)
            if not found:
                print(json.dumps({"model": model, "system": system,
                                  "method": "mutwo_compile", "error":
                                  f"no feasible {model}_b{batch}_mutwo_*"
                                  f".schedule.json in "
                                  f"{args.mutwo_schedules}"}), flush=True)
            runs += [(f"mutwo_compile:{label}", path)
                     for label, path in found]
        commands = []
        for system, schedule in runs:
            cmd = [sys.executable, __file__, "--child", "--model", model,
                   "--system", system, "--device", args.device,
                   "--iterations", str(args.iterations),
                   "--batch", str(args.batch)]
            if schedule:
                cmd += ["--schedule", schedule]
            commands.append(cmd)
        in_turns = args.warm_in_parallel > 1 or args.rounds > 1
        if in_turns:
            finished = run_in_turns(commands, args.warm_in_parallel,
                                    args.timeout, args.rounds)
        else:
            finished = (run_one(k, cmd, args.timeout)
                        for k, cmd in enumerate(commands))
        for k, code, stdout, stderr, wall in finished:
            system, schedule = runs[k]
            lines = [l for l in stdout.splitlines() if l.startswith("{")]
            if code is None:
                point = {"model": model, "system": system,
                         "error": f"timed out after {args.timeout} s"}
            elif code == 0 and lines:
                point = json.loads(lines[-1])
            else:
                point = {"model": model, "system": system,
                         "error": stderr.strip()[-800:]}
            if schedule:
                point.setdefault("method", "mutwo_compile")
                point.setdefault("schedule", schedule)
            point["wall_s"] = wall
            if in_turns:
                point["warmed_in_parallel"] = args.warm_in_parallel
            line = json.dumps(point)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")


def run_one(k, cmd, timeout):
    """One child alone: (k, returncode or None on a timeout, stdout,
    stderr, seconds)."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
        return k, p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return k, None, "", "", time.time() - t0

if __name__ == "__main__":
    sys.exit(main())
