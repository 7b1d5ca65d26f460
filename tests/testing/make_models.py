#!/usr/bin/python3
"""Writes the TorchScript fixture models of the worker tests.

Run with /usr/bin/python3 (torch 1.13, torchvision 0.14):
    make_models.py OUT_DIR

Each model is scripted with torch.jit.script (so control flow is kept) and
saved as OUT_DIR/<name>.pt; OUT_DIR/models.txt lists, per model, the
`mutwo-worker profile` arguments that fit it (name, then inputs and loss).
Nothing is downloaded: torchvision models are built with weights=None.
"""
import os
import sys
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = torch.tanh(self.fc2(x))
        return self.head(x)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.block1 = ResidualBlock(16)
        self.block2 = ResidualBlock(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(self.relu(self.bn(self.stem(x))))
        x = self.block2(self.block1(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 32)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(32, 1000)

    def forward(self, tokens):
        x = self.drop(self.embed(tokens))
        x = self.encoder(x)
        return self.head(x)


class ControlFlow(nn.Module):
    """A data-dependent `if` and a loop whose iterations are separate runs."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.cell = nn.Linear(32, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x)
        if bool(h.sum() > 0):
            h = torch.relu(h)
        else:
            h = torch.sigmoid(h) * 2.0
        for _ in range(3):
            h = torch.tanh(self.cell(h)) + h
        return self.out(h)


class Gate(nn.Module):
    """Takes one of two paths by the sign of its input's sum."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(16, 32)

    def forward(self, x):
        if bool(x.sum() > 0):
            return torch.relu(self.up(x))
        return torch.sigmoid(self.down(x)) * 2.0


class Branchy(nn.Module):
    """A data-dependent branch inside a submodule (the specialisation guard
    names it: "gate") between two linears."""

    def __init__(self):
        super().__init__()
        self.gate = Gate()
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.gate(x)))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(4, 16)
        self.mix = nn.Linear(16, 6)

    def forward(self, x, y) -> Tuple[torch.Tensor, torch.Tensor]:
        u = torch.relu(self.a(x))
        v = torch.sigmoid(self.b(y))
        z = self.mix(u * v)
        return z, u.sum(dim=1)


class FeatureDict(nn.Module):
    """torchvision's IntermediateLayerGetter (segmentation backbones): each
    stage's output may go into a dict, and the heads read the entries (the
    dict dies at the last read; LRASPP's head reads "low" after it)."""

    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleDict({
            "a": nn.Linear(16, 16),
            "b": nn.Linear(16, 16),
            "c": nn.Linear(16, 16),
        })
        self.return_layers: Dict[str, str] = {"a": "aux", "c": "out"}
        self.head = nn.Linear(16, 4)
        self.aux_head = nn.Linear(16, 4)

    def forward(self, x):
        out: Dict[str, torch.Tensor] = {}
        for name, stage in self.stages.items():
            x = torch.relu(stage(x))
            if name in self.return_layers:
                out[self.return_layers[name]] = x
        aux = out["aux"]
        return torch.relu(self.head(out["out"])) + self.aux_head(aux)


class DenseList(nn.Module):
    """A DenseNet-style block: each layer reads the concatenation of a list
    the forward appends to in place, so a replay of an earlier layer would
    read the list as it is later, not as it was."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 8)
        self.layers = nn.ModuleList([nn.Linear(8 * (i + 1), 8)
                                     for i in range(3)])
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        features = [torch.relu(self.inp(x))]
        for layer in self.layers:
            features.append(torch.tanh(layer(torch.cat(features, 1))))
        return self.out(torch.cat(features, 1))


class NoForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @torch.jit.export
    def apply_fc(self, x):
        return self.fc(x)


class DiffusionBlock(nn.Module):
    """GroupNorm -> SiLU -> conv, twice, with a residual (1x1 when widths
    differ): a diffusion U-Net's ResBlock."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.n1 = nn.GroupNorm(4, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n2 = nn.GroupNorm(4, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class DiffusionAttention(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.GroupNorm(4, c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        a = torch.softmax(q.transpose(1, 2) @ k / (c ** 0.5), dim=-1)
        return x + self.out((v @ a.transpose(1, 2)).reshape(b, c, h, w))


