#!/usr/bin/env python3
"""mutwo's model-zoo conformance suite: runs every model of a
models.py manifest through profile -> plan (budgets from the floor to the
baseline) -> execute and checks the bars.

    run_zoo.py --manifest DIR/manifest.json --bin build/bin --out RESULTS_DIR
               [--device cpu|cuda:0] [--tier cpu|gpu] [--models a,b]
               [--fractions 0,0.25,0.5,0.75] [--no-fail]

Per model: `mutwo-worker profile` (--optimizer), one `mutwo plan --budget 100%` to
read floor_bytes and baseline_peak_bytes, then one plan per fraction f of
the way floor -> baseline (f = 0 is the floor itself, as a byte budget), and
`mutwo-worker execute` of every schedule. A failure at any stage is recorded
with its one-line reason and the suite goes on.

Bars, per point: executed; gradients equal the unmodified step's; measured
peak <= budget. Per run: predicted peak within +-5% of the measured peak at
>= 95% of the executed points. A model that is not scripted, not profiled or
has a point that fails to plan counts as failing. Exit status 1 when a bar
fails (0 with --no-fail), 2 on bad arguments.

stdout: one JSON line per point (and per model that has no points), then one
summary line. RESULTS_DIR/zoo_results.json holds everything (compact).
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PRED_TOLERANCE = 0.05
PRED_SHARE = 0.95
STEP_TOLERANCE = 0.10  # the time model's bar: predicted step within 10%


def one_line(stderr, rc=None):
    """The last meaningful stderr line (the CLIs print their failure as one
    line starting with the program name; prefer that)."""
    # (A C++ backtrace's frames and "Exception raised from" lines say
    # nothing of what went wrong: the message stands before them.)
    lines = [l.strip() for l in (stderr or "").splitlines()
             if l.strip() and not l.strip().startswith(("frame #",
                                                       "Exception raised from"))]
    mine = [l for l in lines if l.startswith(("mutwo-worker", "mutwo "))]
    pick = (mine or lines or [f"exit code {rc}"])[-1]
    return pick[:400]


def run(cmd, timeout):
    t0 = time.time()
    # A binary being rebuilt disappears for a moment: wait for it.
    while not os.access(cmd[0], os.X_OK) and time.time() - t0 < 120:
        time.sleep(5)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, "", err + f"\ntimeout after {timeout}s", time.time() - t0
    except OSError as e:
        return None, "", f"cannot run {cmd[0]}: {e}", time.time() - t0


def model_args(m, device, warmup, iterations, optimizer):
    args = []
    for i in m["inputs"]:
        args += ["--input", i]
    return args + ["--loss", m["loss"], "--optimizer", optimizer,
                   "--batch", str(m["batch"]), "--device", device,
                   "--warmup", str(warmup), "--iterations", str(iterations)]


def git_commit(repo):
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:
        return ""


_EMIT_LOCK = threading.Lock()


def emit(obj):
    with _EMIT_LOCK:
        print(json.dumps(obj, separators=(",", ":")), flush=True)


def run_model(m, args, work):
    """Profile, plan and execute one manifest model; returns its record."""
    rec = {k: m[k] for k in ("name", "family", "source", "params", "batch",
                             "inputs", "loss", "image_size", "config",
                             "num_classes") if m.get(k) is not None}
    rec.update(scripted=bool(m.get("path")), profiled=False, points=[],
               failures=[])
    if m.get("excluded"):
        rec["excluded"] = m["excluded"]
        return rec
    if not m.get("path"):
        rec["failures"].append({"stage": "script", "error": m.get("script_error")})
        return rec
    worker = os.path.join(args.bin, "mutwo-worker")
    cli = os.path.join(args.bin, "mutwo")
    common = model_args(m, args.device, args.warmup, args.iterations,
                        args.optimizer) + args.worker_flags.split()
    base = os.path.join(work, m["name"])
    prof_path = base + ".profile.json"

    rc, out, err, secs = run([worker, "profile", m["path"]] + common +
                             ["--output", "json"], args.profile_timeout)
    rec["profile_s"] = round(secs, 2)
    if rc != 0:
        rec["failures"].append({"stage": "profile", "error": one_line(err, rc)})
        return rec
    try:
        profile = json.loads(out)
    except ValueError as e:
        rec["failures"].append({"stage": "profile", "error": f"bad JSON: {e}"})
        return rec
    if args.emulate_link_gbps and profile.get("device", {}).get("kind") == "cpu":
        # The CPU has no copy engine, so its profile offers no swaps; with a
        # modeled host link the planner mixes swaps into the schedules and the
        # CPU executor's swaps (host buffers) are judged like any others.
        emulate_link(profile, args.emulate_link_gbps * 1e9)
        out = json.dumps(profile)
        rec["emulated_link_gbps"] = args.emulate_link_gbps
    with open(prof_path, "w") as f:
        f.write(out)
    meas = profile.get("measured", {})
    rec.update(profiled=True,
               device_name=profile.get("device", {}).get("name"),
               libtorch=profile.get("device", {}).get("libtorch_version"),
               profile_oom=profile.get("oom", False),
               profile_peak_bytes=int(meas.get("peak_bytes", 0)),
               profile_iteration_ms=meas.get("iteration_ms"),
               module_peak_bytes=int(meas.get("module_peak_bytes", 0)),
               loss_matches_module=profile.get("loss_matches_module"),
               nodes=len(profile.get("nodes", [])),
               activations=len(profile.get("activations", [])))
    if profile.get("oom"):
        rec["failures"].append({"stage": "profile",
                                "error": f"out of memory at {profile.get('oom_step')}"})
        return rec

    # Floor and (simulated) baseline peak from one plan at 100%.
    rc, out, err, _ = run([cli, "plan", prof_path, "--budget", "100%",
                           "--output", "json"], args.plan_timeout)
    try:
        s100 = json.loads(out) if out.strip() else None
    except ValueError:
        s100 = None
    if s100 is None or "floor_bytes" not in s100:
        rec["failures"].append({"stage": "plan", "budget": "100%",
                                "error": one_line(err, rc)})
        return rec
    floor = int(s100["floor_bytes"])
    baseline = int(s100["baseline_peak_bytes"])
    rec.update(floor_bytes=floor, simulated_baseline_bytes=baseline)

    budgets = []
    if baseline <= floor:
        # Nothing to save (the planner's reserve can put the floor above
        # the simulated baseline): the floor is the one budget.
        args_fractions = [0.0]
    else:
        args_fractions = args.fractions
    for frac in args_fractions:
        b = floor if frac == 0 else int(round(floor + (baseline - floor) * frac))
        if budgets and b == budgets[-1][1]:
            continue  # floor == baseline: one distinct budget
        budgets.append((frac, b))
    for frac, budget in budgets:
        pt = {"model": m["name"], "fraction": frac, "budget_bytes": budget}
        # The service's closed loop (server/closed_loop.cc): a round measured
        # over the budget is planned again below it by the overshoot plus a
        # margin, at most args.rounds rounds; the bars judge the last round,
        # and the first round's figures stay in the record. The floor is the
        # budget `floor` (nothing is planned below it): measured over its
        # prediction, the floor is what was measured, as the service reports
        # it, and a second execution of the same schedule in a fresh process
        # is judged against that measured floor.
        correction = 0
        schedule = None
        for round_no in range(1, args.rounds + 1):
            plan_budget = "floor" if frac == 0 else f"{budget - correction}B"
            if round_no > 1 and frac != 0 and budget - correction < floor:
                pt["not_fitting"] = (f"the correction {correction} B puts the "
                                     f"plan below the floor {floor} B")
                break
            rnd = run_point(m, args, base, frac, round_no, prof_path, common,
                            budget, plan_budget, schedule)
            pt.update(rnd)
            pt["rounds"] = round_no
            pt["correction_bytes"] = correction
            if frac == 0 and round_no == 1 and "plan_budget_bytes" in rnd:
                budget = rnd["plan_budget_bytes"]
                pt["budget_bytes"] = budget
            if not rnd.get("executed") or rnd.get("within_budget"):
                break
            if round_no == 1:
                pt["first_round"] = {k: rnd.get(k) for k in (
                    "measured_peak_bytes", "predicted_peak_bytes",
                    "within_budget", "measured_over_budget")}
            if frac == 0:
                if pt.get("floor_measured"):
                    break  # the measured floor did not hold a second time
                pt.update(floor_measured=True, predicted_floor_bytes=budget)
                # As the service (server/closed_loop.h MeasuredFloorBytes):
                # the measured peak plus 0.25% for its run-to-run jitter.
                budget = measured_floor_bytes(rnd["measured_peak_bytes"])
                pt["budget_bytes"] = budget
                schedule = rnd["schedule_path"]
                continue
            margin = max(1, int(-(-args.replan_margin * budget // 1)))
            overshoot = rnd["measured_peak_bytes"] - rnd["predicted_peak_bytes"]
            correction = max(correction + margin, overshoot + margin)
        if pt.get("floor_measured"):
            rec["measured_floor_bytes"] = pt["budget_bytes"]
        pt.pop("schedule_path", None)
        rec["points"].append(pt)
        emit(pt)
    return rec


MEASURED_FLOOR_MARGIN = 0.0025  # server/closed_loop.h kMeasuredFloorMargin


def measured_floor_bytes(measured):
    """The budget a floor measured over its prediction is re-run and shown
    at: the peak plus 0.25% (ceil), as the service's MeasuredFloorBytes."""
    return measured + int(-(-MEASURED_FLOOR_MARGIN * measured // 1))


def emulate_link(profile, bytes_per_second):
    """Gives a profile a host link of `bytes_per_second` each way, the way
    the CUDA profiler fills it in (worker/profiler.cc: swap_ms is the round
    trip of the activation's bytes)."""
    dev = profile.setdefault("device", {})
    dev["host_to_device_bytes_per_second"] = bytes_per_second
    dev["device_to_host_bytes_per_second"] = bytes_per_second
    for a in profile.get("activations", []):
        size = int(a.get("size_bytes", 0))
        a["swap_ms"] = 1000.0 * (2 * size / bytes_per_second)


def parse_json(text):
    """The JSON object `text` holds, or None."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def run_point(m, args, base, frac, round_no, prof_path, common, budget,
              plan_budget, schedule=None):
    """One round of one point: plan at `plan_budget` (a `mutwo plan
    --budget` value) or take the schedule file `schedule`, execute, judge
    the measured peak against `budget`."""
    pt = {}
    worker = os.path.join(args.bin, "mutwo-worker")
    cli = os.path.join(args.bin, "mutwo")
    sched_path = schedule or f"{base}.{int(frac * 100)}.r{round_no}.schedule.json"
    if schedule:
        with open(schedule) as f:
            out = f.read()
        rc, err, sched, pt["plan_s"] = 0, "", parse_json(out), 0.0
    else:
        rc, out, err, psecs = run([cli, "plan", prof_path, "--budget",
                                   plan_budget, "--output", "json"],
                                  args.plan_timeout)
        pt["plan_s"] = round(psecs, 3)
        sched = parse_json(out)
    if rc != 0 or sched is None:
        pt.update(stage_failed="plan", error=one_line(err, rc))
        if sched is not None:
            pt["feasible"] = sched.get("feasible")
            pt["predicted_peak_bytes"] = int(sched.get("predicted_peak_bytes", 0))
        return pt
    if not schedule:
        with open(sched_path, "w") as f:
            f.write(out)
    pt["schedule_path"] = sched_path
    pt["plan_budget_bytes"] = int(sched.get("budget_bytes", 0))
    if plan_budget == "floor" and not schedule:
        budget = pt["plan_budget_bytes"]
    pt.update(feasible=sched.get("feasible"),
              predicted_peak_bytes=int(sched["predicted_peak_bytes"]),
              predicted_iteration_ms=sched.get("predicted_iteration_ms"),
              predicted_baseline_iteration_ms=sched.get("baseline_iteration_ms"),
              recomputed=int(sched.get("recomputed", 0)),
              swapped=int(sched.get("swapped", 0)))
    rc, out, err, esecs = run([worker, "execute", m["path"], "--schedule",
                               sched_path] + common + ["--output", "json"] +
                              args.execute_flags.split(),
                              args.execute_timeout)
    pt["execute_s"] = round(esecs, 2)
    if rc != 0:
        # The whole stderr (a C++ backtrace, the worker's log) for a look
        # later; the record keeps one line.
        with open(f"{base}.{int(frac * 100)}.r{round_no}.execute.err", "w") as f:
            f.write(err or "")
    # The worker exits non-zero on an over-budget peak but still prints
    # its measurements: keep them whenever stdout parses.
    v = parse_json(out)
    if v is not None and "scheduled" not in v:
        v = None
    if v is None and rc == 0:
        err = "bad JSON on stdout"
    pt["exit_code"] = rc
    if rc != 0 and v is not None:
        pt["error"] = one_line(err, rc)
    if v is None:
        pt.update(stage_failed="execute", executed=False,
                  error=one_line(err, rc))
        return pt
    mp = int(v["scheduled"]["peak_bytes"])
    pt.update(executed=True,
              measured_peak_bytes=mp,
              measured_iteration_ms=v["scheduled"].get("iteration_ms"),
              baseline_peak_bytes=int(v["baseline"]["peak_bytes"]),
              baseline_iteration_ms=v["baseline"].get("iteration_ms"),
              gradients_match=bool(v.get("gradients_match")),
              max_abs_grad_diff=v.get("max_abs_grad_diff"),
              worst_gradient_parameter=v.get("worst_gradient_parameter"),
              batchnorm_stats_match=v.get("batchnorm_stats_match"),
              within_budget=mp <= budget,
              executor_within_budget=v.get("within_budget"),
              measured_over_budget=round(mp / budget, 4) if budget else None,
              predicted_over_measured=(round(pt["predicted_peak_bytes"] / mp, 4)
                                       if mp else None))
    if mp <= budget and rc != 0 and round_no > 1:
        # Measured against the lowered plan budget by the worker; within the
        # point's own budget.
        pt.pop("error", None)
    if v.get("error"):
        pt["executor_error"] = v["error"][:300]
    return pt


def point_failures(pt):
    """The bars this point fails, as short strings."""
    if pt.get("stage_failed"):
        return [pt["stage_failed"]]
    out = []
    if not pt.get("gradients_match"):
        out.append("gradients")
    if not pt.get("within_budget"):
        out.append("over_budget")
    return out


def predicted_ok(pt):
    r = pt.get("predicted_over_measured")
    return r is not None and abs(r - 1) <= PRED_TOLERANCE


def step_errors(pt):
    """The predicted step time against the measured one, as fractions
    (predicted / measured - 1): as predicted, and anchored to this
    process's unscheduled step (the predicted overhead over the profiled
    unscheduled step applied to the one measured here: step times move
    between processes on host-bound models). None where not measured."""
    pred, meas = pt.get("predicted_iteration_ms"), pt.get("measured_iteration_ms")
    if not pred or not meas:
        return None
    plain = pred / meas - 1
    base_pred = pt.get("predicted_baseline_iteration_ms")
    base_meas = pt.get("baseline_iteration_ms")
    anchored = ((pred / base_pred) / (meas / base_meas) - 1
                if base_pred and base_meas else None)
    return plain, anchored


def step_summary(ex):
    """The time model's bars, informational (not part of `green`): the share
    of points whose predicted step is within STEP_TOLERANCE of the measured
    one (plain and anchored), and the median predicted and measured
    overhead over the unscheduled step at each budget position."""
    errs = [(p, step_errors(p)) for p in ex]
    errs = [(p, e) for p, e in errs if e is not None]
    out = {"points": len(errs),
           "within_10pct": sum(1 for _, e in errs if abs(e[0]) <= STEP_TOLERANCE),
           "anchored_within_10pct": sum(1 for _, e in errs
                                        if e[1] is not None and abs(e[1]) <= STEP_TOLERANCE)}
    positions = {}
    for p, _ in errs:
        base_pred = p.get("predicted_baseline_iteration_ms")
        base_meas = p.get("baseline_iteration_ms")
        if not base_pred or not base_meas:
            continue
        d = positions.setdefault(str(p.get("fraction")), {"predicted": [], "measured": []})
        d["predicted"].append(p["predicted_iteration_ms"] / base_pred - 1)
        d["measured"].append(p["measured_iteration_ms"] / base_meas - 1)
    out["median_overhead"] = {
        k: {"predicted": round(statistics.median(v["predicted"]), 4),
            "measured": round(statistics.median(v["measured"]), 4),
            "points": len(v["measured"])}
        for k, v in sorted(positions.items())}
    return out


def summarize(records):
    s = {"models": len(records),
         "excluded_by_size": sum(1 for r in records if r.get("excluded")),
         "scripted": sum(1 for r in records if r["scripted"]),
         "profiled": sum(1 for r in records if r["profiled"])}
    s["in_tier"] = s["models"] - s["excluded_by_size"]
    pts = [p for r in records for p in r["points"]]
    ex = [p for p in pts if p.get("executed")]
    s.update(points=len(pts), executed=len(ex),
             gradients_match=sum(1 for p in ex if p["gradients_match"]),
             within_budget=sum(1 for p in ex if p["within_budget"]),
             predicted_within_5pct=sum(1 for p in ex if predicted_ok(p)))
    s["predicted_share"] = round(s["predicted_within_5pct"] / len(ex), 4) if ex else 0.0
    s["step_time"] = step_summary(ex)
    floors = [p for p in ex if p.get("fraction") == 0]
    s.update(floor_points=len(floors),
             floors_within_budget=sum(1 for p in floors if p["within_budget"]),
             floors_measured=sum(1 for p in floors if p.get("floor_measured")))
    failing = [r["name"] for r in records if not r.get("excluded") and
               (r["failures"] or not r["points"] or
                any(point_failures(p) for p in r["points"]))]
    s["failing_models"] = failing
    bars = {
        "all_in_tier_scripted_and_profiled":
            s["profiled"] == s["in_tier"],
        "every_point_executed": s["executed"] == s["points"] and s["points"] > 0,
        "every_point_gradients_equal": s["gradients_match"] == s["executed"],
        "every_point_within_budget": s["within_budget"] == s["executed"],
        "predicted_peak_within_5pct_at_95pct":
            s["predicted_share"] >= PRED_SHARE,
    }
    s["bars"] = bars
    s["green"] = all(bars.values()) and not failing
    return s


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest",
                    help="manifest.json written by models.py")
    ap.add_argument("--bin", default=os.path.join(repo, "build", "bin"))
    ap.add_argument("--out", required=True, help="writes OUT/zoo_results.json")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                    help="default: the manifest's")
    ap.add_argument("--models", default="", help="comma-separated filter")
    ap.add_argument("--fractions", default="0,0.25,0.5,0.75",
                    help="budgets as fractions of the way floor -> baseline")
    ap.add_argument("--optimizer", default="adam",
                    help="the training step's optimizer (mutwo-worker's --optimizer)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="closed-loop rounds per point, as mutwo-server's "
                         "--validation_rounds (1: no re-plan)")
    ap.add_argument("--replan-margin", type=float, default=0.01,
                    help="margin of a re-plan, a fraction of the budget "
                         "(mutwo-server's --replan_margin)")
    ap.add_argument("--emulate-link-gbps", type=float, default=0,
                    help="on a CPU device, model a host link of this many GB/s "
                    "each way in the profile, so that schedules swap (the CPU "
                    "profile has none)")
    ap.add_argument("--execute-flags", default="",
                    help="extra mutwo-worker execute flags, e.g. "
                    "'--log_level trace' (a failed point's stderr is kept in "
                    "the work dir)")
    ap.add_argument("--worker-flags", default="",
                    help="extra flags of both mutwo-worker profile and "
                    "execute, e.g. --worker-flags=--specialize_control_flow "
                    "(with '=': the value starts with a dash; the two must "
                    "build the same graph)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=None,
                    help="measured iterations (default: 1 on cpu, 5 on cuda)")
    ap.add_argument("--profile-timeout", type=float, default=None)
    ap.add_argument("--plan-timeout", type=float, default=120)
    ap.add_argument("--execute-timeout", type=float, default=None)
    ap.add_argument("--work", default="",
                    help="keep profiles and schedules here (default: a temp dir)")
    ap.add_argument("--reproduce", default="",
                    help="the command line that reproduces this run, for the "
                         "report (default: models.py's and this one)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="models run at once on the device (each point is "
                    "its own process, so measured peaks stay per process; "
                    "step times are then measured on a shared device). A "
                    "model that ran out of memory beside others runs again "
                    "at once, alone: the others finish their model and wait")
    ap.add_argument("--shard", default="",
                    help="K/N: run only the models at positions K, K+N, ... "
                    "of the manifest (one shard per card; --merge joins them)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="join the zoo_results.json of these shard dirs into "
                    "OUT/zoo_results.json (nothing is run)")
    ap.add_argument("--no-fail", action="store_true",
                    help="exit 0 even when a bar fails")
    args = ap.parse_args()
    if args.merge:
        return merge_shards(args)
    if not args.manifest:
        ap.error("--manifest is required (unless --merge)")
    try:
        with open(args.manifest) as f:
            manifest = json.load(f)
        args.fractions = [float(x) for x in args.fractions.split(",")]
    except (OSError, ValueError) as e:
        print(f"run_zoo: {e}", file=sys.stderr)
        return 2
    tier = args.tier or manifest.get("tier", "cpu")
    gpu = args.device.startswith("cuda")
    if args.iterations is None:
        # 5 on a GPU: host-bound steps (small models at the zoo's batch
        # sizes) move by 10-40% between 3-step timings.
        args.iterations = 5 if gpu else 1
    if args.profile_timeout is None:
        args.profile_timeout = 900 if tier != "cpu" else 300
    if args.execute_timeout is None:
        args.execute_timeout = 900 if tier != "cpu" else 300
    for b in ("mutwo", "mutwo-worker"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            print(f"run_zoo: {args.bin}/{b} is missing", file=sys.stderr)
            return 2
    only = set(filter(None, args.models.split(",")))
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="mutwo-zoo-")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    todo = [m for m in manifest["models"] if not only or m["name"] in only]
    if args.shard:
        try:
            k, n = (int(x) for x in args.shard.split("/"))
            assert 0 <= k < n
        except (ValueError, AssertionError):
            print(f"run_zoo: --shard {args.shard!r} is not K/N with 0 <= K < N",
                  file=sys.stderr)
            return 2
        todo = shard(todo, k, n)
    done = {}
    lock = threading.Lock()

    def one(m, fitting=True):
        tm = time.time()
        rec = (run_model_fitting(m, args, work) if fitting
               else run_model(m, args, work))
        rec["seconds"] = round(time.time() - tm, 1)
        if not rec["points"]:
            emit({"model": rec["name"], "excluded": rec.get("excluded"),
                  "failures": rec["failures"]})
        if not rec.get("excluded"):
            print(f"zoo: {rec['name']}: {len(rec['points'])} points, "
                  f"{len(rec['failures'])} model failures ({rec['seconds']}s)",
                  file=sys.stderr, flush=True)
        with lock:
            done[m["name"]] = rec
            # The record so far, after every model: a run cut short keeps
            # what it measured.
            write_results(args, manifest, repo, tier,
                          [done[x["name"]] for x in todo if x["name"] in done],
                          t0, complete=False)
        return rec

    try:
        if args.jobs > 1:
            # Beside other models a model can run out of device memory that
            # it would have alone: it runs again at once, alone on the
            # device (the other workers finish their model and wait), so a
            # run cut short does not lose the reruns.
            gate = DeviceGate()

            def pooled(m):
                with gate.shared():
                    rec = one(m, fitting=False)
                if not ran_out_of_memory(rec):
                    return rec
                print(f"zoo: {m['name']}: out of memory beside other "
                      f"models; again alone", file=sys.stderr, flush=True)
                with gate.alone():
                    rec = one(m)
                rec["rerun_alone"] = True
                return rec

            with ThreadPoolExecutor(args.jobs) as pool:
                list(pool.map(pooled, todo))
        else:
            for m in todo:
                one(m)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    records = [done[m["name"]] for m in todo]
    summary = write_results(args, manifest, repo, tier, records, t0,
                            complete=True)
    emit({"summary": summary})
    print(f"zoo: wrote {os.path.join(args.out, 'zoo_results.json')} "
          f"({summary['seconds']}s); "
          f"{'GREEN' if summary['green'] else 'NOT green'}", file=sys.stderr)
    return 0 if summary["green"] or args.no_fail else 1


def shard(models, k, n):
    """The k-th of n shards: the models by parameter count, largest first,
    dealt to the shards in turn, so each shard gets its share of the large
    ones and starts with its largest (a 632 M-parameter model dealt last by
    manifest order was still running when the other cards were done)."""
    ranked = sorted(models, key=lambda m: -(m.get("params") or 0))
    return ranked[k::n]


def merge_shards(args):
    """OUT/zoo_results.json from the shards' results: the models of all,
    summarized again; the run's facts from the first shard, with every
    shard's command and seconds."""
    shards = []
    for d in args.merge:
        path = os.path.join(d, "zoo_results.json")
        try:
            with open(path) as f:
                shards.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"run_zoo: cannot read shard {path}: {e}", file=sys.stderr)
            return 2
    merged = dict(shards[0])
    models = [r for sh in shards for r in sh["models"]]
    merged["models"] = models
    merged["complete"] = all(sh.get("complete") for sh in shards)
    merged["shards"] = [{"dir": d, "command": sh.get("command"),
                         "device_name": sh.get("device_name"),
                         "models": len(sh["models"]),
                         "seconds": sh["summary"].get("seconds"),
                         "complete": sh.get("complete")}
                        for d, sh in zip(args.merge, shards)]
    summary = summarize(models)
    summary["seconds"] = max(sh["summary"].get("seconds", 0) for sh in shards)
    merged["summary"] = summary
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "zoo_results.json"), "w") as f:
        json.dump(merged, f, separators=(",", ":"))
        f.write("\n")
    emit({"summary": summary})
    return 0 if summary["green"] or args.no_fail else 1


