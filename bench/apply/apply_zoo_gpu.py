#!/usr/bin/env python3
"""The GPU bar for `mutwo.apply`: every zoo family and >= 20
torchvision models, two budgets each, on one card per shard.

Bar: "on every zoo family and >= 20 torchvision models at 2
budgets, `mutwo.apply` measured peak <= budget, gradients equal, every
decision applied; applied step time within +10% of the worker's scheduled
step at the same point."

Per model (MODELS below: the five repo families of bench/zoo/models.py at
their GPU-tier architecture, batch chosen for a peak of a few GB, and 22
torchvision classifiers at 224 px, 1000 classes, weights=None): the eager
module (weights from a seed of the model's own) is scripted, profiled
(`mutwo-worker profile --optimizer adam:foreach`, --optimizer: the update's
temporaries as torch.optim.Adam's default on CUDA holds them, all
parameters at once), planned by `mutwo plan` at
budgets floor + f * (baseline - floor) for f in --fractions (default 0.1,
"low", near the floor, and 0.5, "mid"; at least floor * 1.0005 + 1 B when
the floor lies above the baseline), and each schedule
  - executed by `mutwo-worker execute` (TorchScript step, Adam: peak and
    median step time over --iterations, gradients against its plain step),
  - applied with `mutwo.apply` (strict) to the eager module in a fresh
    process (the child mode of this script): one step of the unmodified
    model and four of the applied model from the same weights and seed
    (apply learns in the first three), TF32 off and cuDNN deterministic,
    each compared (|diff| <= 1e-4 of the largest gradient, apply_bench.py's
    tolerance); then, with PyTorch's
    defaults, 2 warm-up and --iterations timed steps (forward, loss,
    backward, the same Adam step): `torch.cuda.max_memory_allocated` over the timed
    steps and the median step time; `Applied.unmatched()` after them. At
    the first budget the child also times the unmodified eager model the
    same way after `applied.remove()` (the "eager" columns).

Bars per point (each is a field of its JSON line):
  within_budget   apply's peak <= the budget;
  gradients_equal the applied step's gradients equal the unmodified one's;
  all_applied     no ScheduleMismatchError and unmatched() empty after the
                  timed steps;
  time_within     apply's median step <= (1 + --time-bar) x the worker's
                  median scheduled step at the same schedule.
A point that fails to profile, plan, execute or apply fails every bar it
could not show. The summary line counts each bar; exit status 1 when one
fails (0 with --no-fail).

    apply_zoo_gpu.py --bin BIN --out DIR [--models a,b | --shard K/N]
                     [--fractions 0.1,0.5] [--iterations 5] [--device cuda:0]
    apply_zoo_gpu.py --merge DIR [DIR ...] --out DIR   # one summary of shards
    apply_zoo_gpu.py --trace --model M --schedule S.json --out DIR
        # torch.profiler of 3 applied and 3 unmodified steps (where the
        # step time goes), tables in DIR
    apply_zoo_gpu.py --ab --model M --schedule S.json [--before REV_PY]
        # step time of eager, applied and (--before: _apply.py of another
        # revision) applied-before, interleaved in one process: R rounds
        # (--rounds) of each variant's 3 warm-up + --iterations timed
        # steps; one JSON line of medians (a host-bound step varies by
        # tens of percent between processes on a lent machine)

Writes DIR/points.jsonl (one line per point) and DIR/summary.json; prints
the same lines. Works with torch 1.13 (CPU smoke: --device cpu, no peak
and no time bars) and torch 2.x.
"""
import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# MUTWO_PY: another copy of the package (an A/B of two revisions).
sys.path.insert(0, os.environ.get("MUTWO_PY",
                                  os.path.join(ROOT, "client", "python")))
sys.path.insert(0, os.path.join(ROOT, "bench", "zoo"))
sys.path.insert(0, HERE)

GRAD_RTOL = 1e-4
DEFAULT_TIME_BAR = 0.10

# name -> (builder kind, batch, extra). Zoo families: the GPU tier's
# architecture (bench/zoo/models.py repo_models("gpu")); the batch is set
# here for a peak of a few GB. torchvision: 224 px, 1000 classes.
ZOO_BATCH = {"gpt": 8, "transformer_encoder": 8, "lstm_lm": 32, "unet": 8,
             "moe": 32}
TORCHVISION = [
    # (name, batch, builder kwargs)
    ("resnet18", 64, {}), ("resnet34", 64, {}), ("resnet50", 32, {}),
    ("resnet101", 32, {}), ("resnext50_32x4d", 32, {}),
    ("wide_resnet50_2", 32, {}), ("densenet121", 32, {}),
    ("mobilenet_v2", 32, {}), ("mobilenet_v3_large", 64, {}),
    ("efficientnet_b0", 32, {}), ("efficientnet_b1", 32, {}),
    ("regnet_y_400mf", 64, {}), ("regnet_x_1_6gf", 32, {}),
    ("shufflenet_v2_x1_0", 64, {}), ("squeezenet1_1", 64, {}),
    ("mnasnet1_0", 64, {}), ("vgg11_bn", 32, {}), ("convnext_tiny", 32, {}),
    ("vit_b_16", 32, {}), ("swin_t", 32, {}),
    ("googlenet", 64, {"aux_logits": False, "init_weights": True}),
    ("alexnet", 64, {}),
]


