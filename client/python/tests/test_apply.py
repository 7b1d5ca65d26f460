"""mutwo.apply on eager models (CPU, torch 1.13 here; current PyTorch on the
GPU machine): gradients equal to the unmodified step, recomputed modules run
twice, swapped and dropped tensors really leave memory and come back, and a
schedule for another model is refused."""
from __future__ import annotations

import copy
import gc
import weakref
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import mutwo
from schedules import make_schedule


def step(model: nn.Module, inputs: Tuple[torch.Tensor, ...],
         loss_fn: Callable[[Any], torch.Tensor], seed: int = 0
         ) -> Tuple[float, Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """One forward/backward from zero gradients: loss, gradients, buffers."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn(model(*inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return loss.item(), grads, buffers


def assert_same_step(plain: nn.Module, scheduled: nn.Module,
                     inputs: Tuple[torch.Tensor, ...],
                     loss_fn: Callable[[Any], torch.Tensor]) -> None:
    loss_a, grads_a, buffers_a = step(plain, inputs, loss_fn)
    loss_b, grads_b, buffers_b = step(scheduled, inputs, loss_fn)
    assert loss_a == pytest.approx(loss_b, rel=1e-6, abs=1e-7)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5,
                                   atol=1e-6, msg=f"gradient of {name}")
    # Batch-norm running statistics are updated once, not once per replay.
    for name in buffers_a:
        torch.testing.assert_close(buffers_b[name], buffers_a[name],
                                   rtol=1e-5, atol=1e-6,
                                   msg=f"buffer {name}")


def count_calls(model: nn.Module) -> Dict[str, int]:
    calls: Dict[str, int] = {}
    for path, m in model.named_modules():
        m.register_forward_hook(
            lambda *_, path=path: calls.__setitem__(path,
                                                    calls.get(path, 0) + 1))
    return calls


def resnet() -> nn.Module:
    torch.manual_seed(1)
    return torchvision.models.resnet18(num_classes=10).train()


def resnet_schedule(model: nn.Module) -> mutwo.Schedule:
    return make_schedule(
        model,
        recompute=[
            # Inside one block: the block is the frame.
            (0, ["layer1.0.conv1", "layer1.0.bn1"], []),
            # Across two blocks of a Sequential: the frame is layer2[0:2].
            (1, ["layer2.0.bn2", "layer2.1.conv1", "layer2.1.bn1"],
             ["layer2.0.conv2"]),
        ],
        swap=["layer3.0.conv1", "layer3.0.bn1", "layer4.1.conv2"])


CNN_INPUT = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)),)
CNN_TARGET = torch.tensor([3, 7])


def cnn_loss(out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, CNN_TARGET)


def test_cnn_gradients_equal_the_unmodified_step() -> None:
    model = resnet()
    plain = copy.deepcopy(model)
    applied = mutwo.apply(model, resnet_schedule(model))
    assert applied.frames == ["layer1.0", "layer2[0:2]"]
    assert_same_step(plain, model, CNN_INPUT, cnn_loss)
    s = applied.stats
    assert s.dropped > 0 and s.swapped_out > 0
    assert s.swapped_in == s.swapped_out
    assert s.replays == {"layer1.0": 1, "layer2[0:2]": 1}
    assert applied.unmatched() == []
    # A second step (optimizer in between) stays equal.
    for m in (plain, model):
        torch.optim.AdamW(m.parameters(), lr=1e-2).step()
    assert_same_step(plain, model, CNN_INPUT, cnn_loss)


def test_recomputed_modules_run_twice_and_others_once() -> None:
    model = resnet()
    calls = count_calls(model)
    mutwo.apply(model, resnet_schedule(model))
    step(model, CNN_INPUT, cnn_loss)
    # The replay re-runs its frame up to the segment's last saved tensor.
    assert calls["layer1.0.conv1"] == 2
    assert calls["layer1.0.bn1"] == 2
    assert calls["layer2.0.conv1"] == 2
    assert calls["layer2.1.bn1"] == 2
    for path in ("conv1", "layer1.1.conv1", "layer3.0.conv1",
                 "layer4.1.conv2", "fc"):
        assert calls[path] == 1, path


def outputs_of(model: nn.Module, paths: List[str]) -> Dict[str, Any]:
    refs: Dict[str, Any] = {}
    for path in paths:
        model.get_submodule(path).register_forward_hook(
            lambda m, i, out, path=path: refs.__setitem__(path,
                                                          weakref.ref(out)))
    return refs


@pytest.mark.parametrize("scheduled", [False, True])
def test_swapped_and_dropped_tensors_leave_and_come_back(
        scheduled: bool) -> None:
    model = resnet()
    swapped, dropped = "layer3.0.conv1", "layer1.0.conv1"
    refs = outputs_of(model, [swapped, dropped, "layer3.1.conv1"])
    applied = mutwo.apply(model, resnet_schedule(model)) if scheduled else None
    torch.manual_seed(0)
    loss = cnn_loss(model(*CNN_INPUT))
    gc.collect()
    # Without a schedule autograd holds both outputs until backward; with
    # one, neither is held: the swapped one is in host memory, the dropped
    # one is re-made by the replay. A retained one stays either way.
    assert (refs[swapped]() is None) == scheduled
    assert (refs[dropped]() is None) == scheduled
    assert refs["layer3.1.conv1"]() is not None
    if applied is not None:
        s = applied.stats
        # One output per swapped module, and the two statistics the batch
        # norm saved (made in forward, needing no gradient: activations of
        # the batch norm, as the profiler counts them).
        assert s.swapped_out == 5
        assert s.swapped_in == 0 and s.replays == {}
    loss.backward()
    if applied is not None:
        s = applied.stats
        # Each came back once, though autograd saved some twice (conv2d and
        # batch norm both save conv1's output).
        assert s.swapped_in == s.swapped_out
        assert s.replays == {"layer1.0": 1, "layer2[0:2]": 1}


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.3),
            nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.dropout(self.body(x), 0.2, self.training))


def test_dropout_masks_are_replayed_with_the_same_rng() -> None:
    torch.manual_seed(3)
    model = DropoutMLP().train()
    plain = copy.deepcopy(model)
    # What autograd holds: ReLU's result, dropout masks, the Linear's
    # output (GELU's input), the dropout's output (the next Linear's
    # input); not GELU's output (the dropout after it saves only its mask).
    schedule = make_schedule(
        model, recompute=[(0, ["body.1", "body.2", "body.3", "body.5"],
                           ["body.0", "body.4"])],
        swap=["body.7"])
    applied = mutwo.apply(model, schedule)
    x = (torch.randn(8, 16),)
    assert_same_step(plain, model, x, lambda out: out.square().mean())
    assert applied.stats.replays == {"body[0:6]": 1}
    # The RNG after the step is where the plain step leaves it.
    torch.manual_seed(0)
    plain(*x)
    after_plain = torch.rand(1)
    torch.manual_seed(0)
    model(*x).sum().backward()
    assert torch.equal(torch.rand(1), after_plain)


def transformer() -> nn.Module:
    torch.manual_seed(4)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4,
                                       dim_feedforward=64, dropout=0.1,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=3).train()


def test_transformer_gradients_equal_the_unmodified_step() -> None:
    model = transformer()
    plain = copy.deepcopy(model)
    calls = count_calls(model)
    schedule = make_schedule(
        model,
        recompute=[
            # The feed-forward of layer 0 (a frame inside the layer): the
            # dropout's mask and output (linear2's input); the layer's own
            # F.relu is replayed.
            (0, ["layers.0.dropout"], ["layers.0.linear1", "layers.0"]),
            # Layer 1's attention and feed-forward (linear1's and linear2's
            # outputs go to a ReLU and a dropout, which save neither).
            (1, ["layers.1.self_attn", "layers.1.norm1", "layers.1.dropout",
                 "layers.1.dropout1"],
             ["layers.1.linear1", "layers.1.linear2", "layers.1"]),
        ],
        swap=["layers.2.norm1", "layers.2.dropout"])
    applied = mutwo.apply(model, schedule)
    x = (torch.randn(2, 10, 32),)
    assert_same_step(plain, model, x, lambda out: out.pow(2).mean())
    assert applied.frames == ["layers.0", "layers.1"]
    assert calls["layers.1.self_attn"] == 2
    assert calls["layers.0.self_attn"] == 2  # the replay re-runs layers.0
    assert applied.unmatched() == []
    assert calls["layers.2.linear1"] == 1
    assert applied.stats.swapped_out > 0
    assert applied.stats.swapped_in == applied.stats.swapped_out


def test_a_schedule_for_another_model_is_refused() -> None:
    schedule = resnet_schedule(resnet())
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match="planned for another model: 67 of the 67 "
                       "module paths it names are not in this DropoutMLP: "
                       "'avgpool', 'bn1', 'conv1', 'fc', 'layer1' and 62 "
                       "more"):
        mutwo.apply(DropoutMLP(), schedule)
    # Same paths, other module types: refused by the op kinds.
    other = resnet()
    other.layer1[0].conv1 = nn.Linear(3, 3)  # type: ignore[assignment]
    with pytest.raises(mutwo.ScheduleMismatchError,
                       match="'layer1.0.conv1' produces aten::conv2d"):
        mutwo.apply(other, schedule)
    # A schedule from before decisions named modules.
    old = mutwo.Schedule.from_proto(schedule.proto)
    bare = type(schedule.proto)()
    bare.CopyFrom(schedule.proto)
    for d in bare.decisions:
        d.op_kind = ""
        d.module_path = ""
    with pytest.raises(mutwo.ScheduleMismatchError, match="plan it again"):
        mutwo.apply(resnet(), mutwo.Schedule.from_proto(bare))
    assert old == schedule
    with pytest.raises(TypeError, match="eager nn.Module"):
        mutwo.apply(torch.jit.script(DropoutMLP()), schedule)


def test_remove_takes_the_schedule_off() -> None:
    model = resnet()
    calls = count_calls(model)
    with mutwo.apply(model, resnet_schedule(model)) as applied:
        step(model, CNN_INPUT, cnn_loss)
    before = applied.stats.dropped
    assert calls["layer1.0.conv1"] == 2
    step(model, CNN_INPUT, cnn_loss)
    assert applied.stats.dropped == before
    assert calls["layer1.0.conv1"] == 3
    assert "forward" not in model.__dict__


def test_no_grad_forward_is_untouched() -> None:
    model = resnet()
    applied = mutwo.apply(model, resnet_schedule(model))
    with torch.no_grad():
        model(*CNN_INPUT)
    assert applied.stats.dropped == 0 and applied.stats.swapped_out == 0


def test_schedule_json_round_trip() -> None:
    schedule = resnet_schedule(resnet())
    again = mutwo.Schedule.from_json(schedule.to_json())
    assert again == schedule
    assert again.recomputed[0].module_path == "layer1.0.conv1"
    assert "RECOMPUTE layer1.0.conv1 aten::conv2d output 0" in str(again)


def test_nested_frames_replay_only_up_to_their_segment() -> None:
    # The stem (conv1, bn1: two children of the model itself) needs the
    # model as its frame; a block's segment nests inside it. The model's
    # replay stops after the stem's tensors: layer4 runs once.
    model = resnet()
    plain = copy.deepcopy(model)
    calls = count_calls(model)
    schedule = make_schedule(
        model, recompute=[(0, ["conv1", "bn1"], []),
                          (1, ["layer3.1.conv1", "layer3.1.bn1"], [])])
    applied = mutwo.apply(model, schedule)
    assert applied.frames == ["(model)", "layer3.1"]
    assert_same_step(plain, model, CNN_INPUT, cnn_loss)
    assert applied.stats.replays == {"(model)": 1, "layer3.1": 1}
    assert calls["conv1"] == 2 and calls["bn1"] == 2
    assert calls["layer3.1.conv1"] == 2
    assert calls["layer4.1.conv2"] == 1 and calls["fc"] == 1
    assert calls["layer1.0.conv1"] == 1
    assert applied.unmatched() == []


def test_apply_needs_no_grpcio(tmp_path: Any) -> None:
    """A training node with torch and protobuf but no grpcio applies a
    schedule file: only the client imports grpc."""
    import json
    import subprocess
    import sys
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    path = tmp_path / "s.json"
    path.write_text(make_schedule(model, recompute=[(0, ["1"], ["0"])])
                    .to_json())
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "import torch; from torch import nn; import mutwo\n"
        "m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
        f"with mutwo.apply(m, {json.dumps(str(path))}):\n"
        "    m(torch.randn(3, 4)).sum().backward()\n"
        "try:\n"
        "    mutwo.Client\n"
        "except ImportError:\n"
        "    print('client refused without grpc')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True)
    assert "client refused without grpc" in out.stdout


def test_a_frame_does_not_hold_an_input_the_schedule_drops() -> None:
    """layer1.0's output (its bn2, add and relu in place) is recomputed, and
    so is layer1.1.conv1, whose frame's input is that output: the frame
    asks layer1.0's frame for it at replay instead of holding it through
    the step (it did: +0.9 GB over the budget on ResNet-152 on an H100)."""
    model = resnet()
    plain = copy.deepcopy(model)
    refs = outputs_of(model, ["layer1.0"])
    schedule = make_schedule(
        model, recompute=[(0, ["layer1.0.bn2"], ["layer1.0.conv2"]),
                          (1, ["layer1.1.conv1"], [])])
    applied = mutwo.apply(model, schedule)
    assert applied.frames == ["layer1.0", "layer1.1.conv1"]
    assert_same_step(plain, model, CNN_INPUT, cnn_loss)
    applied.reset_stats()
    torch.manual_seed(0)
    loss = cnn_loss(model(*CNN_INPUT))
    gc.collect()
    assert refs["layer1.0"]() is None
    loss.backward()
    # layer1.0 replays once, for layer1.1.conv1's input: that replay
    # re-makes its own dropped tensors too (kept until backward uses them).
    assert applied.stats.replays == {"layer1.0": 1, "layer1.1.conv1": 1}


def test_a_control_flow_activation_drops_everything_saved_inside() -> None:
    """A scripted nn.TransformerEncoderLayer is one prim::If: the planner's
    activation for `layers.0` is every tensor saved inside the layer, not
    only its output (on an H100 apply dropped 5 layer outputs and kept the
    rest: 5.16 GB against a 4.22 GB budget)."""
    model = transformer()
    plain = copy.deepcopy(model)
    s = make_schedule(model, recompute=[(0, ["layers.0", "layers.1"], [])])
    for d in s.proto.decisions:
        if d.module_path in ("layers.0", "layers.1"):
            d.op_kind = "prim::If"
    schedule = mutwo.Schedule.from_proto(s.proto)
    refs = outputs_of(model, ["layers.0.norm1", "layers.1.norm1",
                              "layers.2.norm1"])
    applied = mutwo.apply(model, schedule)
    # The elements' common parent, a ModuleList, never runs: the model does.
    assert applied.frames == ["(model)"]
    x = (torch.randn(2, 10, 32),)
    assert_same_step(plain, model, x, lambda out: out.pow(2).mean())
    applied.reset_stats()
    loss = model(*x).pow(2).mean()
    gc.collect()
    assert refs["layers.0.norm1"]() is None
    assert refs["layers.1.norm1"]() is None
    assert refs["layers.2.norm1"]() is not None  # retained
    assert applied.stats.dropped > 10  # not just the two layer outputs
    loss.backward()
    assert applied.unmatched() == []


def test_a_compiled_module_is_refused_with_what_to_do() -> None:
    class OptimizedModule(nn.Module):  # what torch.compile returns (2.x)
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

    model = resnet()
    with pytest.raises(TypeError, match="not the result of torch.compile"):
        mutwo.apply(OptimizedModule(model), resnet_schedule(model))
