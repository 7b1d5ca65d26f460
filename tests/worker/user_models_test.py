#!/usr/bin/python3
"""Models as users bring them, through `mutwo-worker profile`, `mutwo plan`
and `mutwo-worker execute` on the CPU: an Optional forward argument left
out, inputs given out of order by name, a traced torchvision model and a
traced GPT-2-style block; each planned halfway from the floor to the
baseline and executed within budget with gradients equal. And what users
get wrong, named: a torch.save pickle, a spec naming no argument, a
required argument without a spec.

    MUTWO_BIN=BUILD/bin /usr/bin/python3 -m pytest -q user_models_test.py
"""
import json
import os
import subprocess
from typing import Dict, Optional, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

BIN = os.environ.get("MUTWO_BIN", "build/bin")


class OptionalMask(nn.Module):
    """timm's style: forward(x, mask=None, scale=2.0)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 64)
        self.c = nn.Linear(64, 10)

    def forward(self, x, mask: Optional[torch.Tensor] = None,
                scale: float = 2.0):
        h = F.relu(self.a(x))
        if mask is not None:
            h = h * mask
        h = F.relu(self.b(h)) * scale
        return self.c(h)


class ImageText(nn.Module):
    def __init__(self):
        super().__init__()
        self.img = nn.Conv2d(3, 8, 3)
        self.txt = nn.Linear(32, 8)
        self.out = nn.Linear(16, 10)

    def forward(self, image, text):
        a = F.relu(self.img(image)).mean((2, 3))
        b = F.relu(self.txt(text))
        return self.out(torch.cat([a, b], 1))


class Gpt2Block(nn.Module):
    """A GPT-2-style decoder as Hugging Face writes it: fused qkv, causal
    mask built from a registered buffer, GELU MLP, tied logits."""

    def __init__(self, vocab=256, d=64, heads=4, layers=2, ctx=32):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.register_buffer(
            "bias", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "attn": nn.Linear(d, 3 * d),
                "proj": nn.Linear(d, d), "ln2": nn.LayerNorm(d),
                "fc": nn.Linear(d, 4 * d), "out": nn.Linear(4 * d, d)}))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, input_ids):
        b, t = input_ids.shape
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device)
        h = self.wte(input_ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk["ln1"](h)
            q, k, v = blk["attn"](x).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                       for z in (q, k, v))
            w = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
            w = w.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            a = (w.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
            h = h + blk["proj"](a)
            h = h + blk["out"](F.gelu(blk["fc"](blk["ln2"](h))))
        return self.ln_f(h) @ self.wte.weight.t()


class TwoHeads(nn.Module):
    """A classifier with an auxiliary regression head on a shared trunk,
    returning both in a dict (a multi-task model)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(),
                                   nn.Linear(64, 64), nn.ReLU(),
                                   nn.Linear(64, 64), nn.ReLU())
        self.logits = nn.Linear(64, 10)
        self.aux = nn.Linear(64, 4)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        h = self.trunk(x)
        return {"logits": self.logits(h), "aux": self.aux(h)}


class TwoHeadsTuple(TwoHeads):
    """The same two heads returned as a tuple `(logits, aux)`."""

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.logits(h), self.aux(h)


class OwnLoss(nn.Module):
    """A model that returns `(logits, loss)`, its loss computed inside."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(),
                                 nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 10))

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return logits, logits.pow(2).mean()


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True,
                          text=True, timeout=300)


def profile_plan_execute(tmp_path, model, specs, extra=()):
    """Profile, plan halfway from the floor to the baseline, execute;
    returns the execute's JSON."""
    worker, cli = os.path.join(BIN, "mutwo-worker"), os.path.join(BIN, "mutwo")
    flags = [f for s in specs for f in ("--input", s)] + [
        "--batch", "4", "--warmup", "1", "--iterations", "1", *extra]
    prof = tmp_path / "p.json"
    p = run(worker, "profile", model, *flags, "--output", "json")
    assert p.returncode == 0, p.stderr
    prof.write_text(p.stdout)
    p = run(cli, "plan", prof, "--budget", "100%", "--output", "json")
    assert p.returncode == 0, p.stderr
    s100 = json.loads(p.stdout)
    floor, top = int(s100["floor_bytes"]), int(s100["baseline_peak_bytes"])
    budget = (floor + top) // 2 if top > floor else floor
    p = run(cli, "plan", prof, "--budget", f"{budget}B", "--output", "json")
    assert p.returncode == 0, p.stderr
    sched = tmp_path / "s.json"
    sched.write_text(p.stdout)
    p = run(worker, "execute", model, "--schedule", sched, *flags,
            "--output", "json")
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)
    assert v["gradients_match"], v.get("max_abs_grad_diff")
    assert int(v["scheduled"]["peak_bytes"]) <= budget
    return v