def suite(tier="gpu"):
    """Model descriptions: name, family, build(), inputs, loss, batch."""
    import models as zoo  # bench/zoo/models.py
    out = []
    for m in zoo.repo_models(tier):
        m = dict(m, source="zoo")
        if tier == "gpu":
            m["batch"] = ZOO_BATCH.get(m["name"], m["batch"])
        out.append(m)
    for name, batch, extra in TORCHVISION:
        size = 224 if tier == "gpu" else 64
        nc = 1000 if tier == "gpu" else 10

        def build(name=name, extra=extra, nc=nc):
            import torchvision
            return getattr(torchvision.models, name)(num_classes=nc, **extra)
        out.append(dict(name=name, family="torchvision", source="torchvision",
                        build=build, inputs=[f"x:float32[B,3,{size},{size}]"],
                        loss=f"cross_entropy:y:int64[B]{{0,{nc}}}",
                        batch=batch if tier == "gpu" else 4, config=extra))
    return out


def build_model(m):
    import torch
    # Weights from a seed of the model's own (as bench/zoo/models.py).
    torch.manual_seed(zlib.crc32(m["name"].encode()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m["build"]().train()


def select_output(out, selector):
    """The loss's tensor: '@0' a tuple's first, '@out' a dict's 'out'."""
    if isinstance(out, dict):
        return out["out"]
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def loss_fn_of(spec, batch, gen, device):
    """The worker's --loss spec as a function of the model's output: mean,
    sum, or cross_entropy[@SELECTOR]:TARGET_SPEC (target drawn from gen)."""
    import torch.nn.functional as F
    from apply_zoo_cpu import make_tensor
    name, _, target = spec.partition(":")
    kind, _, selector = name.partition("@")
    if kind == "mean":
        return lambda out: select_output(out, selector).float().mean()
    if kind == "sum":
        return lambda out: select_output(out, selector).float().sum()
    if kind != "cross_entropy" or not target:
        raise ValueError(f"loss {spec!r}")
    y = make_tensor(target, batch, gen).to(device)

    def ce(out):
        out = select_output(out, selector)
        # Classes last ([B, T, V] against [B, T]) or second ([B, C]).
        if out.dim() > 2 and tuple(out.shape[:-1]) == tuple(y.shape):
            return F.cross_entropy(out.reshape(-1, out.shape[-1]),
                                   y.reshape(-1))
        return F.cross_entropy(out, y)
    return ce


def inputs_of(m, device):
    import torch
    from apply_zoo_cpu import make_tensor
    gen = torch.Generator().manual_seed(1)
    inputs = [make_tensor(s, m["batch"], gen).to(device) for s in m["inputs"]]
    loss = loss_fn_of(m["loss_spec"], m["batch"], gen, device)
    return inputs, loss


def by_name(name, tier):
    for m in suite(tier):
        if m["name"] == name:
            return m
    raise SystemExit(f"unknown model {name}")


# ---------------------------------------------------------------------------
# Child: one schedule applied in a fresh process.

def fresh_model(m, dev, schedule=None, strict=True, **apply_kwargs):
    """(model, inputs, loss_fn, applied): a new model of `m` on `dev` (the
    last one's cached memory released first), its inputs and loss, and
    `schedule` applied to it (None: not applied, `apply_kwargs` unused;
    else they go to mutwo.apply), apply's warnings silenced (the callers measure, they do
    not train)."""
    import torch
    import mutwo
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    model = build_model(m).to(dev)
    inputs, loss_fn = inputs_of(m, dev)
    applied = None
    if schedule is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            applied = mutwo.apply(model, schedule, strict=strict,
                                  **apply_kwargs)
    return model, inputs, loss_fn, applied


def swaps_as_retain(doc):
    """A copy of the schedule document `doc` with its SWAP decisions made
    RETAIN."""
    doc = json.loads(json.dumps(doc))
    for d in doc["decisions"]:
        if d.get("action") == "SWAP":
            d["action"] = "RETAIN"
    return doc


def without_swaps(path):
    """The schedule at `path` with its SWAP decisions made RETAIN."""
    import mutwo
    with open(path) as f:
        doc = json.JSONDecoder().raw_decode(f.read())[0]
    return mutwo.Schedule.from_json(json.dumps(swaps_as_retain(doc)))


def grads_of(model, inputs, loss_fn, seed=7):
    import torch
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    loss_fn(model(*inputs)).backward()
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters()
         if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return g


def adam_steps(model, inputs, loss_fn, dev, optimizer="adam:foreach"):
    """(step, sync): one training step with the optimizer the schedules
    were planned with (`--optimizer`; torch.optim's as `mutwo verify` makes
    it: `adam:foreach` is its default Adam on CUDA), and a wait for the
    device's queued work (nothing on the CPU)."""
    import torch
    from mutwo._verify import make_optimizer
    opt = make_optimizer(optimizer, model.parameters())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(*inputs)).backward()
        opt.step()
    return step, sync


def timed_steps(model, inputs, loss_fn, iterations, dev, applied=None,
                optimizer="adam:foreach"):
    """2 warm-up and `iterations` timed Adam steps: (median ms, all ms,
    max_memory_allocated over the timed steps or None)."""
    import torch
    cuda = dev.type == "cuda"
    step, sync = adam_steps(model, inputs, loss_fn, dev, optimizer)
    for _ in range(2):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    if applied is not None:
        applied.reset_stats()
    times = []
    for _ in range(iterations):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append(round((time.perf_counter() - t) * 1e3, 3))
    peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    model.zero_grad(set_to_none=True)
    return statistics.median(times), times, peak


def child(args):
    import torch
    import mutwo
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    m = by_name(args.model, args.tier)
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    res = {"model": m["name"], "schedule": args.schedule}
    model = build_model(m).to(dev)
    inputs, loss_fn = inputs_of(m, dev)
    schedule = mutwo.Schedule.from_json(args.schedule)
    res.update(recompute=len(schedule.recomputed), swap=len(schedule.swapped))
    tf32 = (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    plain = copy.deepcopy(model)
    try:
        applied = mutwo.apply(model, schedule)  # strict
    except mutwo.InfeasibleScheduleError as e:
        res.update(error="apply: infeasible: " + str(e)[:400],
                   all_applied=False)
        print(json.dumps(res))
        return 0
    g_plain = grads_of(plain, inputs, loss_fn)
    try:
        g_applied = grads_of(model, inputs, loss_fn)
    except mutwo.ScheduleMismatchError as e:
        res.update(all_applied=False, error="ScheduleMismatchError: " +
                   str(e)[:600],
                   unapplied=[f"{d.action} {d.module_path} {d.op_kind}"
                              for d in e.decisions][:20])
        print(json.dumps(res))
        return 0
    meas = applied.measurements()
    # Buffers (batch-norm running statistics) after that one step each:
    # replays must leave them as one unmodified step does.
    bdiff = max(((a.double() - b.double()).abs().max().item()
                 for a, b in zip(plain.buffers(), model.buffers())
                 if a.numel()), default=0.0)
    res.update(buffers_max_abs_diff=bdiff)
    # Three more applied steps from the same weights: the first two learn
    # (where recompute frames stop counting saves, then where the
    # saved-tensor hook is needed), the third runs as every later step
    # does. Each must give the unmodified step's gradients.
    later = [grads_of(model, inputs, loss_fn) for _ in range(3)]
    scale = max(g.abs().max().item() for g in g_plain.values())

    diffs = [(max((g_plain[n] - g[n]).abs().max().item() for n in g_plain)
              if set(g_plain) == set(g) else None)
             for g in [g_applied] + later]
    diff, later_diffs = diffs[0], diffs[1:]
    equal = [d is not None and d <= GRAD_RTOL * scale for d in diffs]
    res.update(grad_max_abs_diff=diff, grad_scale=scale,
               later_grad_max_abs_diff=later_diffs,
               gradients_equal=all(equal),
               frames=len(applied.frames))
    if meas is not None:
        res.update(first_step_peak_bytes=meas.peak_bytes,
                   saving_bytes=meas.saving_bytes,
                   planned_saving_bytes=meas.planned_saving_bytes,
                   swapped_bytes=meas.swapped_bytes)
    del plain, g_plain, g_applied, later
    gc.collect()
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = tf32
    if cuda:
        torch.cuda.empty_cache()
    ms, all_ms, peak = timed_steps(model, inputs, loss_fn, args.iterations,
                                   dev, applied, args.optimizer)
    s = applied.stats()
    unmatched = applied.unmatched()
    res.update(peak_bytes=peak, step_ms=round(ms, 3), step_ms_all=all_ms,
               dropped=s.dropped, swapped_out=s.swapped_out,
               swapped_in=s.swapped_in, replays=sum(s.replays.values()),
               skipped_calls=s.skipped, unmatched=len(unmatched),
               unmatched_list=[f"{d.action} {d.module_path} {d.op_kind}"
                               for d in unmatched][:20],
               all_applied=not unmatched,
               report=applied.report())
    if args.eager:
        applied.remove()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        ms, all_ms, peak = timed_steps(model, inputs, loss_fn,
                                       args.iterations, dev,
                                       optimizer=args.optimizer)
        res.update(eager_peak_bytes=peak, eager_step_ms=round(ms, 3))
    print(json.dumps(res))
    return 0


def trace(args):
    """Where apply's step time goes: torch.profiler over applied and
    unmodified steps of one model, tables into --out."""
    import torch
    import mutwo
    from torch.profiler import ProfilerActivity, profile
    dev = torch.device(args.device)
    m = by_name(args.model, args.tier)
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    os.makedirs(args.out, exist_ok=True)
    model = build_model(m).to(dev)
    inputs, loss_fn = inputs_of(m, dev)
    acts = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    summary = {"model": m["name"], "schedule": args.schedule}
    for label in ("eager", "applied"):
        applied = (mutwo.apply(model, args.schedule)
                   if label == "applied" else None)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(model(*inputs)).backward()
            opt.step()
        for _ in range(3):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if applied is not None:
            applied.reset_stats()  # counts of the 3 profiled steps
        with profile(activities=acts, record_shapes=False) as prof:
            t = time.perf_counter()
            for _ in range(3):
                step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            wall = (time.perf_counter() - t) * 1e3 / 3
        ka = prof.key_averages()
        attr = "device_time_total" if hasattr(
            ka[0], "device_time_total") else "cuda_time_total"
        # Kernels, copies and sets on the device, as the table's "Self CUDA
        # time total" counts them (an op's self device time repeats its
        # kernels'; a GPU user annotation spans them).
        from torch.autograd import DeviceType
        dev_events = [e for e in ka
                      if getattr(e, "device_type", None) == DeviceType.CUDA
                      and not getattr(e, "is_user_annotation", False)]
        kernel_us = sum(getattr(e, "self_device_time_total",
                                getattr(e, "self_cuda_time_total", 0))
                        for e in dev_events) / 3
        n_kernels = sum(e.count for e in dev_events)
        aten_calls = sum(e.count for e in ka if e.key.startswith("aten::")) / 3
        summary[label] = {"wall_ms_per_step": round(wall, 3),
                          "device_self_ms_per_step": round(kernel_us / 1e3, 3),
                          "aten_calls_per_step": aten_calls,
                          "device_events_per_step": n_kernels / 3}
        if applied is not None:
            summary[label].update(
                replays=sum(applied.stats().replays.values()) / 3,
                dropped=applied.stats().dropped / 3,
                skipped=applied.stats().skipped / 3)
        with open(os.path.join(args.out, f"trace_{label}_cpu.txt"), "w") as f:
            f.write(ka.table(sort_by="self_cpu_time_total", row_limit=45,
                             max_name_column_width=70))
        if dev.type == "cuda":
            with open(os.path.join(args.out, f"trace_{label}_device.txt"),
                      "w") as f:
                f.write(ka.table(sort_by=attr, row_limit=45,
                                 max_name_column_width=70))
        # Python's own view (cProfile) of 3 more steps: the CPU time of the
        # hooks and replays, which a GPU step waits for when it is
        # launch-bound.
        import cProfile
        import io
        import pstats
        pr = cProfile.Profile()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        pr.enable()
        for _ in range(3):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        pr.disable()
        summary[label]["cprofile_wall_ms_per_step"] = round(
            (time.perf_counter() - t) * 1e3 / 3, 3)
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf)
        st.sort_stats("tottime").print_stats(40)
        st.sort_stats("cumulative").print_stats(60)
        mutwo_s = sum(v[2] for k, v in st.stats.items()
                      if "mutwo" in k[0] and "_apply" in k[0])
        summary[label]["cprofile_mutwo_apply_tottime_ms_per_step"] = round(
            mutwo_s * 1e3 / 3, 3)
        with open(os.path.join(args.out, f"cprofile_{label}.txt"), "w") as f:
            f.write(buf.getvalue())
        opt = None  # noqa: F841 (its state freed before the next label)
        if applied is not None:
            applied.remove()
    with open(os.path.join(args.out, "trace_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


def ab(args):
    """Interleaved step times of one schedule: eager, this tree's apply
    and (--before) another revision's, in one process."""
    import torch
    import mutwo
    from apply_zoo_cpu import load_apply_file
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    m = by_name(args.model, args.tier)
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    model = build_model(m).to(dev)
    inputs, loss_fn = inputs_of(m, dev)
    schedule = mutwo.Schedule.from_json(args.schedule)
    variants = {"eager": None, "after": mutwo.apply}
    if args.before:
        variants["before"] = load_apply_file(args.before).apply
    step, sync = adam_steps(model, inputs, loss_fn, dev, args.optimizer)
    times = {k: [] for k in variants}
    peaks = {k: 0 for k in variants}
    for _ in range(args.rounds):
        for k, impl in variants.items():
            applied = impl(model, schedule) if impl is not None else None
            # Warm-up: apply's first steps learn (where frames stop
            # counting, where the saved-tensor hook is needed).
            for _ in range(3):
                step()
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            t = time.perf_counter()
            for _ in range(args.iterations):
                step()
            sync()
            times[k].append((time.perf_counter() - t) * 1e3 /
                            args.iterations)
            if cuda:
                peaks[k] = max(peaks[k], torch.cuda.max_memory_allocated(dev))
            if applied is not None:
                applied.remove()
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    res = {"model": m["name"], "schedule": os.path.basename(args.schedule),
           "rounds": args.rounds, "steps_per_round": args.iterations,
           "median_ms": med, "all_ms": {k: [round(x, 3) for x in v]
                                        for k, v in times.items()},
           "peak_bytes": peaks if cuda else None,
           "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
           "torch": torch.__version__}
    for k in variants:
        if k != "eager":
            res[f"{k}_over_eager"] = round(med[k] / med["eager"], 4)
    if "before" in med:
        res["after_over_before"] = round(med["after"] / med["before"], 4)
    print(json.dumps(res), flush=True)
    return 0


def probe(args):
    """Where the peak of one model's training step occurs, per variant:
    the unmodified eager step with Adam's default (foreach) and
    foreach=False, with zero_grad(set_to_none=False), and the applied
    schedule with and without its SWAP decisions (turned into RETAIN,
    strict=False). Per variant, 3 warm-up and 3 measured steps; per
    measured step torch.cuda.max_memory_allocated over forward, backward
    and the optimizer step (peak statistics reset at each phase's start)
    and memory_allocated at each boundary. One JSON line per variant."""
    import torch
    import mutwo
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    zero = (lambda *a: 0)  # noqa: E731 (CPU smoke run: no figures)
    allocated = torch.cuda.memory_allocated if cuda else zero
    max_allocated = torch.cuda.max_memory_allocated if cuda else zero
    reset = torch.cuda.reset_peak_memory_stats if cuda else zero
    sync = torch.cuda.synchronize if cuda else zero
    m = by_name(args.model, args.tier)
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    schedule = (mutwo.Schedule.from_json(args.schedule)
                if args.schedule else None)
    variants = [("eager", None, {}, True), ("eager_foreach_false", None,
                {"foreach": False}, True),
                ("eager_zero_grad_keep", None, {}, False)]
    if schedule is not None:
        variants.append(("applied", schedule, {}, True))
        if schedule.swapped:
            variants.append(("applied_no_swaps", without_swaps(args.schedule),
                             {}, True))
    out = []
    for label, sched, adam, set_to_none in variants:
        model, inputs, loss_fn, applied = fresh_model(
            m, dev, sched, strict=label == "applied")
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, **adam)
        steps = []
        for i in range(6):
            rec = {}
            sync(dev)
            rec["start"] = allocated(dev)
            reset(dev)
            opt.zero_grad(set_to_none=set_to_none)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss = loss_fn(model(*inputs))
            sync(dev)
            rec["forward_peak"] = max_allocated(dev)
            rec["after_forward"] = allocated(dev)
            reset(dev)
            loss.backward()
            del loss
            sync(dev)
            rec["backward_peak"] = max_allocated(dev)
            rec["after_backward"] = allocated(dev)
            reset(dev)
            opt.step()
            sync(dev)
            rec["optimizer_peak"] = max_allocated(dev)
            rec["after_step"] = allocated(dev)
            if i >= 3:
                steps.append(rec)
        peak = {k: max(r[k] for r in steps) for k in steps[0]}
        phase = max(("forward_peak", "backward_peak", "optimizer_peak"),
                    key=lambda k: peak[k])
        res = dict(model=m["name"], batch=m["batch"], variant=label,
                   schedule=os.path.basename(args.schedule) if sched
                   is not None else None, peak_bytes=peak[phase],
                   peak_phase=phase, **peak)
        if applied is not None:
            res["swapped_out"] = applied.stats().swapped_out
            applied.remove()
        out.append(res)
        print(json.dumps(res), flush=True)
        del model, opt, applied
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"probe_{m['name']}.jsonl"),
                  "a") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    return 0


