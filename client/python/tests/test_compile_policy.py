"""mutwo._compile: a schedule's decisions as a selective-checkpointing
policy for torch.compile. The policy table (decision -> frame, module, op,
occurrence, policy) is pure and tested here on torch 1.13; the ops a real
eager forward dispatches (recorded with a TorchDispatchMode, as SAC's
policy sees them) are fed to the policy to check that every decision
finds its op. The compile path itself needs PyTorch >= 2.4 (GPU machine:
bench/anchors/anchors.py --systems mutwo_compile)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest
import torch
import torchvision
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import mutwo
from mutwo import _compile
from mutwo._compile import (MUST_RECOMPUTE, MUST_SAVE, PREFER_RECOMPUTE,
                            UnsupportedScheduleError, dispatch_ops,
                            policy_table)
from schedules import make_schedule

DATA = Path(__file__).resolve().parent / "data"


def resnet() -> nn.Module:
    torch.manual_seed(1)
    return torchvision.models.resnet18(num_classes=10).train()


def record_ops(model: nn.Module, *inputs: Any) -> List[Tuple[str, Optional[str]]]:
    """(op name, innermost running module) of every op the forward
    dispatches below autograd, in order."""
    stack: List[str] = []
    handles = []
    for path, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(
            lambda _m, _a, path=path: stack.append(path)))
        handles.append(m.register_forward_hook(
            lambda _m, _a, _o: None if stack.pop() else None))
    seen: List[Tuple[str, Optional[str]]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func.overloadpacket.__name__,
                         stack[-1] if stack else None))
            return func(*args, **(kwargs or {}))

    with Record():
        model(*inputs)
    for h in handles:
        h.remove()
    return seen


def simulate(frame: _compile.FramePolicy,
             ops: List[Tuple[str, Optional[str]]],
             know_module: bool = True) -> Tuple[_compile._Runtime, List[str]]:
    """Runs the frame's policy over the ops the frame's module runs."""
    rt = _compile._Runtime(set())
    policy = _compile._Policy(frame, rt, frame.by_module(), frame.by_frame())
    answers = [policy.decide(name, module if know_module else None, False)
               for name, module in ops
               if module is not None and _compile._inside(module, frame.path)]
    return rt, answers


def unmatched(frame: _compile.FramePolicy, rt: _compile._Runtime) -> List[str]:
    return [f"{r.module_path} {r.decision.op_kind}" for r in frame.rows
            if (r.frame, r.module_path, r.decision.producer_node)
            not in rt.matched]


def test_dispatch_names_of_torchscript_kinds() -> None:
    assert dispatch_ops("aten::conv2d") == ("convolution",)
    assert "native_batch_norm" in dispatch_ops("aten::batch_norm")
    assert "addmm" in dispatch_ops("aten::linear")
    assert dispatch_ops("aten::gelu") == ("gelu",)
    # In-place kinds: also the functional op torch.compile traces.
    assert dispatch_ops("aten::relu_") == ("relu_", "relu")
    assert dispatch_ops("aten::dropout") == ("native_dropout",)


def test_frames_and_rows_of_a_resnet_schedule() -> None:
    model = resnet()
    schedule = make_schedule(model, recompute=[
        (0, ["layer1.0.conv1", "layer1.0.bn1"], []),
        (1, ["layer2.0.bn2", "layer2.1.conv1", "layer2.1.bn1"],
         ["layer2.0.conv2"])])
    frames = policy_table(model, schedule)
    # layer1.0 is a block; layer2[0:2] (a child range) widens to layer2.
    assert [(f.path, f.label) for f in frames] == [
        ("layer1.0", "layer1.0"), ("layer2", "layer2[0:2]")]
    rows = {r.module_path: r for r in frames[0].rows}
    assert rows["layer1.0.conv1"].policy == MUST_RECOMPUTE
    assert rows["layer1.0.conv1"].ops == ("convolution",)
    assert rows["layer1.0.bn1"].policy == MUST_RECOMPUTE
    # Everything else in the frame the schedule retains is saved.
    assert rows["layer1.0.conv2"].policy == MUST_SAVE
    assert rows["layer1.0.bn2"].policy == MUST_SAVE
    # Decisions outside every frame are not the policy's (not checkpointed).
    assert all(r.module_path.startswith("layer2") for r in frames[1].rows)
    assert not any(r.module_path.startswith("layer3")
                   for f in frames for r in f.rows)
    assert frames[1].by_module()[("layer2.1.bn1", "native_batch_norm",
                                  0)].policy == MUST_RECOMPUTE


def test_every_decision_finds_the_op_the_forward_dispatches() -> None:
    model = resnet()
    schedule = make_schedule(model, recompute=[
        (0, ["layer1.0.conv1", "layer1.0.bn1"], []),
        (1, ["layer2.0.bn2", "layer2.1.conv1", "layer2.1.bn1"],
         ["layer2.0.conv2"])])
    ops = record_ops(model, torch.randn(2, 3, 32, 32))
    for frame in policy_table(model, schedule):
        rt, answers = simulate(frame, ops)
        # make_schedule names one op per module; a module that runs no
        # op of its kind in its own forward (the block's "aten::add"
        # stand-in, Sequential containers) has nothing to match.
        missing = [m for m in unmatched(frame, rt)
                   if not m.endswith("aten::add")]
        assert missing == []
        assert answers.count(MUST_RECOMPUTE) == sum(
            r.policy == MUST_RECOMPUTE for r in frame.rows)


def test_a_planned_schedule_matches_the_eager_ops() -> None:
    """The real planner's schedule of client/python/tests/test_verify.py's
    model (batch 32, 80%): each decision inside a frame is one dispatched
    op, recomputed or saved as planned."""
    from test_verify import MODEL_PY
    scope: dict = {}
    exec(MODEL_PY, scope)
    model = scope["make"]()
    schedule = mutwo.Schedule.from_json(
        str(DATA / "verify_net_b32_80pct.schedule.json"))
    frames = policy_table(model, schedule)
    assert [f.label for f in frames] == ["features[0:6]"] or \
        [f.path for f in frames] == ["features"]
    ops = record_ops(model, torch.randn(2, 3, 16, 16))
    for frame in frames:
        rt, answers = simulate(frame, ops)
        assert unmatched(frame, rt) == []
        recomputed = {d.module_path for d in schedule.recomputed}
        assert {r.module_path for r in frame.rows
                if r.policy == MUST_RECOMPUTE} == recomputed
        # Without module information the frame-wide count finds the same
        # ops here (every conv/bn/relu output of the frame is an
        # activation).
        rt2, answers2 = simulate(frame, ops, know_module=False)
        assert answers2 == answers


class TwoAdds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + x) + x


def two_adds_schedule(model: nn.Module, recompute_second: bool
                      ) -> mutwo.Schedule:
    from mutwo.v1 import types_pb2
    s = types_pb2.Schedule(feasible=True, batch_size=2, graph_fingerprint="t")
    for node, (path, kind) in enumerate([("a", "aten::linear"),
                                         ("", "aten::add"),
                                         ("b", "aten::linear"),
                                         ("", "aten::add")]):
        d = s.decisions.add(value_id=node, producer_node=node,
                            module_path=path, op_kind=kind, size_bytes=64,
                            action=types_pb2.Decision.RETAIN)
        if recompute_second and node == 3 or node == 0:
            d.action = types_pb2.Decision.RECOMPUTE
            d.segment = node
            d.recompute_module_paths.append(path)
    return mutwo.Schedule.from_proto(s)


def test_occurrences_count_per_module_in_graph_order() -> None:
    model = TwoAdds()
    frames = policy_table(model, two_adds_schedule(model, True))
    assert [f.path for f in frames] == [""]
    adds = [r for r in frames[0].rows if r.module_path == ""]
    assert [(r.occurrence, r.policy) for r in adds] == [
        (0, MUST_SAVE), (1, MUST_RECOMPUTE)]
    rt, answers = simulate(frames[0], record_ops(model, torch.randn(2, 4)))
    assert unmatched(frames[0], rt) == []
    # a's addmm recomputed, the first add saved, b's addmm saved, the
    # second add recomputed; views and transposes left to the compiler.
    decided = [a for a in answers if a != PREFER_RECOMPUTE]
    assert decided == [MUST_RECOMPUTE, MUST_SAVE, MUST_SAVE, MUST_RECOMPUTE]


def test_swap_decisions_are_refused_naming_count_and_bytes() -> None:
    model = resnet()
    schedule = make_schedule(model, recompute=[(0, ["layer1.0.conv1"], [])],
                             swap=["layer3.0.conv1", "layer4.1.conv2"],
                             size_bytes=1024)
    with pytest.raises(UnsupportedScheduleError,
                       match=r"swaps 2 activations \(2.00 KiB: "
                             r"'layer3.0.conv1', 'layer4.1.conv2'\).*"
                             r'swaps="ignore"'):
        policy_table(model, schedule)
    frames = policy_table(model, schedule, swaps="ignore")
    # A leaf module's frame reaches its block: torch's checkpoint keeps a
    # region's output, and conv1's output is what layer1.0.bn1 saves.
    assert [(f.path, f.label) for f in frames] == [
        ("layer1.0", "layer1.0 (for layer1.0.conv1)")]
    saved = {r.module_path for r in frames[0].rows if r.policy == MUST_SAVE}
    assert "layer3.0.conv1" not in saved  # outside the frame: kept anyway
    with pytest.raises(ValueError, match='swaps="drop"'):
        policy_table(model, schedule, swaps="drop")


def test_nested_frames_join_the_outermost() -> None:
    model = resnet()
    # conv1 (the stem) and layer1.0.conv1 in one segment: the model's own
    # forward is the frame; a block segment inside it joins it.
    schedule = make_schedule(model, recompute=[
        (0, ["conv1", "layer1.0.conv1"], []),
        (1, ["layer2.0.conv1"], [])])
    frames = policy_table(model, schedule)
    assert [f.path for f in frames] == [""]
    policies = {r.module_path: r.policy for r in frames[0].rows}
    assert policies["layer2.0.conv1"] == MUST_RECOMPUTE
    assert policies["fc"] == MUST_SAVE


def test_another_models_schedule_is_refused() -> None:
    with pytest.raises(mutwo.ScheduleMismatchError):
        policy_table(resnet(), make_schedule(TwoAdds()))


def test_compile_module_paths_are_normalized() -> None:
    n = _compile._normalize_module_path
    assert n("L['self'].layer1[0].conv1") == "layer1.0.conv1"
    assert n("L['self']._modules['fc']") == "fc"
    assert n("getattr(L['self'].layer1, '0').bn1") == "layer1.0.bn1"
    assert n("L['self']") == ""
    assert n("layer1.0.conv1") == "layer1.0.conv1"


def test_a_compile_module_path_through_the_checkpointed_forward(
        monkeypatch: Any) -> None:
    """Under torch.compile the policy reads the module from
    nn_module_stack. When the compiler reached a module through the
    checkpointed function (the frame's forward, bound to the frame's module:
    how a frame that is the whole model is seen under torch 2.11), the path
    is relative to the frame's module; a path naming no module is None and
    shows in the report."""
    from torch.fx import traceback as fx_traceback
    rt = _compile._Runtime({"", "encoder", "encoder.layers.0",
                            "encoder.layers.0.linear1", "linear1"})
    through = "L['forward'].__closure__[2].cell_contents.__self__"

    def at(raw: str, frame: Optional[str] = "") -> Optional[str]:
        monkeypatch.setattr(fx_traceback, "current_meta", {
            "nn_module_stack": {"k": (raw, object)}}, raising=False)
        return rt.module_now(frame)
    assert at("L['self'].encoder.layers[0]") == "encoder.layers.0"
    assert at(through + ".encoder.layers[0].linear1") == \
        "encoder.layers.0.linear1"
    assert at(through) == ""
    assert at(through + ".linear1", "encoder.layers.0") == \
        "encoder.layers.0.linear1"
    assert rt.unknown is None
    assert at(through + ".decoder") is None
    assert rt.unknown == through + ".decoder"


@pytest.mark.skipif(hasattr(torch.utils.checkpoint, "CheckpointPolicy"),
                    reason="this torch has selective checkpointing")
def test_old_torch_is_told_what_is_needed() -> None:
    model = resnet()
    with pytest.raises(RuntimeError, match=r"needs PyTorch >= 2.4.*this is "
                       r"torch " + torch.__version__.replace("+", r"\+")):
        _compile.apply_compiled(model, make_schedule(model))


def infeasible(schedule: mutwo.Schedule) -> mutwo.Schedule:
    s = type(schedule.proto)()
    s.CopyFrom(schedule.proto)
    s.feasible = False
    s.budget_bytes, s.floor_bytes = 1000, 500_000
    return mutwo.Schedule.from_proto(s)


@pytest.mark.skipif(hasattr(torch.utils.checkpoint, "CheckpointPolicy"),
                    reason="this torch has selective checkpointing")
def test_apply_mode_compile_dispatches_to_apply_compiled() -> None:
    """mutwo.apply(mode="compile") is apply_compiled: on torch < 2.4 the
    same RuntimeError naming the version, and the model is left as it
    was."""
    model = resnet()
    schedule = make_schedule(model, recompute=[(0, ["layer1.0.conv1"], [])])
    with pytest.raises(RuntimeError, match=r"needs PyTorch >= 2.4.*this is "
                       r"torch " + torch.__version__.replace("+", r"\+")):
        mutwo.apply(model, schedule, mode="compile")
    assert _compile.compiled_schedule_of(model) is None
    assert "forward" not in model.layer1[0].__dict__
    # Forced past the infeasible check, the version is what stops it.
    with pytest.raises(RuntimeError, match=r"needs PyTorch >= 2.4"):
        mutwo.apply(model, infeasible(schedule), mode="compile", force=True)


def test_apply_mode_compile_refuses_what_eager_apply_refuses() -> None:
    model = resnet()
    schedule = make_schedule(model, recompute=[(0, ["layer1.0.conv1"], [])])
    # Infeasible: refused before anything else, as in eager mode.
    with pytest.raises(mutwo.InfeasibleScheduleError,
                       match="force=True"):
        mutwo.apply(model, infeasible(schedule), mode="compile")
    # Eager-only options are refused, not silently dropped.
    with pytest.raises(TypeError, match=r"skip_retained apply to "
                       r"mode=\"eager\""):
        mutwo.apply(model, schedule, mode="compile", skip_retained=False)
    with pytest.raises(TypeError, match="prefetch_ahead"):
        mutwo.apply(model, schedule, mode="compile", prefetch_ahead=4)
    with pytest.raises(ValueError, match="mode 'jit'"):
        mutwo.apply(model, schedule, mode="jit")
    assert _compile.compiled_schedule_of(model) is None


# On PyTorch >= 2.4 (the GPU machine): the policy run by torch's selective
# checkpointing, eager and under torch.compile.
needs_sac = pytest.mark.skipif(
    not hasattr(torch.utils.checkpoint, "CheckpointPolicy"),
    reason="selective activation checkpointing needs PyTorch >= 2.4")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(self.act(self.fc1(x))))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def mlp_step(model: nn.Module, step_model: Any, device: str
             ) -> Tuple[float, dict]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 32, generator=g).to(device)
    y = torch.randint(0, 4, (8,), generator=g).to(device)
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(step_model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone()
                         for n, p in model.named_parameters()}


def assert_same_grads(a: dict, b: dict, rtol: float) -> None:
    scale = max(g.abs().max().item() for g in a.values())
    for name in a:
        diff = (a[name] - b[name]).abs().max().item()
        assert diff <= 1e-6 + rtol * scale, f"gradient of {name}: {diff}"


def mlp_schedule(model: nn.Module) -> mutwo.Schedule:
    return make_schedule(model, recompute=[
        (0, ["blocks.0.fc1", "blocks.0.act"], []),
        (1, ["blocks.1.fc1", "blocks.1.act"], [])])


@needs_sac
def test_eager_selective_checkpointing_keeps_the_gradients() -> None:
    torch.manual_seed(0)
    model = Mlp()
    plain = copy.deepcopy(model)
    _compile.apply_compiled(model, mlp_schedule(model))
    handle = _compile.compiled_schedule_of(model)
    assert [f.path for f in handle.frames] == ["blocks.0", "blocks.1"]
    _, grads_a = mlp_step(plain, plain, "cpu")
    _, grads_b = mlp_step(model, model, "cpu")
    assert_same_grads(grads_a, grads_b, 1e-5)
    # Every decision inside a frame found its op (fc -> addmm, GELU ->
    # gelu, the block's residual add, LayerNorm -> native_layer_norm).
    assert handle.unmatched() == [], handle.report()
    handle.remove()
    assert _compile.compiled_schedule_of(model) is None
    assert "forward" not in model.blocks[0].__dict__


@needs_sac
def test_under_torch_compile_the_policy_finds_its_ops() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Mlp().to(device)
    plain = copy.deepcopy(model)
    _compile.apply_compiled(model, mlp_schedule(model))
    handle = _compile.compiled_schedule_of(model)
    compiled = torch.compile(model)
    _, grads_a = mlp_step(plain, plain, device)
    _, grads_b = mlp_step(model, compiled, device)
    assert_same_grads(grads_a, grads_b, 1e-4)
    # The policy ran while the compiler traced (nn_module_stack names the
    # module, or the frame-wide count stands in) and matched every row.
    assert handle._rt.calls > 0
    assert handle.unmatched() == [], handle.report()


@needs_sac
def test_apply_mode_compile_returns_the_module_to_compile() -> None:
    torch.manual_seed(0)
    model = Mlp()
    plain = copy.deepcopy(model)
    out = mutwo.apply(model, mlp_schedule(model), mode="compile")
    assert out is model
    handle = _compile.compiled_schedule_of(model)
    assert handle is not None
    assert [f.path for f in handle.frames] == ["blocks.0", "blocks.1"]
    _, grads_a = mlp_step(plain, plain, "cpu")
    _, grads_b = mlp_step(model, torch.compile(out), "cpu")
    assert_same_grads(grads_a, grads_b, 1e-4)
    assert handle.unmatched() == [], handle.report()
    handle.remove()
    # SWAP decisions: refused, or kept on the device with swaps="ignore".
    swapping = make_schedule(model, recompute=[(0, ["blocks.0.fc1"], [])],
                             swap=["blocks.2.fc1"])
    with pytest.raises(UnsupportedScheduleError):
        mutwo.apply(model, swapping, mode="compile")
    assert mutwo.apply(model, swapping, mode="compile",
                       swaps="ignore") is model
    _compile.compiled_schedule_of(model).remove()


@needs_sac
def test_a_compiled_model_is_refused() -> None:
    model = Mlp()
    with pytest.raises(TypeError, match="before torch.compile"):
        _compile.apply_compiled(torch.compile(model), mlp_schedule(model))
