#!/usr/bin/env python3
"""The CPU "apply tier": real schedules, applied to the eager
models they were planned for, every decision applied and the saving real.

For each model (the zoo's own families, bench/zoo/models.py, at their CPU
tier sizes; a sample of small torchvision models; the issue's ViT and
ConvNeXt-style models): the eager module is scripted, profiled
(`mutwo-worker profile --device cpu --output json`) and planned
(`mutwo plan --budget 50%`, half way from the floor to the baseline
peak, at the floor, and at the floor of the profile with a modeled 1 GB/s
host link, so that the schedule swaps too) and each schedule is applied
with `mutwo.apply(model, schedule)` (strict: every RECOMPUTE/SWAP decision
must match a tensor autograd saves) in a plain eager step. Bars per point:

  applied   no ScheduleMismatchError: every decision applied;
  gradients the applied step's gradients equal the unmodified eager step's
            (same seed, fp32): max |diff| <= 1e-5 x max |gradient|;
  saving    the saved-tensor bytes held at the end of forward, counted the
            same way for both runs (storages of the tensors autograd saved,
            once each; parameters and inputs excluded), unmodified minus
            applied, is at least 90% of the planned saving (the RECOMPUTE
            and SWAP decisions' size_bytes);
  later     two more steps (where recompute frames stop counting saves
            past their last dropped one, then where apply's saved-tensor
            hook is on only where needed) drop, swap and replay as many
            tensors as the first, with gradients equal as above;
  matched   after those steps `report()` has no note that a module's
            forward made its ops of a kind other than one for one with
            the decisions on them (apply would take the strongest
            decision for all of them from the next forward);
  peak      (--peaks 1, the default) the applied step's peak with the
            planned optimizer, measured as `mutwo verify` measures a CPU
            step, is at most 2% + 64 KiB over the peak `mutwo-worker
            execute --device cpu` measures for the same schedule (a
            swap's host copy is outside both counts): what apply holds
            beyond the plan shows here, where the saving at the end of
            forward does not (a replay's second copy of a swapped input,
            an attention re-run for a result the frame held, a frame
            kept alive by a reference cycle).

A budget below the floor gives an infeasible schedule (`mutwo plan` exit
3): the bar is that apply refuses it (InfeasibleScheduleError) before any
step. Prints one JSON line per point and a summary line; exits 1 when a
bar fails.

    apply_zoo_cpu.py --bin build/bin [--models gpt,resnet18] [--out DIR]
"""
import argparse
import copy
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "bench", "zoo"))
# The models as users write them, shared with the apply tests.
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

import mutwo  # noqa: E402
import models as zoo  # noqa: E402  (bench/zoo/models.py)
from user_models import ConvNext, Vit  # noqa: E402
from run_zoo import emulate_link  # noqa: E402
from byte_times import times_from_bytes  # noqa: E402

SAVING_BAR = 0.9
# apply's step peak on the CPU against the worker's of the same schedule:
# at most this much over it (the two count what a step holds the same way
# to within the worker's own small allocations).
PEAK_RTOL = 0.02
PEAK_SLACK_BYTES = 64 << 10
GRAD_RTOL = 1e-5


def tiny_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                             num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10)


def tv(name: str, **kw):
    return lambda: getattr(torchvision.models, name)(num_classes=10, **kw)


def image_model(name, build, size=32, batch=2):
    return dict(name=name, build=build,
                inputs=[f"x:float32[B,3,{size},{size}]"],
                loss="cross_entropy:y:int64[B]{0,10}", batch=batch)


