"""The anchors benchmark's mutwo_compile plumbing without a GPU: which
schedules anchors.py picks from run_benchmark.py's output, and report.py's
comparison of mutwo under torch.compile with compile's own
activation_memory_budget points."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import importlib.util  # noqa: E402

import anchors  # noqa: E402


def _load(name, path):
    # By path: anchors.py puts bench/gpu, which has a report.py too, first
    # on sys.path.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _load("anchors_report", os.path.join(HERE, "report.py"))


def write(directory, name, budget_bytes, feasible=True):
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"budget_bytes": str(budget_bytes), "feasible": feasible,
                   "decisions": []}, f)


def test_schedules_are_the_feasible_mutwo_ones_spread_over_budgets(tmp_path):
    d = str(tmp_path)
    for i, b in enumerate([1e9, 2e9, 3e9, 4e9, 5e9, 6e9, 7e9]):
        write(d, f"resnet152_b64_mutwo_{int(b)}B.schedule.json", int(b))
    write(d, "resnet152_b64_mutwo_1B.schedule.json", 1, feasible=False)
    write(d, "resnet152_b64_sqrt_n_100%.schedule.json", 9e9)
    write(d, "resnet152_b32_mutwo_5B.schedule.json", 5)
    picked = anchors.mutwo_schedules(d, "resnet152", 64, 3)
    assert [label for label, _ in picked] == ["1.00GB", "4.00GB", "7.00GB"]
    assert len(anchors.mutwo_schedules(d, "resnet152", 64, 0)) == 7
    assert anchors.mutwo_schedules(d, "transformer", 64, 3) == []


def point(system, peak_gb, ms, **extra):
    return {"system": system, "peak_bytes": int(peak_gb * 1e9),
            "step_ms": ms, **extra}


def test_compile_dominance_needs_one_point_at_or_under_both():
    pts = [point("compile:1.0", 10, 100), point("compile:0.2", 6, 130),
           point("mutwo_compile:5.00GB", 5.5, 125, method="mutwo_compile",
                 budget_bytes=5e9, swaps_ignored=2, swapped_bytes=3e8)]
    lines, summary = report.compile_dominance(pts)
    assert summary["met"]
    assert summary["pairs"] == [
        {"compile": "compile:1.0", "matched": False, "by": None},
        {"compile": "compile:0.2", "matched": True,
         "by": "mutwo_compile:5.00GB"}]
    text = "\n".join(lines)
    assert "2 SWAP decisions kept on the device" in text
    assert "planned budget 5.00 GB, OVER" in text
    slower = [pts[0], pts[1], point("mutwo_compile:5.00GB", 5.5, 140,
                                    method="mutwo_compile")]
    lines, summary = report.compile_dominance(slower)
    assert not summary["met"] and "NOT met" in lines[0]
    assert report.compile_dominance(pts[:2]) == ([], None)


def write_run(directory, loss, points):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "transformer_b64.json"), "w") as f:
        json.dump({"model": "transformer", "batch": 64, "loss": loss,
                   "points": [dict(p, predicted_peak_bytes=p[
                       "measured_peak_bytes"], predicted_iteration_ms=p[
                       "measured_iteration_ms"]) for p in points]}, f)


def mutwo_point(policy, budget_gb, peak_gb, ms):
    return {"policy": policy, "budget_bytes": int(budget_gb * 1e9),
            "measured_peak_bytes": int(peak_gb * 1e9),
            "measured_iteration_ms": ms}


def test_mutwo_folders_of_two_losses_are_merged_and_labelled(tmp_path):
    """report.py --mutwo A,B: one run_benchmark.py folder per loss, merged
    per model; rows of a loss other than torch's cross entropy (the
    anchors') are named by it, and every mutwo point, whatever its loss,
    can match an anchor."""
    ce, chunked = str(tmp_path / "ce"), str(tmp_path / "chunked")
    write_run(ce, "cross_entropy:y:int64[B,128]{0,30000}",
              [mutwo_point("mutwo", 5.51, 5.50, 46.4),
               mutwo_point("none", 5.51, 5.50, 46.8)])
    write_run(chunked, "chunked_cross_entropy:y:int64[B,128]{0,30000}",
              [mutwo_point("mutwo", 3.85, 3.58, 52.2),
               mutwo_point("per_block", 4.52, 2.96, 55.0)])
    runs = report.load_mutwo(ce + "," + chunked)
    systems = [p["system"] for p in report.mutwo_points(runs["transformer"])]
    assert systems == ["mutwo 5.51 GB", "none", "mutwo chunked 3.85 GB",
                       "per_block chunked"]
    anchors_ = [{"model": "transformer", "batch": 64, "system": "eager",
                 "peak_bytes": int(5.50e9), "step_ms": 46.4},
                {"model": "transformer", "batch": 64, "system": "ckpt_sqrt",
                 "peak_bytes": int(3.67e9), "step_ms": 55.9}]
    lines, _ = report.model_report("transformer", anchors_,
                                   runs["transformer"])
    text = "\n".join(lines)
    assert ("mutwo rows named `chunked`: mutwo's step with the loss "
            "`chunked_cross_entropy:y:int64[B,128]{0,30000}`") in text
    assert "- eager (5.50 GB, 46.4 ms): matched by mutwo 5.51 GB" in text
    assert ("- ckpt_sqrt (3.67 GB, 55.9 ms): matched by mutwo chunked "
            "3.85 GB") in text
    # One folder of torch's loss alone: no loss line, plain labels.
    alone = report.load_mutwo(ce)
    lines, _ = report.model_report("transformer", anchors_,
                                   alone["transformer"])
    assert not any("mutwo rows named" in line for line in lines)


def test_an_anchor_is_matched_by_mutwo_under_torch_compile_too(tmp_path):
    """Issue 27's bar counts mutwo's plan under torch.compile as an
    answer: an anchor no worker point matches is matched by a mutwo_compile
    point at or under its peak and time, and the row says that point's
    loss as the worker's rows do."""
    chunked = str(tmp_path / "chunked")
    write_run(chunked, "chunked_cross_entropy:y:int64[B,128]{0,30000}",
              [mutwo_point("mutwo", 3.76, 3.75, 46.8)])
    runs = report.load_mutwo(chunked)
    anchors_ = [{"model": "transformer", "batch": 64, "system": "eager",
                 "peak_bytes": int(5.50e9), "step_ms": 46.4},
                {"model": "transformer", "batch": 64,
                 "system": "mutwo_compile:3.76GB", "method": "mutwo_compile",
                 "loss": "chunked_cross_entropy",
                 "peak_bytes": int(3.40e9), "step_ms": 44.5}]
    lines, _ = report.model_report("transformer", anchors_,
                                   runs["transformer"])
    text = "\n".join(lines)
    assert "| mutwo_compile:3.76GB chunked | 3.40 | 44.5 |" in text
    assert ("- eager (5.50 GB, 46.4 ms): matched by mutwo_compile:3.76GB "
            "chunked (3.40 GB, 44.5 ms)") in text
    assert "- mutwo_compile:3.76GB chunked (3.40 GB" not in text


