"""`python3 -m mutwo verify` (client/python/mutwo/_verify.py) on the CPU:
a schedule that holds exits 0 with the worker's table, one over its budget
or one that changes the gradients exits 1, an infeasible one exits 3, and a
bad MODEL_PY:FACTORY exits 2 naming what was wrong."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F

import mutwo

from mutwo.__main__ import main
from schedules import make_schedule

MODEL_PY = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        """Four conv blocks with batch norm, a linear head."""
        def __init__(self):
            super().__init__()
            layers = []
            for i in range(4):
                layers += [nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1),
                           nn.BatchNorm2d(8), nn.ReLU()]
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(8 * 16 * 16, 10)

        def forward(self, x):
            return self.head(self.features(x).flatten(1))

    class Counting(nn.Module):
        """A module whose forward depends on how often it ran: a replay
        computes something else (a schedule cannot recompute it)."""
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.tanh(self.lin(x) * self.calls)

    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Counting()
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.block(x))

    class TinyLM(nn.Module):
        """Embedding, two MLPs, a 1000-token head."""
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 16)
            self.mlp = nn.Sequential(nn.Linear(16, 1024), nn.GELU(),
                                     nn.Linear(1024, 16),
                                     nn.Linear(16, 1024), nn.GELU(),
                                     nn.Linear(1024, 16))
            self.head = nn.Linear(16, 1000)

        def forward(self, tokens):
            return self.head(self.mlp(self.embed(tokens)))

    def make():
        torch.manual_seed(0)
        return Net()

    def make_lm():
        torch.manual_seed(0)
        return TinyLM(), lm_batch

    def lm_batch(n, device):
        g = torch.Generator().manual_seed(4)
        tokens = torch.randint(0, 1000, (n, 32), generator=g)
        return tokens.to(device), torch.randint(0, 1000, (n, 32), generator=g).to(device)

    def make_stateful():
        torch.manual_seed(0)
        return Stateful(), stateful_batch

    def stateful_batch(n, device):
        return torch.randn(n, 16, device=device), torch.randint(0, 4, (n,), device=device)

    def not_a_model():
        return 42

    def broken():
        raise RuntimeError("weights file missing")

    def batch(n, device):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(n, 3, 16, 16, generator=g)
        return x.to(device), torch.randint(0, 10, (n,), generator=g).to(device)
''')


@pytest.fixture()
def model_py(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL_PY)
    return path


def load(path: Path, factory: str) -> Any:
    import importlib.util
    spec = importlib.util.spec_from_file_location("verify_test_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    made = getattr(module, factory)()
    return made[0] if isinstance(made, tuple) else made


def write_schedule(tmp_path: Path, model: Any, name: str,
                   recompute: Sequence[Tuple[int, Sequence[str], Sequence[str]]],
                   budget_bytes: int, feasible: bool = True,
                   floor_bytes: int = 0,
                   op_kinds: Optional[Dict[str, str]] = None) -> Path:
    s = make_schedule(model, recompute=recompute, op_kinds=op_kinds).proto
    s.batch_size = 4
    s.budget_bytes = budget_bytes
    s.floor_bytes = floor_bytes
    s.feasible = feasible
    s.predicted_peak_bytes = 600_000
    s.predicted_iteration_ms = 3.0
    path = tmp_path / name
    path.write_text(json_format_message(s))
    return path


def json_format_message(message: Any) -> str:
    from google.protobuf import json_format
    return json_format.MessageToJson(message, preserving_proto_field_name=True)


FEATURES = (0, [f"features.{i}" for i in range(6)], [])


def run_verify(capsys: Any, args: List[str]) -> Tuple[int, str, str]:
    code = main(["verify"] + args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_schedule_that_holds_exits_0_with_the_table(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "ok.json",
                              [FEATURES], budget_bytes=1 << 30)
    code, out, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                         str(schedule), "--batch", "4"])
    assert code == 0, err
    for row in ("baseline", "scheduled", "predicted"):
        assert row in out
    assert "budget          1.00 GiB (within)" in out
    assert "gradients       match" in out
    assert "batch-norm statistics match" in out
    assert "peak measure    cpu:" in out
    assert "replays in features[0:6]" in out
    # mutwo.apply's first-step measurements (the hand-made schedule plans
    # no bytes: no fraction).
    assert "saved tensors   " in out and "held at the end of forward" in out
    assert "of 0 B planned" in out


def test_json_output_has_the_measured_peaks_and_the_comparison(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "ok.json",
                              [FEATURES], budget_bytes=1 << 30)
    code, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(schedule), "--batch", "4",
        "--optimizer", "adam", "--steps", "2", "--output", "json"])
    assert code == 0, err
    v = json.loads(out)
    assert v["gradients_match"] and v["batchnorm_stats_match"]
    assert v["max_abs_grad_diff"] <= 1e-6 + 1e-5 * v["largest_gradient"]
    assert v["within_budget"]
    # Both steps measured: parameters (about 83 KB for the head) and the
    # activations of batch 4 are in each peak.
    assert v["baseline"]["peak_bytes"] > 100_000
    assert v["scheduled"]["peak_bytes"] > 100_000
    assert v["scheduled"]["iteration_ms"] > 0
    assert v["predicted"]["peak_bytes"] == 600_000


def test_recompute_lowers_the_measured_cpu_peak(
        model_py: Path, tmp_path: Path) -> None:
    """The CPU measure sees what the schedule drops: the whole-step peak of
    the applied model is below the unmodified one's when the recomputed
    features dominate."""
    from mutwo import _verify
    user = _verify.load_user_model(f"{model_py}:make")
    x, y = user.batch_fn(32, torch.device("cpu"))  # type: ignore[misc]
    session = _verify.Session(user, torch.device("cpu"), (x,), y,
                              _verify.make_loss(user, "", y), "none", 0)
    base, _, _ = session.timed(1)
    schedule = make_schedule(session.model, recompute=[FEATURES])
    import mutwo
    with mutwo.apply(session.model, schedule):
        sched, _, _ = session.timed(1)
    assert sched < base


def test_a_schedule_over_its_budget_exits_1(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    # CI bar: `verify` exits 1 on a schedule that does not hold.
    schedule = write_schedule(tmp_path, load(model_py, "make"), "low.json",
                              [FEATURES], budget_bytes=1000)
    code, out, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                         str(schedule), "--batch", "4"])
    assert code == 1
    assert "(EXCEEDED)" in out  # the table is printed either way
    assert "exceeds the budget 1000 B" in err


def test_gradients_that_differ_exit_1_naming_the_parameter(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    # Recomputes the block's tanh output (what autograd saves for tanh and
    # the head): its replay runs Counting.forward again, which computes
    # something else the second time.
    schedule = write_schedule(
        tmp_path, load(model_py, "make_stateful"), "stateful.json",
        [(0, ["block"], ["block.lin"])], budget_bytes=1 << 30,
        op_kinds={"block": "aten::tanh"})
    code, out, err = run_verify(capsys, [f"{model_py}:make_stateful",
                                         "--schedule", str(schedule),
                                         "--batch", "4"])
    assert code == 1
    assert "gradients       DIFFER" in out
    # Both the block's and the head's gradients differ (the head reads the
    # replayed output); which is worst depends on the torch build (block.lin
    # under 1.13, head.weight under 2.11): the message names one of them.
    assert "gradients (max |diff|" in err
    assert re.search(r"worst at (block\.lin|head)\.", err), err


def test_apply_measurements_and_budget_warnings_are_reported(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    # The planner's bytes overstated 100-fold: the saving measured by
    # mutwo.apply falls short of the plan and apply warns (BudgetWarning);
    # verify reports both and still judges by the measured peak.
    path = write_schedule(tmp_path, load(model_py, "make"), "big.json",
                          [FEATURES], budget_bytes=1 << 30)
    v0 = json.loads(path.read_text())
    for d in v0["decisions"]:
        if d.get("action") == "RECOMPUTE":
            d["size_bytes"] = str(10 << 20)
    path.write_text(json.dumps(v0))
    code, out, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                         str(path), "--batch", "4",
                                         "--output", "json"])
    assert code == 0, err
    v = json.loads(out)
    m = v["apply_measurements"]
    assert m["planned_saving_bytes"] == 6 * (10 << 20)
    assert 0 < m["saving_bytes"] < m["planned_saving_bytes"]
    assert m["saving_fraction"] < 0.01
    assert len(v["apply_warnings"]) == 1
    assert "the budget 1.00 GiB may not hold" in v["apply_warnings"][0]


def test_decisions_matching_no_saved_tensor_exit_2_naming_them(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    # block.lin's output is multiplied by a Python number: autograd saves
    # no tensor of it, so mutwo.apply (strict) refuses the schedule in the
    # first forward, before any backward.
    schedule = write_schedule(
        tmp_path, load(model_py, "make_stateful"), "nothing.json",
        [(0, ["block.lin"], ["block"])], budget_bytes=1 << 30)
    code, out, err = run_verify(capsys, [f"{model_py}:make_stateful",
                                         "--schedule", str(schedule),
                                         "--batch", "4"])
    assert code == 2
    assert out == ""
    assert "does not fit the forward of" in err
    assert "matched no tensor autograd saved" in err
    assert "RECOMPUTE block.lin aten::linear" in err


def test_an_infeasible_schedule_exits_3_and_runs_nothing(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "inf.json",
                              [FEATURES], budget_bytes=1000, feasible=False,
                              floor_bytes=500_000)
    code, out, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                         str(schedule)])
    assert code == 3
    assert out == ""
    assert "below the floor 488.28 KiB" in err and "--force" in err
    # --force runs it, mutwo.apply with force=True (and it does not hold:
    # 1000 B).
    code, out, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                         str(schedule), "--force"])
    assert code == 1 and "(EXCEEDED)" in out
    assert "gradients       match" in out
    assert "forced          the planner marked this schedule infeasible" \
        in out
    assert "exceeds the budget 1000 B" in err


@pytest.mark.parametrize("spec_of, message", [
    (lambda p: str(p), "expected MODEL_PY:FACTORY"),
    (lambda p: f"{p.parent}/nope.py:make", "nope.py\": no such file"),
    (lambda p: f"{p}:make_model", 'has no function "make_model"; it defines '),
    (lambda p: f"{p}:not_a_model", "not_a_model() returned int, expected an "
                                   "nn.Module"),
    (lambda p: f"{p}:broken", "broken() raised RuntimeError: weights file "
                              "missing"),
])
def test_a_bad_model_factory_exits_2_naming_what_was_wrong(
        model_py: Path, tmp_path: Path, capsys: Any, spec_of: Any,
        message: str) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "ok.json",
                              [FEATURES], budget_bytes=1 << 30)
    code, out, err = run_verify(capsys, [spec_of(model_py), "--schedule",
                                         str(schedule)])
    assert code == 2
    assert message in err
    assert out == ""


def test_a_model_file_that_fails_to_import_exits_2(
        tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = 1 / 0\n")
    schedule = tmp_path / "s.json"
    schedule.write_text(json.dumps({"batch_size": 2, "feasible": True}))
    code, _, err = run_verify(capsys, [f"{bad}:make", "--schedule",
                                       str(schedule)])
    assert code == 2
    assert 'importing "' in err and "ZeroDivisionError" in err


def test_a_schedule_of_another_model_exits_2(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    other = write_schedule(tmp_path, load(model_py, "make_stateful"),
                           "other.json", [(0, ["block.lin"], ["block"])],
                           budget_bytes=1 << 30)
    code, _, err = run_verify(capsys, [f"{model_py}:make", "--schedule",
                                       str(other)])
    assert code == 2
    assert "planned for another model" in err


def test_inputs_from_specs_without_a_batch_function(
        model_py: Path, tmp_path: Path, capsys: Any) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "ok.json",
                              [FEATURES], budget_bytes=1 << 30)
    code, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(schedule), "--batch", "2",
        "--inputs", "x:float32[B,3,16,16]",
        "--loss", "cross_entropy:y:int64[B]{0,10}"])
    assert code == 0, err
    assert "batch size      2" in out
    code, _, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(schedule),
        "--inputs", "x:float32[B,3,16"])
    assert code == 2 and 'input spec "x:float32[B,3,16"' in err


def test_the_module_entry_point_and_its_help() -> None:
    env = dict(os.environ)
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), str(here)])
    p = subprocess.run([sys.executable, "-m", "mutwo", "verify", "--help"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0
    assert "MODEL_PY:FACTORY" in p.stdout and "exit codes" in p.stdout
    p = subprocess.run([sys.executable, "-m", "mutwo", "verify", "m.py:f"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "--schedule" in p.stderr


DATA = Path(__file__).resolve().parent / "data"
# Planned by the real planner for the model above (`make`), batch 32, SGD,
# on this CPU tier (LibTorch 1.13): the model scripted
# (torch.jit.script(make()).save("net.pt")), then
#   mutwo-worker profile net.pt --input 'x:float32[B,3,16,16]' \
#     --loss 'cross_entropy:y:int64[B]{0,10}' --batch 32 --device cpu \
#     --optimizer sgd --output json > p.json
#   mutwo plan p.json --budget 80% --output json   (feasible, 2.42 MiB)
#   mutwo plan p.json --budget 60% --output json   (below the floor, exit 3)
# `mutwo-worker execute` of the 80% schedule measured 3.03 MiB unmodified,
# 2.28 MiB scheduled.


def test_a_planned_schedule_holds_on_the_eager_model(
        model_py: Path, capsys: Any) -> None:
    code, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule",
        str(DATA / "verify_net_b32_80pct.schedule.json"), "--optimizer",
        "sgd", "--output", "json"])
    assert code == 0, err
    v = json.loads(out)
    assert v["batch_size"] == 32  # the schedule's
    assert v["within_budget"] and v["gradients_match"]
    # The CPU measure agrees with the worker's counting allocator on the
    # prediction (2.28 MiB predicted and executed) within 5%.
    assert v["scheduled"]["peak_bytes"] == pytest.approx(
        v["predicted"]["peak_bytes"], rel=0.05)
    assert v["scheduled"]["peak_bytes"] < 0.85 * v["baseline"]["peak_bytes"]
    # mutwo.apply's measurements of the first scheduled step: the saved
    # tensors it dropped against what the planner expected gone.
    m = v["apply_measurements"]
    planned = sum(d.size_bytes for d in mutwo.Schedule.from_json(
        str(DATA / "verify_net_b32_80pct.schedule.json")).decisions
        if d.action in ("RECOMPUTE", "SWAP"))
    assert m["planned_saving_bytes"] == planned > 0
    assert m["saving_bytes"] == (m["unmodified_saved_bytes"] -
                                 m["saved_bytes"])
    assert m["saving_fraction"] == pytest.approx(
        m["saving_bytes"] / planned)
    assert m["saving_fraction"] >= 0.9, m
    assert m["first_step_peak_bytes"] is None  # CUDA only
    assert v["apply_warnings"] == []


def test_a_planned_infeasible_schedule_exits_3(
        model_py: Path, capsys: Any) -> None:
    code, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule",
        str(DATA / "verify_net_b32_60pct.schedule.json")])
    assert code == 3 and out == ""
    assert "is infeasible: the budget 1.82 MiB is below the floor 2.08 MiB" \
        in err


def test_loss_reads_the_output_named_with_at_and_refuses_guessing() -> None:
    """`KIND@OUTPUT` selects a dict entry or tuple element, as the worker
    does; cross_entropy over an output with floating-point tensors in
    several entries is refused, naming them, instead of reading the
    first."""
    from types import SimpleNamespace

    from mutwo import _verify
    user = SimpleNamespace(loss_fn=None)
    y = torch.tensor([1, 2, 3, 4])
    logits, aux = torch.randn(4, 10), torch.randn(4, 10)
    out = {"logits": logits, "aux": aux, "ids": y}
    spec = mutwo.parse_loss("cross_entropy@aux:y:int64[B]{0,10}")
    assert spec.output == "aux" and spec.target.name == "y"
    loss = _verify.make_loss(user, "cross_entropy@aux:y:int64[B]{0,10}", y)
    assert torch.equal(loss(out), F.cross_entropy(aux, y))
    guess = _verify.make_loss(user, "cross_entropy:y:int64[B]{0,10}", y)
    with pytest.raises(_verify.UsageError) as e:
        guess(out)
    assert "logits [4, 10], aux [4, 10]" in str(e.value)
    assert "cross_entropy@logits" in str(e.value)
    with pytest.raises(_verify.UsageError, match=r"entries \(0 \[4, 10\], 1"):
        guess((logits, aux))
    # One floating-point entry, or a plain tensor: nothing to choose.
    assert torch.equal(guess({"logits": logits, "ids": y}),
                       F.cross_entropy(logits, y))
    assert torch.equal(guess(logits), F.cross_entropy(logits, y))
    mean = _verify.make_loss(user, "mean@1", None)
    assert torch.equal(mean((logits, aux)), aux.mean())
    with pytest.raises(_verify.UsageError, match='no key "x"'):
        _verify.make_loss(user, "sum@x", None)(out)
    with pytest.raises(ValueError, match="after '@'"):
        mutwo.parse_loss("mean@")


def test_the_step_the_schedule_was_planned_for_is_used_and_kept(
        tmp_path: Path, capsys: Any) -> None:
    """A schedule records the step it was planned for (inputs, loss,
    optimizer, from the profile). Without flags verify runs that step (the
    model file below has no batch or loss function); a flag that says
    otherwise is refused with exit 2 naming both, as `mutwo-worker
    execute` refuses it: a peak measured for another loss or optimizer
    says nothing about the planned one."""
    from mutwo import _specs
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    '''))
    model = load(path, "make")
    s = make_schedule(model, recompute=[(0, ["1"], [])]).proto
    s.batch_size, s.budget_bytes, s.feasible = 4, 1 << 30, True
    s.inputs.append(_specs.parse_tensor_spec("x:float32[B,3,16,16]"))
    s.loss.CopyFrom(_specs.parse_loss("cross_entropy:y:int64[B]{0,10}"))
    s.optimizer.CopyFrom(_specs.parse_optimizer("adam:lr=0.01"))
    schedule = tmp_path / "planned.json"
    schedule.write_text(json_format_message(s))
    base = [f"{path}:make", "--schedule", str(schedule), "--steps", "1"]
    code, out, err = run_verify(capsys, base)
    assert code == 0, err
    code, _, err = run_verify(capsys, base + ["--loss", "mean"])
    assert code == 2 and ("--loss mean contradicts the schedule, planned "
                          "for --loss cross_entropy:y:int64[B]{0,10}") in err
    code, _, err = run_verify(capsys, base + ["--optimizer", "sgd"])
    assert code == 2 and ("--optimizer sgd contradicts the schedule, planned "
                          "for --optimizer adam:lr=0.01") in err
    # mutwo.apply refuses a forward at another batch than the recorded
    # inputs': verify refuses the flag up front, naming both.
    code, _, err = run_verify(capsys, base + ["--batch", "2"])
    assert code == 2 and ("--batch 2 contradicts the schedule, planned for "
                          "--batch 4") in err
    code, _, err = run_verify(capsys, base + ["--inputs",
                                              "x:float32[B,3,8,8]"])
    assert code == 2 and ("--inputs x:float32[B,3,8,8] contradicts the "
                          "schedule, planned for --inputs "
                          "x:float32[B,3,16,16]") in err
    # The same step spelled out is the planned one.
    code, _, err = run_verify(capsys, base + [
        "--batch", "4",
        "--inputs", "x:float32[B,3,16,16]", "--optimizer", "adam:lr=0.01",
        "--loss", "cross_entropy:y:int64[B]{0,10}"])
    assert code == 0, err


def test_mse_and_terms_parse_format_and_compute_as_the_worker() -> None:
    """`mse:SPEC` and `+`-joined terms (or a list of them, as a repeated
    --loss) parse to the LossSpec the C++ parser makes and print back the
    same; the loss of several terms is their sum, each term against its
    own target, so its gradient is the sum of the terms' gradients."""
    from types import SimpleNamespace

    from mutwo import _specs, _verify
    from mutwo.v1 import types_pb2
    text = "cross_entropy@logits:y:int64[B]{0,10}+mse@aux:z:float32[B,4]"
    spec = mutwo.parse_loss(text)
    assert [t.kind for t in spec.terms] == [types_pb2.LossSpec.CROSS_ENTROPY,
                                            types_pb2.LossSpec.MSE]
    assert spec.terms[1].output == "aux" and spec.terms[1].target.name == "z"
    assert mutwo.format_loss(spec) == text
    assert mutwo.parse_loss(text.split("+")) == spec
    assert _specs.format_loss(mutwo.parse_loss([])) == "mean"
    job = mutwo.make_job_spec("a" * 64, ["x:float32[B,8]"], [4],
                              loss=text.split("+"))
    assert job.loss == spec
    with pytest.raises(ValueError, match='term "mse@b:z:int8'):
        mutwo.parse_loss("mean@a+mse@b:z:int8[B]{0,2}")
    with pytest.raises(ValueError, match="mse needs a target spec"):
        mutwo.parse_loss("mse")

    user = SimpleNamespace(loss_fn=None)
    torch.manual_seed(0)
    xs, targets = _verify.make_batch(user, ["x:float32[B,8]"], text, 4,
                                     "cpu", 3)
    y, z = targets
    assert y.dtype == torch.int64 and z.shape == (4, 4)
    assert int(y.max()) < 10
    logits = torch.randn(4, 10, requires_grad=True)
    aux = torch.randn(4, 4, requires_grad=True)
    out = {"logits": logits, "aux": aux}
    total = _verify.make_loss(user, text, targets)(out)
    total.backward()
    l, a = (t.detach().clone().requires_grad_() for t in (logits, aux))
    (F.cross_entropy(l, y) + F.mse_loss(a, z)).backward()
    assert torch.allclose(logits.grad, l.grad)
    assert torch.allclose(aux.grad, a.grad) and aux.grad.abs().sum() > 0

    # mse, like cross_entropy, refuses to guess among several outputs.
    with pytest.raises(_verify.UsageError) as e:
        _verify.make_loss(user, "mse:z:float32[B,4]", z)(out)
    assert ("loss mse: the model returns a dict with floating-point tensors "
            "in 2 entries (logits [4, 10], aux [4, 4]); name the output the "
            "loss reads with mse@OUTPUT, like mse@logits") in str(e.value)
    assert torch.equal(_verify.make_loss(user, "mse@aux:z:float32[B,4]", z)(
        out), F.mse_loss(aux, z))
    with pytest.raises(_verify.UsageError, match="model@OUTPUT"):
        _verify.make_loss(user, "model", None)(
            (torch.ones(()), torch.ones(1), logits))
    assert float(_verify.make_loss(user, "model", None)(
        (logits, torch.full((), 2.0)))) == 2.0