def suite():
    out = [dict(m) for m in zoo.repo_models("cpu")]
    out += [
        # Inputs large enough that activations, not parameters and their
        # gradients, make the peak: at batch 2 and 32 px the floor of these
        # is their baseline and the planner decides nothing.
        image_model("resnet18", tv("resnet18"), size=64, batch=8),
        image_model("mobilenet_v3_small", tv("mobilenet_v3_small"), size=64,
                    batch=8),
        image_model("efficientnet_b0", tv("efficientnet_b0"), size=64,
                    batch=4),
        image_model("convnext_tiny", tv("convnext_tiny"), size=64, batch=4),
        image_model("vit_tiny", tiny_vit, batch=16),
        # Not in the default run (--models resnet50): replay timing.
        dict(image_model("resnet50", tv("resnet50"), size=64, batch=4),
             default=False),
        # More of the GPU apply zoo's torchvision models (64 px).
        *[image_model(name, tv(name, **kw), size=64, batch=batch)
          for name, batch, kw in [
              ("densenet121", 4, {}), ("squeezenet1_1", 8, {}),
              ("mnasnet1_0", 8, {}), ("shufflenet_v2_x1_0", 8, {}),
              ("regnet_y_400mf", 8, {}), ("resnext50_32x4d", 4, {}),
              ("swin_t", 4, {}),
              ("googlenet", 8, {"aux_logits": False,
                                "init_weights": True}),
              ("mobilenet_v3_large", 8, {}), ("mobilenet_v2", 8, {}),
              ("efficientnet_b1", 4, {})]],
        # Not in the default run: VGG-11's plans decide nothing at this
        # size.
        dict(image_model("vgg11_bn", tv("vgg11_bn"), size=64, batch=4),
             default=False),
        # The worker passes every forward argument: the Optional mask is
        # an additive [T, T] float mask, no batch dimension.
        dict(image_model("user_vit", functools.partial(Vit, d=64), batch=8),
             inputs=["x:float32[B,3,32,32]", "mask:float32[64,64]"],
             unbatched=["mask"]),
        image_model("timm_convnext",
                    functools.partial(ConvNext, d=32, layer_scale=0.1),
                    size=64),
    ]
    return out


_SPEC = re.compile(r"^(\w+):(\w+)\[([^\]]*)\](?:\{(-?\d+),(-?\d+)\})?$")


def make_tensor(spec: str, batch: int, gen: torch.Generator) -> torch.Tensor:
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"input spec {spec!r}")
    _, dtype, dims, lo, hi = m.groups()
    shape = [batch if d.strip() == "B" else int(d) for d in dims.split(",")]
    if dtype.startswith("int"):
        return torch.randint(int(lo or 0), int(hi or 2), shape,
                             generator=gen, dtype=getattr(torch, dtype))
    return torch.randn(shape, generator=gen, dtype=getattr(torch, dtype))


def make_loss(spec: str, batch: int, gen: torch.Generator):
    if spec == "mean":
        return lambda out: out.float().mean()
    if spec.startswith("cross_entropy:"):
        y = make_tensor(spec.split(":", 1)[1], batch, gen)

        def ce(out):
            # Classes last ([B, T, V] against [B, T]: a language model) or
            # second ([B, C] against [B]; [B, C, H, W] against [B, H, W]).
            if out.dim() > 2 and tuple(out.shape[:-1]) == tuple(y.shape):
                return F.cross_entropy(out.reshape(-1, out.shape[-1]),
                                       y.reshape(-1))
            return F.cross_entropy(out, y)
        return ce
    raise ValueError(f"loss {spec!r}")


def load_apply_file(path, name="mutwo._apply_before"):
    """An _apply.py file (another revision's), imported as its own module
    beside the package: it imports the rest of the package absolutely, so
    it runs against this tree's. For before/after comparisons."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run(cmd, timeout=300):
    """A mutwo or mutwo-worker command, the worker with this process's
    intra-op threads (same_threads_env): the profile it plans from and the
    peak it executes at are those of the step apply runs here."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=same_threads_env())
    return p.returncode, p.stdout, p.stderr


def same_threads_env():
    """The environment for a worker whose CPU peak is compared with this
    process's: as many intra-op threads as PyTorch uses here. CPU kernels
    keep buffers per thread (batch norm's backward, depthwise
    convolutions): ShuffleNetV2 at 64 px, batch 8 peaks 0.94 MB higher
    with 2 threads than with 1, eager and in the worker alike."""
    return dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))