FAKE_CHILD = r"""
import json, sys, time
sys.path.insert(0, %r)
import anchors
args = sys.argv[1:]
turn_dir = args[args.index("--turn_dir") + 1]
k = int(args[args.index("--turn") + 1])
rounds = int(args[args.index("--rounds") + 1])
if "fail" in args:
    sys.exit(3)
if "hang" in args:
    time.sleep(60)
time.sleep(0.1 * (4 - k))  # warm in another order than they are timed
warm = time.time()
anchors.say_warm(turn_dir, k)
windows = []
for r in range(rounds):
    anchors.wait_for_go(turn_dir, k, r)
    go = time.time()
    time.sleep(0.03)
    windows.append((go, time.time()))
    anchors.say_done(turn_dir, k, r)
print(json.dumps({"k": k, "warm": warm, "windows": windows}))
""" % HERE


def run_fakes(whats, width, rounds):
    commands = [[sys.executable, "-c", FAKE_CHILD, what] for what in whats]
    return list(anchors.run_in_turns(commands, width, timeout=4,
                                     rounds=rounds))


def test_children_warmed_together_are_timed_one_at_a_time():
    done = run_fakes(("ok", "ok", "fail", "ok", "ok", "hang"), 3, 1)
    assert [k for k, *_ in done] == list(range(6))
    codes = [code for _, code, *_ in done]
    assert codes == [0, 0, 3, 0, 0, None]  # the hang is killed
    runs = [json.loads(out) for _, code, out, _, _ in done if code == 0]
    # Every child is warm before the first is timed ...
    first = min(w[0] for r in runs for w in r["windows"])
    assert first >= max(r["warm"] for r in runs)
    # ... and no two timed windows overlap.
    windows = sorted(w for r in runs for w in r["windows"])
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:]))


def test_rounds_time_every_child_in_turn_each_round():
    done = run_fakes(("ok", "ok", "ok"), 2, 3)
    assert [code for _, code, *_ in done] == [0, 0, 0]
    runs = [json.loads(out) for _, _, out, _, _ in done]
    assert all(len(r["windows"]) == 3 for r in runs)
    # Round r of every child comes before round r + 1 of any child, and
    # within a round the children take their turns in order.
    order = [k for _, k in sorted(
        (w[0], r["k"]) for r in runs for w in r["windows"])]
    assert order == [0, 1, 2] * 3
    windows = sorted(w for r in runs for w in r["windows"])
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:]))