# ---------------------------------------------------------------------------
# Driver.

def one_line(stderr, rc=None):
    lines = [l.strip() for l in (stderr or "").splitlines()
             if l.strip() and not l.strip().startswith(
                 ("frame #", "Exception raised from"))]
    mine = [l for l in lines if l.startswith(("mutwo-worker", "mutwo ",
                                              "Traceback"))]
    return (mine[-1:] or lines[-1:] or [f"exit code {rc}"])[0][:500]


def run(cmd, timeout=600):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"timeout after {timeout}s: {' '.join(cmd[:3])}"


def worker_args(m, device, extra_flags, optimizer="adam:foreach"):
    a = []
    for i in m["inputs"]:
        a += ["--input", i]
    for u in m.get("unbatched", []):
        a += ["--unbatched", u]
    return a + ["--batch", str(m["batch"]), "--loss", m["loss_spec"],
                "--optimizer", optimizer, "--device", device] + extra_flags


def run_child(args, m, schedule, eager, log):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model",
           m["name"], "--schedule", schedule, "--device", args.device,
           "--tier", args.tier, "--batch", str(m["batch"]), "--loss-spec",
           m["loss_spec"], "--iterations", str(args.iterations),
           "--optimizer", args.optimizer]
    if eager:
        cmd.append("--eager")
    rc, out, err = run(cmd, timeout=600)
    log.write(f"== child {m['name']} {schedule} rc={rc}\n{err}\n")
    log.flush()
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if rc != 0 or not lines:
        return {"error": "apply child: " + one_line(err, rc)}
    return json.loads(lines[-1])