def test_chunked_cross_entropy_is_cross_entropy_without_a_log_softmax(
) -> None:
    """`mutwo.chunked_cross_entropy` (the loss `chunked_cross_entropy:SPEC`
    the worker computes): the loss and logits' gradient of F.cross_entropy
    over [B,T,V] logits, whatever the chunking, and what autograd keeps for
    its backward is the logits themselves, not a new logits-sized
    log-softmax; verify's --loss computes it; other shapes are refused,
    naming them."""
    from types import SimpleNamespace

    from mutwo import _verify
    from mutwo.v1 import types_pb2
    torch.manual_seed(0)
    logits = (torch.randn(4, 5, 11) * 3).requires_grad_()
    y = torch.randint(0, 11, (4, 5))
    ref = logits.detach().clone().requires_grad_()
    expected = F.cross_entropy(ref.reshape(-1, 11), y.reshape(-1))
    for chunk_bytes in (3 * 11 * 4, 1 << 20):
        logits.grad = None
        loss = mutwo.chunked_cross_entropy(logits, y, chunk_bytes=chunk_bytes)
        assert abs(float(loss) - float(expected)) < 1e-6
        (loss * 1.7).backward()
        ref.grad = None
        (expected * 1.7).backward(retain_graph=True)
        assert float((logits.grad - ref.grad).abs().max()) < 1e-6

    def saved_new_storage(fn: Any) -> List[int]:
        """Bytes of tensors autograd saves that are not the logits'."""
        sizes: List[int] = []
        x = logits.detach().clone().requires_grad_()

        def pack(t: Any) -> Any:
            if t.data_ptr() != x.data_ptr() and t.is_floating_point():
                sizes.append(t.numel() * t.element_size())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x)
        return sizes
    logits_bytes = logits.numel() * 4
    assert max(saved_new_storage(lambda x: F.cross_entropy(
        x.reshape(-1, 11), y.reshape(-1)))) >= logits_bytes

    # reuse_logits: the gradient lands in the logits' memory and is
    # F.cross_entropy's; a leaf's memory is never written over.
    h = (torch.randn(4, 5, 11)).requires_grad_()
    h_ref = h.detach().clone().requires_grad_()
    F.cross_entropy((h_ref * 3).reshape(-1, 11), y.reshape(-1)).backward()
    out = h * 3
    seen: List[int] = []
    out.register_hook(lambda g: seen.append(g.data_ptr()))
    mutwo.chunked_cross_entropy(out, y, chunk_bytes=3 * 11 * 4,
                                reuse_logits=True).backward()
    assert seen == [out.data_ptr()]
    assert float((h.grad - h_ref.grad).abs().max()) < 1e-6
    leaf = logits.detach().clone().requires_grad_()
    mutwo.chunked_cross_entropy(leaf, y, reuse_logits=True).backward()
    assert torch.equal(leaf.detach(), logits.detach())
    assert sum(saved_new_storage(
        lambda x: mutwo.chunked_cross_entropy(x, y))) < logits_bytes

    spec = mutwo.parse_loss("chunked_cross_entropy:y:int64[B,5]{0,11}")
    assert spec.kind == types_pb2.LossSpec.CHUNKED_CROSS_ENTROPY
    assert mutwo.format_loss(spec) == "chunked_cross_entropy:y:int64[B,5]{0,11}"
    user = SimpleNamespace(loss_fn=None)
    for text in ("chunked_cross_entropy:y:int64[B,5]{0,11}",
                 "chunked_cross_entropy"):
        fn = _verify.make_loss(user, text, y)
        assert abs(float(fn(logits)) - float(expected)) < 1e-6
    with pytest.raises(_verify.UsageError,
                       match=r"output shape \[2, 4, 3, 3\] does not fit "
                             r"target shape \[2, 3, 3\].*use cross_entropy"):
        _verify.make_loss(user, "chunked_cross_entropy",
                          torch.zeros(2, 3, 3, dtype=torch.int64))(
            torch.randn(2, 4, 3, 3))
    with pytest.raises(ValueError, match="chunked_cross_entropy target holds "
                                         "class indices"):
        mutwo.parse_loss("chunked_cross_entropy:y:float32[B]")


