"""mutwo.apply refuses a forward that is not the step the schedule was
planned for (its recorded inputs at its batch size), before anything runs,
naming the input and both shapes, as mutwo::ScheduledStep::Run does in
C++: the schedule's budget and decisions were priced for that step only.
strict=False runs it and warns once."""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import pytest
import torch
from torch import nn

import mutwo
from schedules import make_schedule


def planned(model: nn.Module, specs: Sequence[str], batch: int,
            recompute: Sequence[str] = ("1",)) -> mutwo.Schedule:
    s = make_schedule(model, recompute=[(0, list(recompute), [])]).proto
    s.batch_size = batch
    for text in specs:
        s.inputs.append(mutwo.parse_tensor_spec(text))
    return mutwo.Schedule.from_proto(s)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))


def calls_of(model: nn.Module) -> list:
    calls: list = []
    for m in model.modules():
        m.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_a_schedule_planned_at_batch_32_refuses_a_batch_8_step() -> None:
    model = mlp()
    plain = mlp()
    applied = mutwo.apply(model, planned(model, ["x:float32[B,8]"], 32))
    calls = calls_of(model)
    with pytest.raises(mutwo.ScheduleMismatchError) as e:
        model(torch.randn(8, 8))
    text = str(e.value)
    assert ('input 0 ("x") is float32[8,8], the schedule was planned for '
            "float32[32,8] (batch 32): batch 8 is not the planned batch 32"
            in text), text
    assert "strict=False" in text
    assert calls == [] and applied.stats().dropped == 0  # nothing ran
    # The planned step runs, with the plain model's gradients.
    x = torch.randn(32, 8)
    model(x).sum().backward()
    plain(x).sum().backward()
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert applied.stats().dropped > 0


def test_the_inputs_are_checked_again_whenever_their_shapes_change() -> None:
    model = mlp()
    mutwo.apply(model, planned(model, ["x:float32[B,8]"], 4))
    model(torch.randn(4, 8)).sum().backward()
    model(torch.randn(4, 8)).sum().backward()
    # Without gradients the schedule is not applied: nothing to refuse.
    with torch.no_grad():
        model(torch.randn(3, 8))
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match=r"float32\[3,8\], the schedule was planned for "
                       r"float32\[4,8\] \(batch 4\)"):
        model(torch.randn(3, 8))
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match=r'input 0 \("x"\) is float64\[4,8\], the '
                       r"schedule was planned for float32\[4,8\] \(batch 4\)"
                       ": the schedule's budget holds only for the step it "
                       "was planned for"):
        model.double()(torch.randn(4, 8, dtype=torch.float64))


class ImageText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(6, 4)

    def forward(self, image: torch.Tensor, text: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = self.relu(self.conv(image)).mean(dim=(2, 3)) + self.fc(text)
        return y if mask is None else y * mask


def test_inputs_are_matched_by_name_and_counted() -> None:
    """Specs name forward's arguments (recorded in another order than
    forward's): matched by name, as the worker binds them; a left-out
    Optional argument is no input; a tensor the schedule was not planned
    for, or a planned one missing, is another input count."""
    torch.manual_seed(0)
    model = ImageText()
    schedule = planned(model, ["text:float32[B,6]",
                               "image:float32[B,3,8,8]"], 2,
                       recompute=("relu",))
    mutwo.apply(model, schedule)
    image, text = torch.randn(2, 3, 8, 8), torch.randn(2, 6)
    model(image, text).sum().backward()
    model(text=text, image=image, mask=None).sum().backward()
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match=r'input 0 \("text"\) is float32\[2,3,8,8\], the '
                       r"schedule was planned for float32\[2,6\]"):
        model(text, image)
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match=r"3 tensor inputs given \(not planned: mask\); "
                       r"the schedule was planned for 2 at batch 2: "
                       r"text:float32\[B,6\] image:float32\[B,3,8,8\]"):
        model(image, text, torch.ones(2, 4))


def test_inputs_recorded_without_forwards_names_bind_by_position() -> None:
    model = mlp()
    mutwo.apply(model, planned(model, ["input0:float32[B,8]"], 2))
    model(torch.randn(2, 8)).sum().backward()
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match=r'input 0 \("input0"\) is float32\[2,4\], the '
                       r"schedule was planned for float32\[2,8\]"):
        model(torch.randn(2, 4))


