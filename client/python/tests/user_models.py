"""Models as users write them, shared by the apply tests
(test_apply.py) and the CPU apply tier (bench/apply/apply_zoo_cpu.py): a
pre-norm ViT with nn.MultiheadAttention and an Optional mask argument, and
a timm-style ConvNeXt (depthwise 7x7, LayerNorm over channels after a
permute, MLP, layer scale, residual). Scriptable with torch.jit.script."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class VitBlock(nn.Module):
    """A user's pre-norm ViT block: nn.MultiheadAttention and an MLP
    Sequential(Linear, GELU, Linear)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                 nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Vit(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, depth: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.blocks = nn.ModuleList([VitBlock(d, heads)
                                     for _ in range(depth)])
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x.mean(1))


class Mlp(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvNextBlock(nn.Module):
    """timm's ConvNeXt block: depthwise 7x7, LayerNorm over channels after
    a permute, MLP, layer scale (a parameter multiply), residual."""

    def __init__(self, d: int, layer_scale: float = 0.5) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.mlp = Mlp(d)
        self.gamma = nn.Parameter(torch.full((d,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        x = self.mlp(x).permute(0, 3, 1, 2)
        x = x.mul(self.gamma.reshape(1, -1, 1, 1))
        return x + shortcut


class ConvNext(nn.Module):
    def __init__(self, d: int = 16, depth: int = 3,
                 layer_scale: float = 0.5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, d, 4, 4)
        self.blocks = nn.Sequential(*[ConvNextBlock(d, layer_scale)
                                      for _ in range(depth)])
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))
