#!/usr/bin/python3
"""The same model, the same answer, every run.

For each model: `mutwo-worker profile` RUNS times and `mutwo-worker
execute` of a floor schedule and a mid schedule RUNS times each, every run
a fresh process (address-space randomization on, as users run it), and
asserts:
  - no run crashes or fails (exit 0; a signal, an assert or an error fails);
  - every profile has one graph fingerprint, and every profile is the same
    apart from timings (fields ending in `_ms`, the measured timings) and
    the device name;
  - every execute accepts the schedule (no fingerprint refusal), executes
    it with gradients equal, and measures the same peak every run.

    determinism_test.py --bin BUILD/bin --models DIR [--models DIR2] [--zoo]
                        [--runs 10] [--jobs 2] [--only a,b]

DIR is what tests/testing/make_models.py and bench/zoo/models.py --tier cpu
wrote (models.txt and/or manifest.json); --zoo scripts the zoo's families
itself (bench/zoo/models.py, into a temporary folder). Prints one JSON line per model
and a closing 'N passed, M failed' line; exit 1 when a model fails.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

# The fixtures whose outcome depended on addresses, and the
# zoo's repo families (one each).
FIXTURES = ("diffusion_unet", "seq2seq", "transformer", "control_flow",
            "two_inputs", "cnn", "fast_path_check")
ZOO = ("gpt", "transformer_encoder", "lstm_lm", "unet", "moe")


def models_from(dirs, only):
    """name -> (model path, worker flags), from models.txt / manifest.json."""
    out = {}
    for d in dirs:
        txt = os.path.join(d, "models.txt")
        if os.path.exists(txt):
            for line in open(txt):
                name, *args = shlex.split(line)
                if name in FIXTURES:
                    out[name] = (os.path.join(d, name + ".pt"), args,
                                 ["--batch", "8"])
        manifest = os.path.join(d, "manifest.json")
        if os.path.exists(manifest):
            for e in json.load(open(manifest))["models"]:
                if e["name"] not in ZOO or not e.get("path"):
                    continue
                args = []
                for spec in e["inputs"]:
                    args += ["--input", spec]
                args += ["--loss", e["loss"]]
                out[e["name"]] = (e["path"], args,
                                  ["--batch", str(e.get("batch", 2))])
    if only:
        out = {k: v for k, v in out.items() if k in only}
    return out


def strip_timings(value):
    """The profile without what a run may change: timings, the device name."""
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items()
                if not (k.endswith("_ms") or k == "ms") and k != "name"
                and not (k == "device")}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def first_difference(a, b, path=""):
    if type(a) is not type(b):
        return f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in one"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def describe_failure(rc, stderr):
    lines = [l for l in stderr.splitlines() if l.strip()]
    why = lines[-1][:300] if lines else ""
    if rc < 0:
        return f"killed by signal {-rc} {why}".strip()
    return f"exit {rc}: {why}"


def check_model(name, path, args, batch, bins, runs, tmp):
    worker = os.path.join(bins, "mutwo-worker")
    mutwo = os.path.join(bins, "mutwo")
    common = [*args, "--optimizer", "sgd", "--device", "cpu", *batch]
    failures = []
    profiles = []
    for i in range(runs):
        rc, out, err = run([worker, "profile", path, *common,
                            "--iterations", "1", "--output", "json"])
        if rc != 0:
            failures.append(f"profile run {i + 1}: "
                            + describe_failure(rc, err))
            continue
        profiles.append(json.loads(out))
    result = {"model": name, "profiles": len(profiles)}
    if not profiles:
        result["failures"] = failures
        return result
    prints = sorted({p["graph_fingerprint"] for p in profiles})
    result["fingerprints"] = prints
    if len(prints) != 1:
        failures.append(f"{len(prints)} graph fingerprints over "
                        f"{len(profiles)} profiles: {prints}")
    ref = strip_timings(profiles[0])
    for i, p in enumerate(profiles[1:], 2):
        d = first_difference(ref, strip_timings(p))
        if d:
            failures.append(f"profile run {i} differs from run 1 at {d}")
            break
    prof = os.path.join(tmp, name + ".profile.json")
    with open(prof, "w") as f:
        json.dump(profiles[0], f)
    rc, out, err = run([mutwo, "plan", prof, "--budget", "100%",
                        "--output", "json"])
    if rc != 0:
        failures.append("plan: " + describe_failure(rc, err))
        result["failures"] = failures
        return result
    top = json.loads(out)
    floor, base = int(top["floor_bytes"]), int(top["baseline_peak_bytes"])
    budgets = sorted({floor, (floor + base) // 2})
    result["budgets"] = budgets
    peaks = {}
    for budget in budgets:
        sched = os.path.join(tmp, f"{name}.{budget}.schedule.json")
        rc, out, err = run([mutwo, "plan", prof, "--budget", f"{budget}B",
                            "--output", "json"])
        if rc != 0:
            failures.append(f"plan {budget} B: " + describe_failure(rc, err))
            continue
        with open(sched, "w") as f:
            f.write(out)
        for i in range(runs):
            rc, out, err = run([worker, "execute", path, "--schedule", sched,
                                *common, "--output", "json"])
            if rc not in (0, 1):  # 1: measured over the budget (a floor miss)
                failures.append(f"execute {budget} B run {i + 1}: "
                                + describe_failure(rc, err))
                continue
            v = json.loads(out)
            if not v.get("gradients_match", False):
                failures.append(f"execute {budget} B run {i + 1}: gradients "
                                "differ from the unmodified step")
            peaks.setdefault(budget, set()).add(
                int(v["scheduled"]["peak_bytes"]))
    result["execute_peaks"] = {str(k): sorted(v) for k, v in peaks.items()}
    for budget, seen in peaks.items():
        if len(seen) != 1:
            failures.append(f"execute {budget} B measured {len(seen)} "
                            f"different peaks: {sorted(seen)}")
    if failures:
        result["failures"] = failures
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--models", action="append", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--zoo", action="store_true",
                    help="script the zoo's repo families (bench/zoo/models.py)")
    a = ap.parse_args()
    only = {s for s in a.only.split(",") if s}
    scratch = tempfile.TemporaryDirectory()
    if a.zoo:
        here = os.path.dirname(os.path.abspath(__file__))
        zoo_py = os.path.join(here, "..", "..", "bench", "zoo", "models.py")
        subprocess.run([sys.executable, zoo_py, "--tier", "cpu", "--models",
                        ",".join(ZOO), "--out", scratch.name], check=True,
                       capture_output=True)
        a.models.append(scratch.name)
    models = models_from(a.models, only)
    missing = (set(FIXTURES) | set(ZOO)) & (only or set(FIXTURES) | set(ZOO))
    missing -= set(models)
    if missing:
        print(f"determinism_test: models not found: {sorted(missing)}",
              file=sys.stderr)
        return 2
    t0 = time.time()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp, \
            ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futures = [pool.submit(check_model, name, p, args, batch, a.bin,
                               a.runs, tmp)
                   for name, (p, args, batch) in sorted(models.items())]
        for fut in futures:
            r = fut.result()
            print(json.dumps(r), flush=True)
            if r.get("failures"):
                failed += 1
            else:
                passed += 1
    print(f"determinism: {len(models)} models x {a.runs} runs in "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
