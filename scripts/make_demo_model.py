#!/usr/bin/python3
"""Writes the demo's TorchScript model: a small CIFAR-sized CNN with batch
norm, in-place ReLU, residual blocks, dropout and a classifier head.

Run with /usr/bin/python3 (torch from Debian's python3-torch):
    make_demo_model.py OUT.pt
Input: x:float32[B,3,32,32]; loss: cross_entropy:y:int64[B]{0,10}.
"""
import sys

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.skip(x))


class DemoNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.layer1 = Block(32, 32, 1)
        self.layer2 = Block(32, 64, 2)
        self.layer3 = Block(64, 128, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.head(self.drop(torch.flatten(self.pool(x), 1)))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = DemoNet()
    model.train()
    torch.jit.script(model).save(sys.argv[1])