def test_an_optional_argument_left_out_is_none(tmp_path):
    path = tmp_path / "opt.pt"
    torch.jit.script(OptionalMask()).save(str(path))
    profile_plan_execute(tmp_path, path, ["x:float32[B,32]"])


def test_inputs_given_out_of_order_are_matched_by_name(tmp_path):
    path = tmp_path / "two.pt"
    torch.jit.script(ImageText()).save(str(path))
    profile_plan_execute(tmp_path, path, ["text:float32[B,32]",
                                          "image:float32[B,3,16,16]"])


def test_a_traced_torchvision_model(tmp_path):
    import torchvision
    path = tmp_path / "resnet18.pt"
    m = torchvision.models.resnet18(num_classes=10)
    torch.jit.trace(m, torch.randn(2, 3, 32, 32)).save(str(path))
    profile_plan_execute(tmp_path, path, ["x:float32[B,3,32,32]"],
                         ["--loss", "cross_entropy:y:int64[B]{0,10}"])


def test_a_traced_gpt2_style_decoder(tmp_path):
    path = tmp_path / "gpt2.pt"
    m = Gpt2Block()
    torch.jit.trace(m, torch.randint(0, 256, (2, 32))).save(str(path))
    profile_plan_execute(tmp_path, path, ["input_ids:int64[B,32]{0,256}"])


def rewrite_archive(src, dst, old, new):
    """Copies the TorchScript archive `src` to `dst` with `old` replaced by
    `new` in its code records; returns how many records changed."""
    import zipfile
    changed = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if "/code/" in info.filename and info.filename.endswith(".py"):
                text = data.decode()
                if old in text:
                    data = text.replace(old, new).encode()
                    changed += 1
            zout.writestr(info, data)
    return changed


def test_a_trace_made_on_another_device_runs_on_this_one(tmp_path):
    # A trace records the device it met as constants: traced on a GPU, the
    # positions are made on cuda:0. Here the CPU trace's baked device is
    # rewritten to cuda:0 (this machine has none): without retargeting,
    # profile fails in torch.arange on a device it does not have.
    traced = tmp_path / "gpt2_cpu.pt"
    torch.jit.trace(Gpt2Block(), torch.randint(0, 256, (2, 32))).save(
        str(traced))
    path = tmp_path / "gpt2_cuda.pt"
    assert rewrite_archive(traced, path, 'torch.device("cpu")',
                           'torch.device("cuda:0")') > 0
    with pytest.raises(RuntimeError):  # what a user's load would meet
        torch.jit.load(str(path))(torch.randint(0, 256, (2, 32)))
    worker = os.path.join(BIN, "mutwo-worker")
    p = run(worker, "profile", path, "--input", "input_ids:int64[B,32]{0,256}",
            "--batch", "2", "--output", "json")
    assert p.returncode == 0, p.stderr
    assert "naming cuda:0 now name cpu" in p.stderr, p.stderr
    profile_plan_execute(tmp_path, path, ["input_ids:int64[B,32]{0,256}"])


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_save_pickle_is_named(tmp_path, legacy):
    path = tmp_path / "pickle.pt"
    torch.save(ImageText().state_dict(), str(path),
               _use_new_zipfile_serialization=not legacy)
    p = run(os.path.join(BIN, "mutwo-worker"), "profile", path,
            "--input", "image:float32[B,3,16,16]", "--batch", "2")
    assert p.returncode == 2, p.stderr
    assert "torch.save pickle" in p.stderr
    assert "torch.jit.script(model).save(path)" in p.stderr


