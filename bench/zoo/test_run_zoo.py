"""run_zoo.py: device sharing (`--jobs N`: a model that ran out of memory
beside others runs again alone, at once, and nothing runs beside it), the
floor measured by execution as the service measures it, and shard merging."""
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_zoo  # noqa: E402


def test_a_model_runs_alone_while_no_other_runs_and_the_rest_finish():
    gate = run_zoo.DeviceGate()
    lock = threading.Lock()
    running = set()
    beside_alone = []
    order = []

    def work(name, alone):
        with lock:
            if alone and running:
                beside_alone.append(sorted(running))
            for other in running:
                if other.endswith("(alone)"):
                    beside_alone.append([name, other])
            running.add(name + (" (alone)" if alone else ""))
            order.append(name + (" (alone)" if alone else ""))
        time.sleep(0.05)
        with lock:
            running.discard(name + (" (alone)" if alone else ""))

    def pooled(name):
        with gate.shared():
            work(name, False)
        if name == "big":  # ran out of memory beside the others
            with gate.alone():
                work(name, True)

    names = ["a", "big", "c", "d", "e", "f", "g", "h"]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(pooled, names))
    assert beside_alone == []
    assert sorted(n for n in order if "alone" not in n) == sorted(names)
    # At once, not after the whole pool: some models start after it.
    assert order.index("big (alone)") < len(order) - 1


class _FakeBins:
    """mutwo-worker profile/execute and mutwo plan as canned JSON: the
    floor is predicted at 1000 B; execute measures `peaks` in turn."""

    def __init__(self, peaks):
        self.peaks = list(peaks)
        self.plans = []
        self.executes = 0

    def __call__(self, cmd, timeout):
        import json
        if cmd[1] == "profile":
            return 0, json.dumps({"device": {"name": "fake"},
                                  "measured": {"peak_bytes": 2000},
                                  "nodes": [], "activations": []}), "", 0.1
        if cmd[1] == "plan":
            budget = cmd[cmd.index("--budget") + 1]
            self.plans.append(budget)
            b = 1000 if budget in ("floor", "100%") else int(budget[:-1])
            return 0, json.dumps({"budget_bytes": b, "floor_bytes": 1000,
                                  "baseline_peak_bytes": 2000,
                                  "predicted_peak_bytes": min(b, 2000),
                                  "feasible": True}), "", 0.1
        self.executes += 1
        peak = self.peaks.pop(0) if self.peaks else 900
        return 0, json.dumps({"scheduled": {"peak_bytes": peak},
                              "baseline": {"peak_bytes": 2000},
                              "gradients_match": True}), "", 0.1


def _run_fake(tmp_path, monkeypatch, peaks, fractions=(0.0,)):
    import argparse
    fake = _FakeBins(peaks)
    monkeypatch.setattr(run_zoo, "run", fake)
    model = tmp_path / "m.pt"
    model.write_bytes(b"x")
    args = argparse.Namespace(bin=str(tmp_path), device="cpu", warmup=1,
                              iterations=1, optimizer="sgd", worker_flags="",
                              execute_flags="", emulate_link_gbps=0,
                              profile_timeout=1, plan_timeout=1,
                              execute_timeout=1, rounds=3, replan_margin=0.01,
                              fractions=list(fractions))
    m = {"name": "m", "path": str(model), "inputs": ["x:float32[B,4]"],
         "loss": "mean", "batch": 2}
    return run_zoo.run_model(m, args, str(tmp_path)), fake


def test_a_floor_measured_over_its_prediction_is_the_measured_floor_and_holds_again(
        tmp_path, monkeypatch):
    # The second run peaks 2 B higher (run-to-run jitter): within the
    # measured floor's 0.25% margin (1040 + 3 B).
    rec, fake = _run_fake(tmp_path, monkeypatch, peaks=[1040, 1042])
    (pt,) = rec["points"]
    assert fake.plans == ["100%", "floor"]  # the floor is never re-planned
    assert fake.executes == 2  # the same schedule, executed again
    assert pt["floor_measured"] and pt["predicted_floor_bytes"] == 1000
    assert pt["budget_bytes"] == 1043 and pt["within_budget"]
    assert rec["measured_floor_bytes"] == 1043
    s = run_zoo.summarize([rec])
    assert (s["floor_points"], s["floors_within_budget"], s["floors_measured"]) == (1, 1, 1)


def test_a_measured_floor_that_does_not_hold_a_second_time_fails(
        tmp_path, monkeypatch):
    rec, fake = _run_fake(tmp_path, monkeypatch, peaks=[1040, 1100])
    (pt,) = rec["points"]
    assert fake.executes == 2
    assert not pt["within_budget"]
    assert run_zoo.point_failures(pt) == ["over_budget"]
    assert not run_zoo.summarize([rec])["green"]