def judge(p, time_bar, cuda):
    """Fills the four bars of a point (False where it could not show)."""
    budget = p.get("budget_bytes")
    peak = p.get("apply_peak_bytes")
    p["within_budget"] = (peak is not None and budget is not None and
                          peak <= budget) if cuda else None
    p["gradients_equal"] = bool(p.get("apply_gradients_equal"))
    p["all_applied"] = bool(p.get("apply_all_applied"))
    w, a = p.get("worker_step_ms"), p.get("apply_step_ms")
    if w and a:
        p["time_ratio"] = round(a / w, 4)
    p["time_within"] = (bool(w and a and a <= (1 + time_bar) * w)
                        if cuda else None)
    bars = [p["gradients_equal"], p["all_applied"]]
    if cuda:
        bars += [p["within_budget"], p["time_within"]]
    p["ok_memory_grads_applied"] = all(bars[:2]) and (
        p["within_budget"] is not False)
    p["ok"] = all(bars)
    return p


def run_model(m, args, log):
    import torch
    from models import output_selector  # bench/zoo/models.py
    name = m["name"]
    t0 = time.time()
    base = os.path.join(args.out, name)
    cli = os.path.join(args.bin, "mutwo")
    worker = os.path.join(args.bin, "mutwo-worker")
    head = {"model": name, "family": m["family"], "source": m["source"],
            "batch": m["batch"], "inputs": m["inputs"]}
    if m.get("config"):
        head["config"] = m["config"]
    try:
        model = build_model(m)
        head["params"] = sum(p.numel() for p in model.parameters())
        scripted = torch.jit.script(model)
        scripted.save(base + ".pt")
        sel = ""
        if m["loss"].startswith("cross_entropy:"):
            from apply_zoo_cpu import make_tensor
            x = [make_tensor(s, 2, torch.Generator().manual_seed(0))
                 for s in m["inputs"]]
            if len(x) == 1:
                sel = output_selector(scripted, model, x[0])
        m["loss_spec"] = (m["loss"].replace("cross_entropy:",
                                            f"cross_entropy{sel}:", 1)
                          if sel else m["loss"])
        del model, scripted
    except Exception as e:
        return [dict(head, ok=False, error="script: " + "".join(
            traceback.format_exception_only(type(e), e)).strip()[-500:])]
    head["loss"] = m["loss_spec"]
    flags = m.get("worker_flags", [])
    if flags:
        head["worker_flags"] = flags
    rc, out, err = run([worker, "profile", base + ".pt"] +
                       worker_args(m, args.device, flags, args.optimizer) +
                       ["--output", "json"])
    if rc != 0 or not out.strip().startswith("{"):
        return [dict(head, ok=False, error="profile: " + one_line(err, rc))]
    with open(base + ".profile.json", "w") as f:
        f.write(out)
    rc, out, err = run([cli, "plan", base + ".profile.json", "--budget", "1B",
                        "--output", "json"])
    try:
        probe = json.loads(out)
        floor = int(probe["floor_bytes"])
        baseline = int(probe["baseline_peak_bytes"])
    except (ValueError, KeyError):
        return [dict(head, ok=False, error="plan: " + one_line(err, rc))]
    head.update(floor_bytes=floor, baseline_predicted_bytes=baseline)
    points = []
    for i, f in enumerate(float(v) for v in args.fractions.split(",")):
        budget = int(max(floor * 1.0005 + 1,
                         floor + f * max(0, baseline - floor)))
        p = dict(head, fraction=f, budget_bytes=budget)
        sched = f"{base}.{budget}B.schedule.json"
        rc, out, err = run([cli, "plan", base + ".profile.json", "--budget",
                            f"{budget}B", "--output", "json"])
        if rc != 0 or not out.strip().startswith("{"):
            p.update(error="plan: " + one_line(err, rc))
            points.append(judge(p, args.time_bar, args.cuda))
            continue
        with open(sched, "w") as fh:
            fh.write(out)
        s = json.loads(out)
        p.update(feasible=bool(s.get("feasible", False)),
                 predicted_peak_bytes=int(s.get("predicted_peak_bytes", 0)),
                 predicted_step_ms=s.get("predicted_iteration_ms"),
                 decisions_recompute=sum(1 for d in s.get("decisions", [])
                                         if d.get("action") == "RECOMPUTE"),
                 decisions_swap=sum(1 for d in s.get("decisions", [])
                                    if d.get("action") == "SWAP"))
        cmd = [worker, "execute", base + ".pt", "--schedule", sched] + \
            worker_args(m, args.device, flags, args.optimizer) + \
            ["--iterations", str(args.iterations), "--output", "json"]
        if i > 0:
            cmd.append("--baseline=false")
        rc, out, err = run(cmd)
        try:
            v = json.loads(out)
            p.update(worker_exit=rc,
                     worker_peak_bytes=int(v["scheduled"]["peak_bytes"]),
                     worker_step_ms=round(v["scheduled"]["iteration_ms"], 3))
            if i == 0 and v.get("baseline"):
                p.update(
                    worker_baseline_peak_bytes=int(v["baseline"]["peak_bytes"]),
                    worker_baseline_step_ms=round(
                        v["baseline"]["iteration_ms"], 3),
                    worker_gradients_match=v.get("gradients_match"))
        except (ValueError, KeyError, TypeError):
            p["worker_error"] = "execute: " + one_line(err, rc)
        c = run_child(args, m, sched, eager=(i == 0), log=log)
        for k, val in c.items():
            if k in ("model", "schedule"):
                continue
            p["apply_" + k] = val
        points.append(judge(p, args.time_bar, args.cuda))
    for p in points:
        p["model_s"] = round(time.time() - t0, 1)
    return points


