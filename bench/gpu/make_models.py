#!/usr/bin/env python3
"""The GPU benchmarks' models (issues 7 and 13), built eager and scripted by
the python3 on the GPU machine (its torch):
  resnet152    torchvision, 224x224, 1000 classes
  transformer  embedding 30000x512, 6 x TransformerEncoderLayer(d_model=512,
               nhead=8, dim_feedforward=2048, dropout=0.1, batch_first=True),
               linear head to 30000, sequence 128
  gpt          GPT-style decoder (bench/zoo/models.py's Gpt): 12 layers,
               d 768, 12 heads, sequence 256, vocabulary 32000, tied head
  vit_b_16     torchvision ViT-B/16, 224x224, 1000 classes

    make_models.py OUT_DIR [names...]   (default resnet152 transformer)

`build(name)` gives the eager module (seeded), `blocks(name, model)` the
modules a per-block checkpointing anchor wraps, in execution order.
"""
import os
import sys

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "zoo"))
from models import Gpt  # noqa: E402  (the zoo's GPT-style decoder)

# name -> worker flags (input specs, loss) and the benchmark batch.
SPECS = {
    "resnet152": {"inputs": ["x:float32[B,3,224,224]"],
                  "loss": "cross_entropy:y:int64[B]{0,1000}", "batch": 64},
    "transformer": {"inputs": ["tokens:int64[B,128]{0,30000}"],
                    "loss": "cross_entropy:y:int64[B,128]{0,30000}",
                    "batch": 64},
    "gpt": {"inputs": ["idx:int64[B,256]{0,32000}"],
            "loss": "cross_entropy:y:int64[B,256]{0,32000}", "batch": 16},
    "vit_b_16": {"inputs": ["x:float32[B,3,224,224]"],
                 "loss": "cross_entropy:y:int64[B]{0,1000}", "batch": 32},
}


class TransformerLM(nn.Module):
    def __init__(self, vocab: int = 30000, d_model: int = 512, layers: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 8, 2048, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def build(name):
    torch.manual_seed(0)
    if name == "resnet152":
        model = torchvision.models.resnet152(weights=None)
    elif name == "transformer":
        model = TransformerLM()
    elif name == "gpt":
        model = Gpt(32000, 256, 768, 12, 12)
    elif name == "vit_b_16":
        model = torchvision.models.vit_b_16(weights=None)
    else:
        raise SystemExit(f"unknown model {name!r}")
    return model.train()


def blocks(name, model):
    if name == "resnet152":
        return [b for layer in (model.layer1, model.layer2, model.layer3,
                                model.layer4) for b in layer]
    if name == "transformer":
        return list(model.encoder.layers)
    if name == "gpt":
        return list(model.blocks)
    if name == "vit_b_16":
        return list(model.encoder.layers)
    raise SystemExit(f"unknown model {name!r}")


def batch_of(name, batch, device, seed=1):
    """Synthetic inputs and targets (the worker draws its own the same way:
    uniform classes/tokens, normal images)."""
    g = torch.Generator().manual_seed(seed)
    if name in ("resnet152", "vit_b_16"):
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    else:
        vocab, t = (30000, 128) if name == "transformer" else (32000, 256)
        x = torch.randint(0, vocab, (batch, t), generator=g)
        y = torch.randint(0, vocab, (batch, t), generator=g)
    return x.to(device), y.to(device)


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["resnet152", "transformer"]
    os.makedirs(out, exist_ok=True)
    for name in names:
        # Written aside and renamed: a run beside this one reading the same
        # folder never loads a half-written archive.
        path = os.path.join(out, name + ".pt")
        torch.jit.script(build(name)).save(path + f".{os.getpid()}.tmp")
        os.replace(path + f".{os.getpid()}.tmp", path)
        print(f"wrote {out}/{name}.pt", file=sys.stderr)


if __name__ == "__main__":
    main()
