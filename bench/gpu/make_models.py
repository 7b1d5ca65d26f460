#!/usr/bin/env python3
"""The GPU benchmark's TorchScript models (issue 7), scripted by the python3
on the GPU machine (its torch): ResNet-152 (torchvision, 224x224, 1000
classes) and a Transformer encoder (embedding 30000x512, 6 x
TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
dropout=0.1, batch_first=True), linear head to 30000, sequence 128).

    make_models.py OUT_DIR [resnet152] [transformer]
"""
import os
import sys

import torch
import torch.nn as nn
import torchvision


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


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["resnet152", "transformer"]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name in names:
        if name == "resnet152":
            model = torchvision.models.resnet152(weights=None)
        elif name == "transformer":
            model = TransformerLM()
        else:
            raise SystemExit(f"unknown model {name!r}")
        model.train()
        torch.jit.script(model).save(os.path.join(out, name + ".pt"))
        print(f"wrote {out}/{name}.pt", file=sys.stderr)


if __name__ == "__main__":
    main()