# verify_lm_b8_75pct_chunked.schedule.json: TinyLM above, planned with the
# chunked loss on this CPU tier (LibTorch 1.13):
#   mutwo-worker profile lm.pt --input 'tokens:int64[B,32]{0,1000}' \
#     --loss 'chunked_cross_entropy:y:int64[B,32]{0,1000}' --batch 8 \
#     --device cpu --optimizer sgd --output json > p.json
#   mutwo plan p.json --budget 75% --output json
# (budget 4.18 MiB; 2 RECOMPUTE decisions, mlp.0 and mlp.1). The worker's
# unmodified step peaks 5.84 MB with this loss (the logits' gradient written
# over the logits), 7.73 MB with torch's cross_entropy; `mutwo-worker
# execute` of the schedule measured 3.68 MiB as predicted, and verify
# 3.68 MiB.


def test_a_schedule_planned_with_the_chunked_loss_holds_in_the_eager_loop(
        model_py: Path, capsys: Any) -> None:
    """The user's path with the loss inside the plan: verify computes the
    schedule's chunked_cross_entropy (mutwo.chunked_cross_entropy) in the
    eager loop under mutwo.apply, writing the logits' gradient over the
    logits as the worker does; every decision applies, the peak is within
    the budget and close to the worker's prediction, gradients equal."""
    schedule = DATA / "verify_lm_b8_75pct_chunked.schedule.json"
    code, out, err = run_verify(capsys, [
        f"{model_py}:make_lm", "--schedule", str(schedule), "--optimizer",
        "sgd", "--output", "json"])
    assert code == 0, err
    v = json.loads(out)
    assert v["within_budget"] and v["gradients_match"], v
    assert v["scheduled"]["peak_bytes"] == pytest.approx(
        v["predicted"]["peak_bytes"], rel=0.05)
    assert v["scheduled"]["peak_bytes"] < 0.85 * v["baseline"]["peak_bytes"]
    m = v["apply_measurements"]
    assert m["saving_fraction"] >= 0.9, m
    assert v["apply_warnings"] == []
    # mutwo.apply itself says which loss the plan counts on.
    applied = mutwo.apply(load(model_py, "make_lm"),
                          mutwo.Schedule.from_json(str(schedule)))
    assert "mutwo.chunked_cross_entropy(logits, target, reuse_logits=True)" \
        in applied.report()
    applied.remove()