class DiffusionUnet(nn.Module):
    """A diffusion-style U-Net: GroupNorm, SiLU, self-attention
    at the bottom, `F.interpolate(scale_factor=2.0, mode="nearest")` in the
    decoder (scripted, an If tree over every mode whose branches build the
    scale-factor list). Its profile crashed one run in three."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.d1 = DiffusionBlock(c, c)
        self.down1 = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.d2 = DiffusionBlock(c, 2 * c)
        self.down2 = nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1)
        self.mid = DiffusionBlock(2 * c, 2 * c)
        self.attn = DiffusionAttention(2 * c)
        self.u2 = DiffusionBlock(4 * c, 2 * c)
        self.u1 = DiffusionBlock(3 * c, c)
        self.out_norm = nn.GroupNorm(4, c)
        self.out = nn.Conv2d(c, 10, 3, padding=1)

    def forward(self, x):
        h0 = self.d1(self.inp(x))
        h1 = self.d2(self.down1(h0))
        m = self.attn(self.mid(self.down2(h1)))
        m = F.interpolate(m, scale_factor=2.0, mode="nearest")
        u = self.u2(torch.cat([m, h1], 1))
        u = F.interpolate(u, scale_factor=2.0, mode="nearest")
        u = self.u1(torch.cat([u, h0], 1))
        return self.out(F.silu(self.out_norm(u))).mean((2, 3))


class Seq2Seq(nn.Module):
    """nn.Transformer encoder-decoder: batch_first, a causal
    `tgt_mask` buffer, two inputs. Its floor execute read a freed value
    (`InvalidTag`) once."""

    def __init__(self, d: int = 32, layers: int = 2, vocab: int = 64,
                 t: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.tr = nn.Transformer(d, 4, layers, layers, 64, dropout=0.1,
                                 batch_first=True)
        self.register_buffer(
            "tgt_mask", torch.triu(torch.full((t, t), float("-inf")), 1))
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        return self.head(self.tr(self.emb(src), self.emb(tgt),
                                 tgt_mask=self.tgt_mask))


class FastPathCheck(nn.Module):
    """nn.TransformerEncoder's fast-path check in small: a reason string
    chosen by constant settings, where the untaken arm builds and appends
    to a list. Folding it destroys IR values that were written to, and
    LibTorch's constant propagation kept reading its alias analysis of
    them: a new constant at a freed value's address read as written to and
    the fold stopped at `len(why) > 0` (on CUDA, at an address-dependent
    point: two fingerprints for one file)."""

    def __init__(self):
        super().__init__()
        self.use_fast = False
        self.batch_first = True
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        why = ""
        if not self.use_fast:
            why = "the fast path is off"
        elif not self.batch_first:
            why = "batch_first is off"
        else:
            sizes: List[int] = []
            for s in x.shape:
                sizes.append(s)
            sizes.append(len(sizes))
            why = str(sizes)
        if not why:
            x = x * 2
        return self.lin(x)


class ShapeArithmetic(nn.Module):
    """timm's hiera unroll in small, for torch.jit.trace: the batch size
    read from a shape and multiplied in place (`b *= 2`), which a trace
    records as a 0-dim tensor constant beside a prim::NumToTensor, and a
    number added to an activation (a 0-dim constant of the device)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x) + torch.tensor(0.5)
        b, c = h.shape
        h = h.view(b, 2, c // 2)
        b *= 2
        h = F.relu(h.reshape(b, c // 2))
        return self.b(h.reshape(b // 2, c))


class DropoutAlias(nn.Module):
    """A block whose first op is a dropout of probability 0 (timm's blocks
    are full of them): ATen returns the input itself, an alias that no
    schema announces, and the next op (sin) saves it for backward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.0)
        self.b = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        s = torch.sin(self.drop(h))
        return self.head(torch.relu(self.b(s)))


# name -> (module, profile arguments for the tests and docs)
MODELS = {
    "mlp": (Mlp, "--input x:float32[B,32]"),
    "cnn": (SmallCnn, "--input x:float32[B,3,16,16]"),
    "resnet18": (lambda: torchvision.models.resnet18(weights=None),
                 "--input x:float32[B,3,224,224]"),
    "transformer": (TinyTransformer,
                    "--input tokens:int64[B,16]{0,1000} "
                    "--loss cross_entropy:y:int64[B,16]{0,1000}"),
    "control_flow": (ControlFlow, "--input x:float32[B,16]"),
    "feature_dict": (FeatureDict, "--input x:float32[B,16]"),
    "branchy": (Branchy, "--input x:float32[B,16]"),
    "dense_list": (DenseList, "--input x:float32[B,16]"),
    "two_inputs": (TwoInputs,
                   "--input x:float32[B,8] --input y:float32[B,4]"),
    "diffusion_unet": (DiffusionUnet,
                       "--input x:float32[B,3,32,32] "
                       "--loss cross_entropy:y:int64[B]{0,10}"),
    "seq2seq": (Seq2Seq,
                "--input src:int64[B,8]{0,64} --input tgt:int64[B,8]{0,64} "
                "--loss cross_entropy:y:int64[B,8]{0,64}"),
    "fast_path_check": (FastPathCheck, "--input x:float32[B,16]"),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    lines = []
    for name, (make, args) in MODELS.items():
        module = make()
        module.train()
        torch.jit.script(module).save(os.path.join(out, name + ".pt"))
        lines.append(f"{name} {args}")
    torch.jit.script(NoForward()).save(os.path.join(out, "no_forward.pt"))
    # Traced (not in MODELS: the device-constants test reads its IR).
    traced = torch.jit.trace(ShapeArithmetic().train(), torch.randn(4, 16),
                             check_trace=False)
    traced.save(os.path.join(out, "traced_shape_arithmetic.pt"))
    # Not in MODELS: only the executor's runtime-alias test uses it.
    torch.jit.script(DropoutAlias().train()).save(
        os.path.join(out, "dropout_alias.pt"))
    # Bottleneck blocks with a downsample branch (not in MODELS: only the
    # executor's policy memory test uses it, at 64x64).
    resnet50 = torchvision.models.resnet50(weights=None)
    resnet50.train()
    torch.jit.script(resnet50).save(os.path.join(out, "resnet50.pt"))
    with open(os.path.join(out, "resnet18.pt"), "rb") as f:
        data = f.read()
    with open(os.path.join(out, "truncated.pt"), "wb") as f:
        f.write(data[: len(data) // 2])
    with open(os.path.join(out, "not_a_zip.pt"), "wb") as f:
        f.write(b"this is not a TorchScript archive\n" * 8)
    with open(os.path.join(out, "models.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