def test_strict_false_runs_another_step_and_warns_once() -> None:
    model = mlp()
    applied = mutwo.apply(model, planned(model, ["x:float32[B,8]"], 32),
                          strict=False)
    with pytest.warns(mutwo.BudgetWarning,
                      match=r"strict=False.*float32\[8,8\], the schedule was "
                      r"planned for float32\[32,8\]"):
        model(torch.randn(8, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(8, 8)).sum().backward()
        model(torch.randn(6, 8)).sum().backward()
    assert applied.stats().dropped > 0
    assert ("not the planned step: 3 forward(s) with other inputs"
            in applied.report())


def test_a_schedule_without_recorded_inputs_says_they_are_not_checked(
) -> None:
    model = mlp()
    applied = mutwo.apply(model, make_schedule(model, recompute=[
        (0, ["1"], [])]))
    model(torch.randn(5, 8)).sum().backward()
    assert ("the schedule records no inputs (planned before schedules "
            "recorded their step): forward's inputs are not checked against "
            "its batch 2") in applied.report()


# mode="compile" (selective activation checkpointing for torch.compile,
# PyTorch >= 2.4) checks a forward's inputs as the eager mode does. The
# check wraps the model's own forward, outside the checkpointed frames, so
# on torch 1.13 a stand-in for selective checkpointing that runs each
# frame's forward as it is reaches it.
def stand_in_sac(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.checkpoint as ckpt
    monkeypatch.setattr(ckpt, "CheckpointPolicy", object(), raising=False)
    monkeypatch.setattr(ckpt, "create_selective_checkpoint_contexts",
                        lambda *a, **k: None, raising=False)
    monkeypatch.setattr(
        ckpt, "checkpoint",
        lambda fn, *args, use_reentrant, context_fn, **kwargs:
        fn(*args, **kwargs))


def test_mode_compile_refuses_another_step_as_eager_mode_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_sac(monkeypatch)
    from mutwo import _compile
    eager, compiled = mlp(), mlp()
    mutwo.apply(eager, planned(eager, ["x:float32[B,8]"], 32))
    with pytest.raises(mutwo.ScheduleMismatchError) as eager_error:
        eager(torch.randn(8, 8))
    out = mutwo.apply(compiled, planned(compiled, ["x:float32[B,8]"], 32),
                      mode="compile")
    assert out is compiled
    calls = calls_of(compiled)
    with pytest.raises(mutwo.ScheduleMismatchError) as e:
        out(torch.randn(8, 8))
    assert calls == []  # nothing ran
    # The eager mode's message, up to the handle whose report() counts.
    same = str(eager_error.value).split("(a BudgetWarning")[0]
    assert 'input 0 ("x") is float32[8,8]' in same
    assert str(e.value).startswith(same), (str(e.value), same)
    assert "compiled_schedule_of(model).report()" in str(e.value)
    # The planned step runs; without gradients nothing is checked.
    out(torch.randn(32, 8)).sum().backward()
    with torch.no_grad():
        out(torch.randn(3, 8))
    handle = _compile.compiled_schedule_of(compiled)
    assert "not the planned step" not in handle.report()
    handle.remove()
    assert "forward" not in compiled.__dict__


def test_mode_compile_strict_false_runs_another_step_and_warns_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_sac(monkeypatch)
    from mutwo import _compile
    model = mlp()
    mutwo.apply(model, planned(model, ["x:float32[B,8]"], 32),
                mode="compile", strict=False)
    with pytest.warns(mutwo.BudgetWarning,
                      match="batch 8 is not the planned batch 32"):
        model(torch.randn(8, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(8, 8)).sum().backward()
    report = _compile.compiled_schedule_of(model).report()
    assert "not the planned step: 2 forward(s)" in report, report


@pytest.mark.parametrize("peak,over", [(5000, True), (3000, False)])
def test_mode_compile_measures_the_second_step_and_warns_once_over_budget(
        monkeypatch: pytest.MonkeyPatch, peak: int, over: bool) -> None:
    # On a CUDA device compile mode reads torch.cuda's peak over the second
    # training step (reset at its forward, read at the next one; the first
    # compiles) and warns once, with the figures, when it is over the
    # budget. Here the device and torch.cuda's calls are stand-ins.
    stand_in_sac(monkeypatch)
    from mutwo import _compile
    calls: list = []
    monkeypatch.setattr(_compile, "_cuda_device", lambda model: "cuda:7")
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda d=None: calls.append(("sync", d)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda d=None: calls.append(("reset", d)))

    def read(d: object = None) -> int:
        calls.append(("read", d))
        return peak
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", read)
    model = mlp()
    proto = planned(model, ["x:float32[B,8]"], 32).proto
    proto.budget_bytes, proto.predicted_peak_bytes = 4000, 3900
    mutwo.apply(model, mutwo.Schedule.from_proto(proto), mode="compile")
    handle = _compile.compiled_schedule_of(model)

    def step() -> None:
        model(torch.randn(32, 8)).sum().backward()

    step()
    with torch.no_grad():
        model(torch.randn(32, 8))  # not a training step: not counted
    assert calls == [] and handle.measured_peak_bytes is None
    step()
    assert calls == [("sync", "cuda:7"), ("reset", "cuda:7")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
        step()
    assert calls[2:] == [("sync", "cuda:7"), ("read", "cuda:7")]
    assert handle.measured_peak_bytes == peak
    budget = [w for w in caught if issubclass(w.category, mutwo.BudgetWarning)]
    if over:
        assert len(budget) == 1
        text = str(budget[0].message)
        assert "second training step peaked at 4.88 KiB" in text, text
        assert "over the budget 3.91 KiB" in text, text
        assert "OVER" in handle.report()
    else:
        assert budget == []
        assert "second step: peak 2.93 KiB" in handle.report()
        assert "within" in handle.report()