def summarize(points, models_wanted, time_bar, cuda, extra=None):
    fams = sorted({p["model"] for p in points if p.get("source") == "zoo"})
    tv = sorted({p["model"] for p in points
                 if p.get("source") == "torchvision"})
    s = {"summary": True, "points": len(points),
         "models": len({p["model"] for p in points}),
         "zoo_models": fams, "torchvision_models": len(tv),
         "errors": sum(1 for p in points if p.get("error") or
                       p.get("apply_error") or p.get("worker_error")),
         "gradients_equal": sum(1 for p in points if p.get("gradients_equal")),
         "all_applied": sum(1 for p in points if p.get("all_applied")),
         "time_bar": time_bar}
    if cuda:
        s.update(
            within_budget=sum(1 for p in points if p.get("within_budget")),
            time_within=sum(1 for p in points if p.get("time_within")),
            time_failing=sorted(
                f"{p['model']}@{p.get('fraction')}: "
                f"{p.get('time_ratio', 'n/a')}"
                for p in points if not p.get("time_within")))
    n = len(points)
    s["bars"] = {
        "memory_grads_applied": n > 0 and all(
            p.get("ok_memory_grads_applied") for p in points),
        "time_within": (n > 0 and all(p.get("time_within") for p in points))
        if cuda else None,
        "coverage": len(fams) >= 5 and len(tv) >= 20 and all(
            sum(1 for p in points if p["model"] == mm) >= 2
            for mm in fams + tv),
    }
    s["failing"] = sorted({p["model"] for p in points if not p.get("ok")})
    s["green"] = all(v for v in s["bars"].values() if v is not None)
    if extra:
        s.update(extra)
    return s