def test_a_spec_naming_no_argument_and_a_missing_argument_are_named(tmp_path):
    path = tmp_path / "two.pt"
    torch.jit.script(ImageText()).save(str(path))
    worker = os.path.join(BIN, "mutwo-worker")
    p = run(worker, "profile", path, "--input", "txt:float32[B,32]",
            "--input", "image:float32[B,3,16,16]", "--batch", "2")
    assert p.returncode == 2
    assert "--input txt names no argument of forward(image: Tensor, " \
           "text: Tensor)" in p.stderr
    p = run(worker, "profile", path, "--input", "image:float32[B,3,16,16]",
            "--batch", "2")
    assert p.returncode == 2
    assert "forward's argument text (Tensor) has no --input spec" in p.stderr


def test_execute_runs_the_step_the_schedule_was_planned_for(tmp_path):
    """Profiled with cross-entropy and AdamW: execute without those flags
    runs them (the profile's peak again); with another loss or optimizer it
    refuses, naming both, exit 2."""
    path = tmp_path / "two.pt"
    torch.jit.script(ImageText()).save(str(path))
    worker, cli = os.path.join(BIN, "mutwo-worker"), os.path.join(BIN, "mutwo")
    specs = ["--input", "image:float32[B,3,16,16]", "--input",
             "text:float32[B,32]", "--batch", "4"]
    step = ["--loss", "cross_entropy:y:int64[B]{0,10}", "--optimizer", "adamw"]
    p = run(worker, "profile", path, *specs, *step, "--output", "json")
    assert p.returncode == 0, p.stderr
    (tmp_path / "p.json").write_text(p.stdout)
    p = run(cli, "plan", tmp_path / "p.json", "--budget", "100%",
            "--output", "json")
    assert p.returncode == 0, p.stderr
    sched = json.loads(p.stdout)
    assert sched["loss"]["kind"] == "CROSS_ENTROPY"
    (tmp_path / "s.json").write_text(p.stdout)
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--output", "json")
    assert p.returncode == 0, p.stderr
    flagless = json.loads(p.stdout)["baseline"]["peak_bytes"]
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json", *step,
            "--output", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["baseline"]["peak_bytes"] == flagless
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--input", "image:float32[B,3,16,16]", "--output", "json")
    assert p.returncode == 2 and "contradicts the schedule" in p.stderr
    for flag, value, planned in (
            ("--loss", "mean", "cross_entropy:y:int64[B]{0,10}"),
            ("--optimizer", "sgd", "adamw")):
        p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
                flag, value)
        assert p.returncode == 2, p.stderr
        assert f"{flag} {value}" in p.stderr and \
            f"planned for {flag} {planned}" in p.stderr, p.stderr


def test_mse_regression_step_fits_its_budget_with_equal_gradients(tmp_path):
    """--loss mse:TARGET: a float target of the output's shape, generated
    from the seed; profile, plan halfway to the floor, execute: within the
    budget, gradients equal to the unmodified step's; the schedule records
    mse and execute without --loss runs it."""
    path = tmp_path / "reg.pt"
    torch.jit.script(nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))).save(str(path))
    v = profile_plan_execute(tmp_path, path, ["x:float32[B,16]"],
                             ["--loss", "mse:z:float32[B,4]"])
    assert abs(v.get("loss_diff", 0)) < 1e-6
    sched = json.loads((tmp_path / "s.json").read_text())
    assert sched["loss"]["kind"] == "MSE"
    assert sched["loss"]["target"]["name"] == "z"
    worker = os.path.join(BIN, "mutwo-worker")
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--output", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gradients_match"]
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--loss", "mse:z:float32[B,4]", "--output", "json")
    assert p.returncode == 0, p.stderr
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--loss", "mean")
    assert p.returncode == 2
    assert ("--loss mean contradicts the schedule, planned for --loss "
            "mse:z:float32[B,4]") in p.stderr, p.stderr
    # A target of another shape is refused, naming both shapes.
    p = run(worker, "profile", path, "--input", "x:float32[B,16]",
            "--batch", "4", "--loss", "mse:z:float32[B,3]")
    assert p.returncode == 2
    assert ("output shape [4,4] differs from target \"z:float32[B,3]\" "
            "shape [4,3]") in p.stderr, p.stderr