# --mode compile (PyTorch >= 2.4) on torch 1.13: stand-ins for selective
# checkpointing (each frame's forward runs as it is, its policy asked about
# every op it dispatches, as eager SAC asks) and for torch.compile (the
# module itself), so the command's flow runs here: the compiled unmodified
# model as the baseline, the policy's model beside it.
def stand_in_compile(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    import types
    import torch.utils.checkpoint as ckpt
    from torch.utils._python_dispatch import TorchDispatchMode
    calls: List[str] = []
    monkeypatch.setattr(ckpt, "CheckpointPolicy", types.SimpleNamespace(
        MUST_SAVE=1, PREFER_SAVE=2, MUST_RECOMPUTE=3, PREFER_RECOMPUTE=4),
        raising=False)
    monkeypatch.setattr(ckpt, "create_selective_checkpoint_contexts",
                        lambda policy, **k: policy, raising=False)

    class Ask(TorchDispatchMode):
        def __init__(self, policy: Any) -> None:
            super().__init__()
            self.policy = policy

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            self.policy(types.SimpleNamespace(is_recompute=False), func,
                        *args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    def checkpoint(fn: Any, *args: Any, use_reentrant: bool,
                   context_fn: Any, **kwargs: Any) -> Any:
        with Ask(context_fn()):
            return fn(*args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint", checkpoint)

    def compile_(module: Any, **kwargs: Any) -> Any:
        calls.append("compile")
        return module

    monkeypatch.setattr(torch, "compile", compile_, raising=False)
    # Only what verify calls is replaced: torch itself reads the rest
    # (torch 2.11's manual_seed asks torch.compiler.is_exporting()).
    compiler = getattr(torch, "compiler", None)
    if compiler is None:
        compiler = types.SimpleNamespace()
        monkeypatch.setattr(torch, "compiler", compiler, raising=False)
    monkeypatch.setattr(compiler, "reset", lambda: calls.append("reset"),
                        raising=False)
    monkeypatch.setattr(compiler, "disable", lambda f, **k: f,
                        raising=False)
    return calls


@pytest.mark.parametrize("budget,code", [(1 << 30, 0), (1000, 1)])
def test_mode_compile_measures_the_compiled_step_beside_compiles_own(
        model_py: Path, tmp_path: Path, capsys: Any,
        monkeypatch: pytest.MonkeyPatch, budget: int, code: int) -> None:
    calls = stand_in_compile(monkeypatch)
    schedule = write_schedule(tmp_path, load(model_py, "make"), "s.json",
                              [FEATURES], budget_bytes=budget)
    got, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(schedule), "--batch", "4",
        "--mode", "compile", "--output", "json"])
    assert got == code, err
    v = json.loads(out)
    assert v["mode"] == "compile"
    # Compiled twice: the unmodified model, then with the policy's frames.
    assert calls == ["compile", "reset", "compile"]
    assert v["gradients_match"], v
    assert v["baseline"]["peak_bytes"] > 100_000
    assert v["scheduled"]["peak_bytes"] > 100_000
    assert v["decisions_unmatched"] == 0
    assert "mutwo torch.compile policy: 1 checkpointed frames" in \
        v["apply_report"]
    if code:
        assert "exceeds the budget 1000 B" in err
    got, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(schedule), "--batch", "4",
        "--mode", "compile"])
    assert "mode            torch.compile" in out


