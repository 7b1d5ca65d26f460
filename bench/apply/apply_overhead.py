#!/usr/bin/env python3
"""mutwo.apply's own host cost per training step, on the CPU where Python
overhead is visible (tiny batch and image size: the ops are cheap, so the
hooks' per-module-call and per-saved-tensor work is what differs).

For each model, three steps are timed, interleaved (eager, applied with an
empty schedule, applied with the worker's schedule at each budget, then
again, ...) so that drift on a shared machine falls on all alike; each is
the median over --steps steps. Schedules come from the worker as in
apply_zoo_cpu.py (`mutwo-worker profile` + `mutwo plan` half way from the
floor to the baseline peak, "mid", and at the floor, "low").

One JSON line per (model, variant) on stdout:
  {"model", "variant": "empty"|"mid"|"low", "decisions", "module_calls",
   "saved_tensors", "eager_ms", "applied_ms", "ratio",
   "overhead_us_per_call", "replay_ms", "host_us_per_call",
   "overhead_us_per_decision", "modules", "hooked_modules"}
hooked_modules: modules carrying one of apply's forward pre-hooks or more
(the attribution hooks, a range frame's opening hook).
overhead_us_per_call: (applied - eager) / module calls in one forward.
replay_ms: time inside the frames' replays per step (the recomputation
the schedule plans, outermost replays); host_us_per_call: the rest of
the overhead, (applied - eager - replay) / module calls: apply's own
hooks and bookkeeping.
`--before REV` adds, interleaved in the same rounds, the same variants
under _apply.py as it was at git revision REV ("impl": "before"; the
working tree's is "after"): a before/after comparison in one run.

    apply_overhead.py --bin build/bin [--models resnet18,gpt] [--steps 21]
    apply_overhead.py --bin build/bin --before 032230c
    apply_overhead.py --bin build/bin --profile resnet18:low  # cProfile
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import apply_zoo_cpu as azc  # noqa: E402  (schedules, inputs, losses)
import mutwo  # noqa: E402
import models as zoo  # noqa: E402  (bench/zoo/models.py)


def suite():
    tv = azc.tv
    img = azc.image_model
    # Tiny inputs: the ops are cheap and host work dominates, as for a GPU
    # step at the zoo's batch sizes. Large enough that the planner decides
    # something between the floor and the baseline.
    out = [img("resnet18", tv("resnet18"), size=16, batch=2),
           img("squeezenet1_1", tv("squeezenet1_1"), size=64, batch=2),
           img("mobilenet_v2", tv("mobilenet_v2"), size=32, batch=2)]
    # Only with --models NAME: the GPU apply zoo's slowest ratios to the
    # worker (frames spanning a model's own forward, many small frames).
    out += [dict(img("resnet50", tv("resnet50"), size=64, batch=4),
                 default=False),
            dict(img("googlenet", tv("googlenet", aux_logits=False,
                                     init_weights=False), size=64, batch=2),
                 default=False),
            dict(img("densenet121", tv("densenet121"), size=32, batch=2),
                 default=False)]
    repo = {m["name"]: m for m in zoo.repo_models("cpu")}
    for name in ("gpt", "transformer"):
        for key, m in repo.items():
            if key.startswith(name):
                out.append(dict(m))
                break
    return out


def module_calls_and_saves(model, inputs, loss_fn):
    calls = [0]
    saves = [0]

    def hook(*_):
        calls[0] += 1
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()]

    def pack(t):
        saves[0] += 1
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    loss_fn(out).backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    return calls[0], saves[0]


def make_schedules(m, bin_dir, work):
    """{label: schedule path}: the worker's schedules at the mid and low
    budgets (those the planner finds feasible)."""
    base = os.path.join(work, m["name"])
    torch.manual_seed(0)
    torch.jit.script(m["build"]().train()).save(base + ".pt")
    spec = azc.profile_flags(m)
    rc, out, err = azc.run([os.path.join(bin_dir, "mutwo-worker"), "profile",
                            base + ".pt"] + spec + ["--output", "json"])
    if rc != 0:
        raise RuntimeError("profile: " + err.strip()[-400:])
    with open(base + ".profile.json", "w") as f:
        f.write(out)
    cli = os.path.join(bin_dir, "mutwo")
    rc, out, err = azc.run([cli, "plan", base + ".profile.json", "--budget",
                            "1B", "--output", "json"])
    probe = json.loads(out)
    floor = int(probe["floor_bytes"])
    baseline = int(probe["baseline_peak_bytes"])
    out_paths = {}
    for label, budget in (
            ("mid", int(floor + 0.5 * max(0, baseline - floor)) + 1),
            ("low", int(floor * 1.0005) + 1)):
        rc, out, err = azc.run([cli, "plan", base + ".profile.json",
                                "--budget", f"{budget}B", "--output", "json"])
        if rc != 0:
            continue
        path = f"{base}.{label}.schedule.json"
        with open(path, "w") as f:
            f.write(out)
        out_paths[label] = path
    return out_paths


def empty_schedule(path):
    s = json.loads(open(path).read())
    s["decisions"] = []
    return json.dumps(s)


def load_before(rev, work):
    """_apply.py at git revision `rev`, imported as its own module (it
    imports the rest of the package absolutely: the working tree's)."""
    import subprocess
    root = os.path.dirname(os.path.dirname(HERE))
    text = subprocess.run(["git", "-C", root, "show",
                           f"{rev}:client/python/mutwo/_apply.py"],
                          check=True, capture_output=True, text=True).stdout
    path = os.path.join(work, "_apply_before.py")
    with open(path, "w") as f:
        f.write(text)
    return azc.load_apply_file(path)


class ReplayClock:
    """Wall-clock time inside frame replays (the recomputation the
    schedule plans), outermost replays only, so that what apply's hooks
    cost is told apart from the compute the schedule asks for."""

    def __init__(self):
        self.seconds = 0.0
        self.depth = 0

    def patch(self, module):
        replay = module._Frame.replay
        clock = self

        def timed(frame, *args, **kwargs):
            clock.depth += 1
            started = time.perf_counter()
            try:
                return replay(frame, *args, **kwargs)
            finally:
                clock.depth -= 1
                if clock.depth == 0:
                    clock.seconds += time.perf_counter() - started
        module._Frame.replay = timed


CLOCK = ReplayClock()


def bench_model(m, args, work, impls):
    paths = make_schedules(m, args.bin, work)
    if not paths:
        raise RuntimeError("no feasible schedule")
    gen = torch.Generator().manual_seed(1)
    inputs = [azc.make_tensor(s, m["batch"], gen) for s in m["inputs"]]
    loss_fn = azc.make_loss(m["loss"], m["batch"], gen)
    torch.manual_seed(0)
    model = m["build"]().train()
    calls, saves = module_calls_and_saves(model, inputs, loss_fn)
    any_path = next(iter(paths.values()))
    schedules = {"empty": mutwo.Schedule.from_json(empty_schedule(any_path))}
    for label, p in paths.items():
        schedules[label] = mutwo.Schedule.from_json(open(p).read())

    def eager():
        azc.step(model, inputs, loss_fn)

    def applied_step(schedule):
        def run():
            with mutwo.apply(model, schedule):
                azc.step(model, inputs, loss_fn)
        return run

    # One Applied per variant, applied and removed around its steps (apply
    # is a one-off cost per training run, not per step: it is applied once
    # and kept on for the variant's timed steps in each round).
    variants = {("eager", None): None}
    for impl in impls:
        for label, s in schedules.items():
            variants[(label, impl)] = s
    times = {k: [] for k in variants}
    replays = {k: [] for k in variants}
    handles = {}
    hooked = {}
    for k, s in variants.items():
        if s is not None:
            with impls[k[1]](model, s) as a:  # the first step's checks
                azc.step(model, inputs, loss_fn)
                handles[k[0]] = (len(a.schedule.recomputed) +
                                 len(a.schedule.swapped))
                hooked[k] = sum(1 for x in model.modules()
                                if x._forward_pre_hooks)
    rounds = args.steps
    for _ in range(rounds):
        for k, s in variants.items():
            a = impls[k[1]](model, s) if s is not None else None
            if a is not None:
                azc.step(model, inputs, loss_fn)  # first step: checks
            CLOCK.seconds = 0.0
            t = time.perf_counter()
            for _ in range(args.inner):
                azc.step(model, inputs, loss_fn)
            times[k].append((time.perf_counter() - t) / args.inner * 1e3)
            replays[k].append(CLOCK.seconds / args.inner * 1e3)
            if a is not None:
                a.remove()
    eager_ms = statistics.median(times[("eager", None)])
    for k in variants:
        if k[1] is None:
            continue
        applied_ms = statistics.median(times[k])
        over_us = (applied_ms - eager_ms) * 1e3
        replay_ms = statistics.median(replays[k])
        host_us = over_us - replay_ms * 1e3
        decisions = handles[k[0]]
        print(json.dumps(dict(
            model=m["name"], variant=k[0], impl=k[1], decisions=decisions,
            module_calls=calls, saved_tensors=saves,
            modules=sum(1 for _ in model.modules()),
            hooked_modules=hooked[k],
            batch=m["batch"], steps=rounds * args.inner,
            eager_ms=round(eager_ms, 3), applied_ms=round(applied_ms, 3),
            ratio=round(applied_ms / eager_ms, 3),
            overhead_us_per_call=round(over_us / calls, 2),
            replay_ms=round(replay_ms, 3),
            host_us_per_call=round(host_us / calls, 2),
            overhead_us_per_decision=(round(over_us / decisions, 1)
                                      if decisions else None),
            torch=torch.__version__, threads=torch.get_num_threads())),
            flush=True)


def profile(m, label, args, work):
    paths = make_schedules(m, args.bin, work)
    gen = torch.Generator().manual_seed(1)
    inputs = [azc.make_tensor(s, m["batch"], gen) for s in m["inputs"]]
    loss_fn = azc.make_loss(m["loss"], m["batch"], gen)
    model = m["build"]().train()
    s = (mutwo.Schedule.from_json(empty_schedule(next(iter(paths.values()))))
         if label == "empty" else mutwo.Schedule.from_json(
             open(paths[label]).read()))
    with mutwo.apply(model, s):
        # The first steps learn (where frames stop counting saves, then
        # where the saved-tensor hook is needed): not profiled.
        for _ in range(3):
            azc.step(model, inputs, loss_fn)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.steps):
            azc.step(model, inputs, loss_fn)
        pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(25)
    print(buf.getvalue(), file=sys.stderr)
    # Calls of apply's saved-tensor hook per step (pack in forward, unpack
    # in backward: _Runtime's, not a replay's) and of its own functions.
    from mutwo import _apply
    hooks = {name: sum(v[1] for k, v in st.stats.items()
                       if k[0].endswith("_apply.py") and k[2] == name and
                       k[1] == getattr(_apply._Runtime,
                                       name).__code__.co_firstlineno)
             for name in ("pack", "unpack")}
    own = sum(v[1] for k, v in st.stats.items()
              if k[0].endswith("_apply.py"))
    print(json.dumps(dict(
        model=m["name"], variant=label, steps=args.steps,
        pack_calls_per_step=hooks["pack"] / args.steps,
        unpack_calls_per_step=hooks["unpack"] / args.steps,
        apply_calls_per_step=own / args.steps,
        apply_tottime_ms_per_step=round(
            sum(v[2] for k, v in st.stats.items()
                if k[0].endswith("_apply.py")) / args.steps * 1e3, 3))),
        flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True,
                    help="folder with mutwo-worker and mutwo")
    ap.add_argument("--models", default="")
    ap.add_argument("--steps", type=int, default=21,
                    help="rounds: one median sample per variant each")
    ap.add_argument("--inner", type=int, default=3,
                    help="steps per sample (averaged)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before", default="",
                    help="git revision: also time _apply.py as it was there")
    ap.add_argument("--profile", default="",
                    help="MODEL:VARIANT: cProfile its applied steps instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = suite()
    with tempfile.TemporaryDirectory() as work:
        if args.profile:
            name, label = args.profile.split(":")
            m = next(x for x in models if x["name"] == name)
            profile(m, label, args, work)
            return
        from mutwo import _apply
        CLOCK.patch(_apply)
        impls = {"after": mutwo.apply}
        if args.before:
            before = load_before(args.before, work)
            CLOCK.patch(before)
            impls["before"] = before.apply
        wanted = set(filter(None, args.models.split(",")))
        for m in models:
            chosen = (m["name"] in wanted if wanted
                      else m.get("default", True))
            if not chosen:
                continue
            try:
                bench_model(m, args, work, impls)
            except Exception as e:  # one model's failure, said, not fatal
                print(json.dumps(dict(model=m["name"], error=str(e)[-400:])),
                      flush=True)


if __name__ == "__main__":
    main()