def backward_names(tmp_path):
    """The autograd nodes the profiled step's backward ran."""
    profile = json.loads((tmp_path / "p.json").read_text())
    return [step["name"] for step in profile["backward_steps"]]


@pytest.mark.parametrize("returns", ["dict", "tuple"])
def test_two_loss_terms_over_two_outputs(tmp_path, returns):
    """A two-head model (a dict or a `(logits, aux)` tuple): without
    @OUTPUT, cross_entropy and mse refuse to guess, naming both outputs and
    the syntax; with a term per head (repeated --loss, or joined by +: the
    same step) profile, plan and execute give equal gradients within the
    budget, the step's backward runs through both terms, and the schedule
    records both; executed with one term it is refused, naming both."""
    path = tmp_path / "heads.pt"
    model = TwoHeads() if returns == "dict" else TwoHeadsTuple()
    torch.jit.script(model).save(str(path))
    keys = ["logits", "aux"] if returns == "dict" else ["0", "1"]
    worker = os.path.join(BIN, "mutwo-worker")
    base = ["--input", "x:float32[B,16]", "--batch", "4"]
    for loss in ("cross_entropy:y:int64[B]{0,10}", "mse:z:float32[B,4]"):
        p = run(worker, "profile", path, *base, "--loss", loss)
        assert p.returncode == 2, p.stderr
        kind = loss.partition(":")[0]
        assert (f"loss {kind}: the model returns a {returns} with "
                f"floating-point tensors in 2 entries ({keys[0]} [4,10], "
                f"{keys[1]} [4,4]); name the output the loss reads with "
                f"{kind}@OUTPUT") in p.stderr, p.stderr
    terms = [f"cross_entropy@{keys[0]}:y:int64[B]{{0,10}}",
             f"mse@{keys[1]}:z:float32[B,4]"]
    v = profile_plan_execute(tmp_path, path, ["x:float32[B,16]"],
                             ["--loss", terms[0], "--loss", terms[1]])
    # Both terms are differentiated: a term left out of the loss would
    # leave its head untrained and out of the planned backward.
    names = backward_names(tmp_path)
    assert "NllLossBackward0" in names and "MseLossBackward0" in names, names
    sched = json.loads((tmp_path / "s.json").read_text())
    assert [t["kind"] for t in sched["loss"]["terms"]] == \
        ["CROSS_ENTROPY", "MSE"]
    assert [t["output"] for t in sched["loss"]["terms"]] == keys
    # The +-joined form is the same loss: execute accepts it.
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--loss", "+".join(terms), "--output", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gradients_match"]
    # One term alone is another step: refused, naming both.
    p = run(worker, "execute", path, "--schedule", tmp_path / "s.json",
            "--loss", terms[0])
    assert p.returncode == 2, p.stderr
    assert (f"--loss {terms[0]} contradicts the schedule, planned for "
            f"--loss {'+'.join(terms)}") in p.stderr, p.stderr


def test_a_model_returning_logits_and_its_loss(tmp_path):
    """`--loss model` over `(logits, loss)`: the one-element output is the
    loss; the plan executes within budget with equal gradients."""
    path = tmp_path / "own.pt"
    torch.jit.script(OwnLoss()).save(str(path))
    profile_plan_execute(tmp_path, path, ["x:float32[B,16]"],
                         ["--loss", "model"])
    # The backward starts at the model's loss alone (a mean of every output
    # would add a mean of the logits).
    names = backward_names(tmp_path)
    assert names.count("MeanBackward0") == 1 and "PowBackward0" in names, \
        names