def test_a_floor_within_its_prediction_runs_once(tmp_path, monkeypatch):
    rec, fake = _run_fake(tmp_path, monkeypatch, peaks=[990])
    (pt,) = rec["points"]
    assert fake.executes == 1 and pt["within_budget"]
    assert "floor_measured" not in pt and "measured_floor_bytes" not in rec


def test_a_model_whose_step_does_not_fit_runs_at_half_the_batch():
    tried = []

    def fake_run(m, args, work):
        tried.append(m["batch"])
        if m["batch"] > 8:
            return {"name": m["name"], "batch": m["batch"], "points": [],
                    "failures": [{"stage": "profile", "error":
                                  "out of memory at node 3 (aten::mm)"}]}
        return {"name": m["name"], "batch": m["batch"], "points": [{}],
                "failures": []}
    rec = run_zoo.run_model_fitting({"name": "big", "batch": 32}, None, None,
                                    run=fake_run)
    assert tried == [32, 16, 8]
    assert rec["batch"] == 8 and rec["batch_reduced_from"] == 32
    assert not rec["failures"]


def test_a_cuda_library_that_cannot_allocate_ran_out_of_memory():
    # cuBLAS on a card that models beside it had filled: run again alone.
    rec = {"failures": [{"stage": "profile", "error":
                         "node 138 (aten::linear, head.fc): CUDA error: "
                         "CUBLAS_STATUS_ALLOC_FAILED when calling "
                         "`cublasCreate(handle)`"}], "points": []}
    assert run_zoo.ran_out_of_memory(rec)
    assert not run_zoo.ran_out_of_memory(
        {"failures": [{"stage": "profile", "error": "bad shape"}]})


def test_a_schedule_out_of_memory_keeps_the_batch():
    tried = []

    def fake_run(m, args, work):
        tried.append(m["batch"])
        return {"name": m["name"], "batch": m["batch"], "failures": [],
                "points": [{"executor_error": "CUDA out of memory"}]}
    rec = run_zoo.run_model_fitting({"name": "m", "batch": 32}, None, None,
                                    run=fake_run)
    assert tried == [32] and "batch_reduced_from" not in rec


def test_shards_share_the_large_models_and_start_with_them():
    models = [{"name": f"m{i}", "params": p}
              for i, p in enumerate([5, 900, 40, 7, 600, 30, 1, None])]
    shards = [[m["name"] for m in run_zoo.shard(models, k, 2)]
              for k in range(2)]
    assert shards == [["m1", "m2", "m3", "m6"], ["m4", "m5", "m0", "m7"]]
    assert sorted(sum(shards, [])) == sorted(m["name"] for m in models)


def test_shards_merge_into_one_summary(tmp_path, monkeypatch):
    import json
    for k in range(2):
        rec, _ = _run_fake(tmp_path, monkeypatch, peaks=[990 + k * 50, 1040])
        rec["name"] = f"m{k}"
        d = tmp_path / f"shard{k}"
        d.mkdir()
        (d / "zoo_results.json").write_text(json.dumps(
            {"complete": True, "command": f"shard {k}", "models": [rec],
             "summary": {"seconds": 10 + k}}))
    import argparse
    args = argparse.Namespace(merge=[str(tmp_path / "shard0"),
                                     str(tmp_path / "shard1")],
                              out=str(tmp_path / "merged"), no_fail=True)
    assert run_zoo.merge_shards(args) == 0
    merged = json.loads((tmp_path / "merged" / "zoo_results.json").read_text())
    assert [r["name"] for r in merged["models"]] == ["m0", "m1"]
    assert merged["summary"]["floor_points"] == 2
    assert merged["summary"]["floors_measured"] == 1
    assert merged["summary"]["seconds"] == 11


def test_step_time_is_judged_as_predicted_and_against_this_process_baseline():
    # Predicted +20% over a 100 ms profiled step; this process measured its
    # unscheduled step at 150 ms and the scheduled one at 180 ms (+20%).
    moved = dict(executed=True, fraction=0.5, predicted_iteration_ms=120.0,
                 predicted_baseline_iteration_ms=100.0,
                 measured_iteration_ms=180.0, baseline_iteration_ms=150.0)
    plain, anchored = run_zoo.step_errors(moved)
    assert abs(plain - (120 / 180 - 1)) < 1e-9
    assert abs(anchored) < 1e-9
    # A point whose overhead here is +40% against the +20% predicted.
    short = dict(moved, measured_iteration_ms=210.0, fraction=0.75)
    s = run_zoo.step_summary([moved, short])
    assert s["points"] == 2
    assert s["within_10pct"] == 0
    assert s["anchored_within_10pct"] == 1
    assert s["median_overhead"]["0.5"] == {"predicted": 0.2, "measured": 0.2,
                                           "points": 1}
    assert s["median_overhead"]["0.75"]["measured"] == 0.4
    # Not measured (out of memory, or an older record): not counted.
    assert run_zoo.step_errors(dict(moved, measured_iteration_ms=0)) is None
    old = dict(moved)
    del old["predicted_baseline_iteration_ms"]
    assert run_zoo.step_errors(old)[1] is None