def test_mode_compile_refuses_swaps_and_old_pytorch_before_running(
        model_py: Path, tmp_path: Path, capsys: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = write_schedule(tmp_path, load(model_py, "make"), "s.json",
                              [FEATURES], budget_bytes=1 << 30)
    args = [f"{model_py}:make", "--schedule", str(schedule), "--batch", "4",
            "--mode", "compile"]
    import torch.utils.checkpoint as ckpt
    if not hasattr(ckpt, "create_selective_checkpoint_contexts"):
        code, out, err = run_verify(capsys, args)
        assert code == 2 and out == ""
        assert "--mode compile: mutwo._compile.apply_compiled needs " \
            "PyTorch >= 2.4" in err, err
    stand_in_compile(monkeypatch)
    s = make_schedule(load(model_py, "make"), swap=["features.2"]).proto
    s.batch_size, s.budget_bytes = 4, 1 << 30
    swapped = tmp_path / "swap.json"
    swapped.write_text(json_format_message(s))
    code, out, err = run_verify(capsys, [
        f"{model_py}:make", "--schedule", str(swapped), "--batch", "4",
        "--mode", "compile"])
    assert code == 2 and out == "", err
    assert "the schedule swaps 1 activations" in err, err
    assert "selective checkpointing cannot move tensors to the host" in err


def test_the_optimizer_updates_as_planned() -> None:
    """verify's optimizer holds the update's temporaries the schedule was
    planned with: `:foreach`, torch.optim's foreach (all parameters at
    once); without, not foreach (on CUDA Adam's fused kernel), where
    torch.optim's default on CUDA would be foreach, over the plan where the
    optimizer step sets the peak."""
    from mutwo import _specs
    from mutwo._verify import UsageError, _optimizer_text, make_optimizer
    w = [torch.zeros(3, requires_grad=True)]
    assert make_optimizer("adam:foreach", w).defaults["foreach"] is True
    assert make_optimizer("adamw", w).defaults["foreach"] is False
    # Weight decay as the worker's: the spec's, 0 when unset.
    assert make_optimizer("adamw", w).defaults["weight_decay"] == 0
    assert make_optimizer("adamw:weight_decay=0.1",
                          w).defaults["weight_decay"] == pytest.approx(0.1)
    assert make_optimizer("sgd_momentum:foreach", w).defaults["foreach"]
    assert make_optimizer("sgd", w).defaults["foreach"] is False
    assert _optimizer_text(_specs.parse_optimizer(
        "adam:lr=0.01,foreach")) == "adam:lr=0.01,foreach"
    with pytest.raises(UsageError, match="or foreach"):
        make_optimizer("adam:fused", w)


def test_other_warnings_pass_through_the_measured_steps() -> None:
    """A warning that is not apply's (PyTorch's note on a CUDA kernel
    without a deterministic implementation, AlexNet on an H200) is warned
    again after the steps, and apply's are collected: re-warned inside
    the recording, each was recorded again, and verify never ended."""
    import signal
    import warnings
    from mutwo._verify import _budget_warnings

    def stuck(*_: Any) -> None:
        raise TimeoutError("_budget_warnings did not return")
    before = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        into: List[Any] = []
        with warnings.catch_warnings(record=True) as outer:
            warnings.simplefilter("always")
            with _budget_warnings(into):
                warnings.warn("no deterministic kernel", UserWarning)
                warnings.warn("over the budget", mutwo.BudgetWarning)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert [str(w.message) for w in into] == ["over the budget"]
    assert [str(w.message) for w in outer] == ["no deterministic kernel"]