def step(model, inputs, loss_fn, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss_fn(model(*inputs)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def storage_key(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def storage_bytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().nbytes()


def unmodified_saved_bytes(model, inputs, loss_fn, seed=7):
    """The unmodified step's saved-tensor bytes at the end of forward,
    counted as mutwo.apply counts them: storages of the tensors autograd
    saves, once each, parameters, buffers, inputs and views of them
    excluded."""
    alive = {storage_key(t) for t in list(model.parameters()) +
             list(model.buffers()) + list(inputs)}
    saved = {}

    def pack(t):
        base = t._base if t._base is not None else t
        if t.numel() and not (base.grad_fn is None and (
                base.requires_grad or storage_key(t) in alive)):
            saved[storage_key(t)] = storage_bytes(t)
        return t

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    total = sum(saved.values())
    loss_fn(out).backward()
    model.zero_grad(set_to_none=True)
    return total


def median_step_ms(model, inputs, loss_fn, steps):
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        t = time.perf_counter()
        step(model, inputs, loss_fn)
        times.append((time.perf_counter() - t) * 1e3)
    return round(sorted(times[1:])[len(times[1:]) // 2], 2)


def worker_peak(bin_dir, model_path, schedule_path):
    """The worker's scheduled-step peak of the schedule on the CPU
    (`mutwo-worker execute --baseline=false`, one warm-up and one measured
    step): (peak bytes or None, error)."""
    rc, out, err = run([os.path.join(bin_dir, "mutwo-worker"), "execute",
                        model_path, "--schedule", schedule_path, "--device",
                        "cpu", "--warmup", "1", "--iterations", "1",
                        "--baseline=false", "--output", "json"])
    try:
        return int(json.loads(out)["scheduled"]["peak_bytes"]), ""
    except (ValueError, KeyError, TypeError):
        return None, f"execute exit {rc}: " + err.strip()[-400:]


def apply_peak(model, inputs, loss_fn, schedule):
    """The applied step's peak on the CPU as `mutwo verify` measures it
    (cpu_step_peak_bytes: what is held when the step starts plus the CPU
    allocator's highest count over one step), with the optimizer the
    schedule was planned with, after two steps that make its state."""
    from mutwo._verify import _optimizer_text, cpu_step_peak_bytes
    from mutwo._verify import make_optimizer
    planned = schedule.proto
    opt = make_optimizer(_optimizer_text(planned.optimizer)
                         if planned.HasField("optimizer") else "sgd",
                         model.parameters())

    def full_step():
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss_fn(model(*inputs)).backward()
        opt.step()
    for _ in range(2):
        full_step()
    return cpu_step_peak_bytes(full_step, model, opt, inputs)


def apply_point(m, schedule_path, point, time_steps=0, model_path="",
                bin_dir=""):
    torch.manual_seed(0)
    model = m["build"]().train()
    plain = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    inputs = [make_tensor(s, m["batch"], gen) for s in m["inputs"]]
    loss_fn = make_loss(m["loss"], m["batch"], gen)
    schedule = mutwo.Schedule.from_json(schedule_path)
    point.update(recompute=len(schedule.recomputed),
                 swap=len(schedule.swapped))
    if not schedule.feasible:
        try:
            mutwo.apply(model, schedule)
        except mutwo.InfeasibleScheduleError:
            point.update(refused_infeasible=True, ok=True)
            return
        point.update(refused_infeasible=False, ok=False,
                     error="an infeasible schedule was applied")
        return
    unmodified = unmodified_saved_bytes(plain, inputs, loss_fn)
    applied = mutwo.apply(model, schedule)  # strict
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g_applied = step(model, inputs, loss_fn)
    except mutwo.ScheduleMismatchError as e:
        point.update(applied_all=False, ok=False, error=str(e)[:800],
                     unapplied=[f"{d.action} {d.module_path} {d.op_kind}"
                                for d in e.decisions])
        return
    point["apply_step_s"] = round(time.perf_counter() - t0, 3)
    # Two more steps: the first learned where recompute frames stop
    # counting saves, the second where apply's saved-tensor hook is needed
    # with them; from the third on it is on only there. Same decisions
    # applied (dropped, swapped, replayed), same gradients, every step.
    def counts(s):
        return (s.dropped, s.swapped_out, s.swapped_in,
                sum(s.replays.values()))
    first_counts = counts(applied.stats())
    later = []
    for _ in range(2):
        applied.reset_stats()
        g = step(model, inputs, loss_fn)
        later.append((g, counts(applied.stats())))
    g_plain = step(plain, inputs, loss_fn)
    scale = max(g.abs().max().item() for g in g_plain.values())

    def max_diff(g):
        return max((g_plain[n] - g[n]).abs().max().item()
                   for n in g_plain) if set(g_plain) == set(g) else None
    diff = max_diff(g_applied)
    later_diffs = [max_diff(g) for g, _ in later]
    later_ok = all(d is not None and d <= GRAD_RTOL * scale and c ==
                   first_counts for d, (_, c) in zip(later_diffs, later))
    point.update(later_step_counts=[list(c) for _, c in later],
                 first_step_counts=list(first_counts),
                 later_step_grad_max_abs_diff=later_diffs,
                 later_steps_ok=later_ok)
    # A forward that did not match its per-op decisions one for one: the
    # strongest decision applies to all of that kind from the next step.
    fallbacks = [line.strip() for line in applied.report().splitlines()
                 if "the strongest of them applies" in line]
    point.update(fallback_notes=fallbacks)
    meas = applied.measurements()
    peak_ok = True
    if bin_dir:
        # The step's peak against the worker's of the same schedule, both
        # on the CPU (a swap's host copy is outside both counts).
        wpeak, werr = worker_peak(bin_dir, model_path, schedule_path)
        apeak = apply_peak(model, inputs, loss_fn, schedule)
        limit = None if wpeak is None else \
            wpeak * (1 + PEAK_RTOL) + PEAK_SLACK_BYTES
        peak_ok = limit is not None and apeak <= limit
        point.update(apply_peak_bytes=apeak, worker_peak_bytes=wpeak,
                     peak_ratio=None if not wpeak else
                     round(apeak / wpeak, 4), peak_ok=peak_ok,
                     **({"worker_error": werr} if werr else {}))
    planned = meas.planned_saving_bytes
    saving = unmodified - meas.saved_bytes
    ratio = saving / planned if planned > 0 else None
    gradients_ok = diff is not None and diff <= GRAD_RTOL * scale
    saving_ok = ratio is None or ratio >= SAVING_BAR
    point.update(
        applied_all=True, grad_max_abs_diff=diff, grad_scale=scale,
        gradients_ok=gradients_ok,
        unmodified_saved_bytes=unmodified,
        apply_unmodified_saved_bytes=meas.unmodified_saved_bytes,
        saved_bytes=meas.saved_bytes, planned_saving_bytes=planned,
        measured_saving_bytes=saving,
        saving_ratio=None if ratio is None else round(ratio, 4),
        saving_ok=saving_ok, frames=len(applied.frames),
        replays=sum(applied.stats().replays.values()),
        budget_warnings=[str(w.message)[:300] for w in caught
                         if issubclass(w.category, mutwo.BudgetWarning)],
        ok=gradients_ok and saving_ok and later_ok and peak_ok and
        not fallbacks)
    if time_steps:
        # Median step (forward, loss, backward) of the unmodified model, the
        # applied one, and the applied one whose replays run every module
        # call of their frame from its start (skip_retained=False).
        point["plain_step_ms"] = median_step_ms(plain, inputs, loss_fn,
                                                time_steps)
        point["apply_step_ms"] = median_step_ms(model, inputs, loss_fn,
                                                time_steps)
        point["skipped_calls"] = applied.stats().skipped
        applied.remove()
        mutwo.apply(model, schedule, skip_retained=False)
        point["apply_noskip_step_ms"] = median_step_ms(model, inputs, loss_fn,
                                                       time_steps)


def profile_flags(m):
    """The `mutwo-worker profile` flags of a suite model on the CPU: its
    inputs, unbatched inputs, loss and batch, one warm-up and one timed
    step."""
    spec = []
    for i in m["inputs"]:
        spec += ["--input", i]
    for u in m.get("unbatched", []):
        spec += ["--unbatched", u]
    return spec + ["--loss", m["loss"], "--batch", str(m["batch"]),
                   "--device", "cpu", "--warmup", "1", "--iterations", "1"]


def probe_floor(cli, profile_path):
    """(floor, baseline peak) in bytes that `mutwo plan` finds for a
    profile; ValueError naming what went wrong."""
    rc, out, err = run([cli, "plan", profile_path, "--budget", "1B",
                        "--output", "json"])
    try:
        probe = json.loads(out)
        return int(probe["floor_bytes"]), int(probe["baseline_peak_bytes"])
    except (ValueError, KeyError):
        raise ValueError("plan: " + err.strip()[-800:])


def run_model(m, args, work):
    name = m["name"]
    base = os.path.join(work, name)
    torch.manual_seed(0)
    t0 = time.time()
    torch.jit.script(m["build"]().train()).save(base + ".pt")
    spec = profile_flags(m)
    rc, out, err = run([os.path.join(args.bin, "mutwo-worker"), "profile",
                        base + ".pt"] + spec + ["--output", "json"])
    if rc != 0:
        return [dict(model=name, ok=False,
                     error="profile: " + err.strip()[-800:])]
    if args.times != "measured":
        # Plans from times computed from the profile's bytes: the same
        # schedules on every machine (bench/zoo/byte_times.py).
        seed = int(args.times[5:]) if args.times.startswith("seed:") \
            else None
        out = json.dumps(times_from_bytes(json.loads(out), seed))
    with open(base + ".profile.json", "w") as f:
        f.write(out)
    cli = os.path.join(args.bin, "mutwo")
    try:
        floor, baseline = probe_floor(cli, base + ".profile.json")
    except ValueError as e:
        return [dict(model=name, ok=False, error=str(e))]
    # The same profile with a modeled 1 GB/s host link (a CPU profile offers
    # no swaps; run_zoo's zoo_cpu_swap does the same): SWAP decisions too,
    # at that profile's own floor, which can be higher (the planner's
    # lowest peak with swaps offered: convnext_tiny 226.92 MiB, 226.08
    # without; at the other floor that point was only a refusal).
    profile = json.loads(open(base + ".profile.json").read())
    emulate_link(profile, 1e9)
    with open(base + ".link.profile.json", "w") as f:
        json.dump(profile, f)
    try:
        link_floor, _ = probe_floor(cli, base + ".link.profile.json")
    except ValueError as e:
        return [dict(model=name, ok=False, error=str(e))]
    points = []
    # 50% (below the floor of most CPU-tier models: refused), half way
    # from the floor to the baseline, and the floor.
    budgets = [("50%", "50%", floor),
               ("mid", f"{int(floor + 0.5 * max(0, baseline - floor)) + 1}B",
                floor),
               ("floor", f"{int(floor * 1.0005) + 1}B", floor),
               ("floor+link", f"{int(link_floor * 1.0005) + 1}B", link_floor)]
    for label, budget, its_floor in budgets:
        if label not in args.budgets.split(","):
            continue
        point = dict(model=name, budget=label, floor_bytes=its_floor,
                     baseline_peak_bytes=baseline)
        path = f"{base}.{label.strip('%')}.schedule.json"
        prof = base + (".link" if "link" in label else "") + ".profile.json"
        rc, out, err = run([cli, "plan", prof, "--budget", budget, "--output",
                            "json"])
        if rc not in (0, 3) or not out.strip().startswith("{"):
            point.update(ok=False, error="plan: " + err.strip()[-800:])
            points.append(point)
            continue
        with open(path, "w") as f:
            f.write(out)
        s = json.loads(out)
        point.update(budget_bytes=int(s.get("budget_bytes", 0)),
                     feasible=bool(s.get("feasible", False)),
                     predicted_peak_bytes=int(s.get("predicted_peak_bytes",
                                                    0)))
        try:
            apply_point(m, path, point, args.time_steps, base + ".pt",
                        args.bin if args.peaks else "")
        except Exception as e:  # a crash is a failed bar, with its reason
            point.update(ok=False, error="apply: " + "".join(
                traceback.format_exception_only(type(e), e)).strip()[-800:])
        points.append(point)
    for p in points:
        p["model_s"] = round(time.time() - t0, 2)
    return points


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True,
                    help="folder with mutwo-worker and mutwo")
    ap.add_argument("--models", default="",
                    help="comma-separated names (default: all)")
    ap.add_argument("--out", default="", help="keep the work files here")
    ap.add_argument("--budgets", default="50%,mid,floor,floor+link",
                    help="which of the budget points to run")
    ap.add_argument("--time-steps", type=int, default=0,
                    help="also time this many steps: unmodified, applied, "
                    "applied without skipping held calls in replays")
    ap.add_argument("--times", default="bytes",
                    help="the times schedules are planned from: bytes "
                    "(computed from the profile's memory figures: the same "
                    "schedules on every machine), measured (the profile's "
                    "own), or seed:N (bytes, each op scaled by a seeded "
                    "random factor: other schedules, reproducibly)")
    ap.add_argument("--peaks", type=int, default=1,
                    help="1: also the step's peak against the worker's "
                    "(the peak bar); 0: not")
    args = ap.parse_args()
    if not re.fullmatch(r"bytes|measured|seed:[0-9]+", args.times):
        ap.error(f"--times {args.times!r}: bytes, measured or seed:N")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    wanted = [n for n in args.models.split(",") if n]
    models = [m for m in suite() if m["name"] in wanted or
              (not wanted and m.get("default", True))]
    work = args.out or tempfile.mkdtemp(prefix="apply_zoo_cpu_")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    failed = []
    points = 0
    for m in models:
        for p in run_model(m, args, work):
            points += 1
            if not p.get("ok", False):
                failed.append(failure(p))
            print(json.dumps(p, separators=(",", ":")), flush=True)
    # The failures again last: a CI log keeps only the end of the output.
    print(json.dumps({"summary": True, "points": points,
                      "failed": len(failed), "failures": failed,
                      "seconds": round(time.time() - t0, 1),
                      "torch": torch.__version__,
                      "threads": torch.get_num_threads()}), flush=True)
    return 1 if failed or not points else 0


def failure(p):
    """A failed point in a few words: which bars it missed, with figures."""
    why = [f"{bar}" for bar in ("gradients_ok", "saving_ok",
                                "later_steps_ok", "applied_all")
           if p.get(bar) is False]
    if p.get("peak_ok") is False:
        why.append(f"peak {p.get('apply_peak_bytes')} B vs worker "
                   f"{p.get('worker_peak_bytes')} B "
                   f"(x{p.get('peak_ratio')})")
    if p.get("saving_ok") is False:
        why.append(f"saving ratio {p.get('saving_ratio')}")
    if p.get("fallback_notes"):
        why.append("fallbacks: " + "; ".join(p["fallback_notes"])[:300])
    if p.get("error"):
        why.append(str(p["error"])[:300])
    return {"model": p.get("model"), "budget": p.get("budget"),
            "why": why}


if __name__ == "__main__":
    sys.exit(main())
