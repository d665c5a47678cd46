"""A small 2D U-Net that exports cleanly to ONNX (imports torch: training extra only).

Conv 3x3 + BatchNorm + ReLU blocks, max-pool down, transposed-conv up, skip connections
by concatenation. BatchNorm is folded into the convolutions before export, so the ONNX
graph holds only Conv, Relu, MaxPool, ConvTranspose and Concat and accepts any batch and
any in-plane size that is a multiple of ``2 ** (levels - 1)``. The output is logits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class UNetConfig:
    """Shape of the network; ``channels[i]`` is the width at resolution level ``i``."""

    in_channels: int
    num_classes: int
    channels: tuple[int, ...] = (8, 16, 32, 64)

    @property
    def divisible_by(self) -> int:
        return 2 ** (len(self.channels) - 1)


class ConvBlock(nn.Sequential):
    """Two (conv 3x3, BatchNorm, ReLU) layers."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )


class UNet2d(nn.Module):
    """U-Net over (N, C, H, W) returning logits (N, num_classes, H, W)."""

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        self.config = config
        ch = config.channels
        self.down = nn.ModuleList()
        c_prev = config.in_channels
        for c in ch:
            self.down.append(ConvBlock(c_prev, c))
            c_prev = c
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for c_low, c_high in zip(ch[::-1][:-1], ch[::-1][1:], strict=True):
            self.up.append(nn.ConvTranspose2d(c_low, c_high, 2, stride=2))
            self.dec.append(ConvBlock(2 * c_high, c_high))
        self.head = nn.Conv2d(ch[0], config.num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            if i:
                x = self.pool(x)
            x = block(x)
            skips.append(x)
        skips.pop()
        for up, dec in zip(self.up, self.dec, strict=True):
            x = up(x)
            x = dec(torch.cat([x, skips.pop()], dim=1))
        return self.head(x)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Return an eval-mode copy of ``model`` with every Conv2d+BatchNorm2d pair fused."""
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = copy.deepcopy(model).eval()
    for module in folded.modules():
        if not isinstance(module, nn.Sequential):
            continue
        names = list(module._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = module._modules[a], module._modules[b]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                module._modules[a] = fuse_conv_bn_eval(conv, bn)
                module._modules[b] = nn.Identity()
    return folded