class DeviceGate:
    """Models share the device (`shared()`) or one has it alone (`alone()`,
    which waits for the sharers to finish and holds new ones back)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._sharers = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            while self._alone or self._waiting_alone:
                self._cond.wait()
            self._sharers += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self._cond:
            self._waiting_alone += 1
            while self._alone or self._sharers:
                self._cond.wait()
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


def out_of_memory_text(text):
    """Whether an error says the device ran out of memory: the allocator's
    words, or a CUDA library that could not allocate its handle or
    workspace (CUBLAS_STATUS_ALLOC_FAILED), as the worker reads them."""
    text = text or ""
    return "out of memory" in text.lower() or "_STATUS_ALLOC_FAILED" in text


def profile_ran_out_of_memory(rec):
    """Whether `rec`'s unmodified step did not fit the device: its profile
    ran out of memory (a point's schedule running out is another matter)."""
    return rec.get("profile_oom") or any(
        f.get("stage") == "profile" and out_of_memory_text(f.get("error"))
        for f in rec.get("failures", []))


def run_model_fitting(m, args, work, run=None):
    """run_model, at half the batch while the unmodified step alone does
    not fit the device (as a user picks a batch that trains): the record
    says the batch it ran at and the one that did not fit. Call it where
    the model has the device to itself."""
    run = run or run_model
    rec = run(m, args, work)
    first = m.get("batch")
    while profile_ran_out_of_memory(rec) and (m.get("batch") or 1) > 1:
        m = dict(m, batch=m["batch"] // 2)
        print(f"zoo: {m['name']}: the unmodified step does not fit at "
              f"batch {m['batch'] * 2}; batch {m['batch']}",
              file=sys.stderr, flush=True)
        rec = run(m, args, work)
        rec["batch_reduced_from"] = first
    return rec


def ran_out_of_memory(rec):
    """Whether a failure or a point of `rec` ran out of device memory."""
    texts = [f.get("error") or "" for f in rec.get("failures", [])]
    texts += [p.get("error") or "" for p in rec.get("points", [])]
    texts += [p.get("executor_error") or "" for p in rec.get("points", [])]
    return rec.get("profile_oom") or any(out_of_memory_text(t) for t in texts)


def write_results(args, manifest, repo, tier, records, t0, complete):
    """Writes OUT/zoo_results.json from `records`; returns the summary."""
    summary = summarize(records)
    summary["seconds"] = round(time.time() - t0, 1)
    device_name = next((r["device_name"] for r in records if r.get("device_name")), None)
    libtorch = next((r["libtorch"] for r in records if r.get("libtorch")), None)
    results = {
        "suite": "mutwo-zoo",
        "tier": tier,
        "device": args.device,
        "device_name": device_name,
        "libtorch": libtorch,
        "torch_python": manifest.get("torch"),
        "torchvision": manifest.get("torchvision"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit(repo),
        "command": args.reproduce or " && ".join(filter(None, [
            manifest.get("command"),
            " ".join(["bench/zoo/run_zoo.py"] + sys.argv[1:])])),
        "size_rule": manifest.get("size_rule"),
        "fractions": args.fractions,
        "optimizer": args.optimizer,
        "rounds": args.rounds,
        "replan_margin": args.replan_margin,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "bars": {"per_point": ["executed", "gradients_match",
                               "measured_peak <= budget"],
                 "per_run": f"|predicted/measured - 1| <= {PRED_TOLERANCE} "
                            f"at >= {PRED_SHARE:.0%} of executed points"},
        "jobs": args.jobs,
        "complete": complete,
        "summary": summary,
        "models": records,
    }
    path = os.path.join(args.out, "zoo_results.json")
    with open(path, "w") as f:
        json.dump(results, f, separators=(",", ":"))
        f.write("\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
