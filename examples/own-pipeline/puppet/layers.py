"""The one matmul every puppet layer uses: float32, its contraction optionally split in k parts."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Linear(nn.Module):
    """y = x W^T + b, float32. ``k_split`` > 1 (when it divides d_in): the contraction as k float32
    partial products summed in order: the same math, the sum in another order.

    Parameters start at zeros (construction draws nothing from any RNG and works on the meta
    device); ``puppet.weights.init_weights`` fills them from a seeded generator.
    """

    def __init__(self, d_in: int, d_out: int, k_split: int = 1):
        super().__init__()
        self.k_split = k_split
        self.weight = nn.Parameter(torch.zeros(d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.k_split
        if k > 1 and x.shape[-1] % k == 0:
            y = None
            for xi, wi in zip(x.chunk(k, dim=-1), self.weight.chunk(k, dim=-1)):
                p = F.linear(xi, wi)
                y = p if y is None else y + p
        else:
            y = F.linear(x, self.weight)
        return y + self.bias