def merge(args):
    points, meta = [], {}
    for d in args.merge:
        if not os.path.exists(os.path.join(d, "points.jsonl")):
            continue
        with open(os.path.join(d, "points.jsonl")) as f:
            points += [json.loads(l) for l in f if l.strip()]
        try:
            with open(os.path.join(d, "summary.json")) as f:
                sm = json.load(f)
        except OSError:  # a shard still running
            sm = {"shard": d, "seconds": None}
        meta.setdefault("shards", []).append(
            {k: sm.get(k) for k in ("device", "shard", "seconds", "torch",
                                    "cuda_visible_devices")})
    cuda = any(p.get("apply_peak_bytes") for p in points)
    s = summarize(points, None, args.time_bar, cuda, meta)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "points.jsonl"), "w") as f:
        for p in points:
            f.write(json.dumps(p, separators=(",", ":")) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(points))
    print(json.dumps(s))
    return 0 if s["green"] or args.no_fail else 1


def gb(b):
    return "" if b is None else f"{b / 1e9:.2f}"


def table(points):
    rows = ["| model | batch | f | budget GB | R/S | worker peak GB | worker ms"
            " | apply peak GB | apply ms | apply/worker | grads equal "
            "(max diff/scale) | applied | eager peak GB / ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
            "--- | --- | --- |"]
    for p in points:
        if p.get("error") and "budget_bytes" not in p:
            rows.append(f"| {p['model']} | {p.get('batch', '')} | | | | | | "
                        f"| | | | | {p['error'][:120]} |")
            continue
        d, s = p.get("apply_grad_max_abs_diff"), p.get("apply_grad_scale")
        gr = ("yes" if p.get("gradients_equal") else "NO") + (
            f" ({d / s:.1e})" if d is not None and s else "")
        ap = ("yes" if p.get("all_applied") else "NO") + (
            f" ({p.get('apply_unmatched')} unmatched)"
            if p.get("apply_unmatched") else "")
        if p.get("apply_error"):
            ap += " " + p["apply_error"][:80]
        eg = (f"{gb(p.get('apply_eager_peak_bytes'))} / "
              f"{p.get('apply_eager_step_ms', 0):.1f}"
              if p.get("apply_eager_step_ms") is not None else "")
        wms = p.get("worker_step_ms")
        ams = p.get("apply_step_ms")
        peak_mark = "" if p.get("within_budget") is not False else " (over)"
        rows.append(
            f"| {p['model']} | {p.get('batch')} | {p.get('fraction')} | "
            f"{gb(p.get('budget_bytes'))} | {p.get('decisions_recompute', '')}"
            f"/{p.get('decisions_swap', '')} | {gb(p.get('worker_peak_bytes'))}"
            f" | {'' if wms is None else f'{wms:.1f}'} | "
            f"{gb(p.get('apply_peak_bytes'))}{peak_mark} | "
            f"{'' if ams is None else f'{ams:.1f}'} | "
            f"{p.get('time_ratio', '')} | {gr} | {ap} | {eg} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--ab", action="store_true",
                    help="interleaved step times of one schedule (--model, "
                    "--schedule): eager, applied, and applied with "
                    "--before's _apply.py")
    ap.add_argument("--before", default="",
                    help="--ab: path of another revision's _apply.py")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--probe", action="store_true",
                    help="peak per phase and variant of one model "
                    "(--model, optional --schedule)")
    ap.add_argument("--merge", nargs="*")
    ap.add_argument("--model")
    ap.add_argument("--schedule", default="")
    ap.add_argument("--loss-spec", default="")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--bin")
    ap.add_argument("--out")
    ap.add_argument("--models", default="", help="comma-separated names")
    ap.add_argument("--shard", default="", help="K/N: every N-th model "
                    "from the K-th (0-based) of the selected list")
    ap.add_argument("--tier", default="gpu", choices=["gpu", "cpu"],
                    help="cpu: the CPU-tier sizes of the zoo families and "
                    "64 px torchvision inputs (the smoke test)")
    ap.add_argument("--batch", type=int, default=0,
                    help="override every model's batch")
    ap.add_argument("--fractions", default="0.1,0.5")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--optimizer", default="adam:foreach",
                    help="the step's optimizer, planned (mutwo-worker "
                    "--optimizer) and run (torch.optim, as `mutwo verify` "
                    "makes it); adam:foreach is torch.optim.Adam's default "
                    "on CUDA")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--time-bar", type=float, default=DEFAULT_TIME_BAR)
    ap.add_argument("--specialize", default="",
                    help="models profiled and executed with "
                    "--specialize_control_flow (comma-separated)")
    ap.add_argument("--no-fail", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.trace:
        return trace(args)
    if args.ab:
        return ab(args)
    if args.probe:
        return probe(args)
    if args.merge:
        return merge(args)
    import torch
    args.cuda = args.device.startswith("cuda")
    wanted = [n for n in args.models.split(",") if n]
    models = [m for m in suite(args.tier)
              if not wanted or m["name"] in wanted]
    if wanted and len(models) != len(wanted):
        known = {m["name"] for m in suite(args.tier)}
        raise SystemExit(f"unknown models: {set(wanted) - known}")
    if args.shard:
        k, n = (int(v) for v in args.shard.split("/"))
        models = models[k::n]
    for m in models:
        if args.batch:
            m["batch"] = args.batch
        if m["name"] in args.specialize.split(","):
            m["worker_flags"] = ["--specialize_control_flow"]
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "children.log"), "a")
    t0 = time.time()
    meta = {"device": (torch.cuda.get_device_name(0) if args.cuda else "cpu"),
            "torch": torch.__version__, "shard": args.shard,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "command": " ".join([os.path.relpath(__file__, ROOT)] +
                                sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    points = []
    pf = open(os.path.join(args.out, "points.jsonl"), "w")
    for m in models:
        for p in run_model(m, args, log):
            p.setdefault("ok", False)
            points.append(p)
            line = json.dumps(p, separators=(",", ":"))
            pf.write(line + "\n")
            pf.flush()
            print(line, flush=True)
    meta["seconds"] = round(time.time() - t0, 1)
    s = summarize(points, wanted, args.time_bar, args.cuda, meta)
    if args.shard or wanted:  # a part: coverage is judged at the merge
        s["bars"]["coverage"] = None
        s["green"] = all(v for v in s["bars"].values() if v is not None)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(points))
    print(json.dumps(s), flush=True)
    return 0 if s["green"] or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
