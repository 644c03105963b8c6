"""Deterministic weights from a seed, and safetensors loading that refuses what does not fit."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from puppet.config import PuppetConfig
from puppet.layers import Linear
from puppet.model import Puppet

GAIN = 0.5  # below variance-preserving: a contractive random net, as a trained one is


def init_weights(config: PuppetConfig, seed: int) -> Puppet:
    """Every Linear ~ N(0, GAIN^2 / fan_in), biases 0, drawn from one seeded generator in module order."""
    g = torch.Generator().manual_seed(int(seed))
    tree = Puppet(config)
    with torch.no_grad():
        for module in tree.modules():
            if isinstance(module, Linear):
                w = module.weight
                w.copy_(torch.randn(w.shape, generator=g, dtype=torch.float32) * (GAIN / math.sqrt(w.shape[1])))
                module.bias.zero_()
    return tree.requires_grad_(False).eval()


def load_weights(config: PuppetConfig, path: str) -> Puppet:
    """The tree for ``config`` with the tensors in ``path``; ValueError naming what does not fit."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"puppet weights {p}: not found")
    try:
        tensors = load_file(str(p))
    except Exception as e:  # safetensors has its own error type for a bad header
        raise ValueError(f"puppet weights {p}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    with torch.device("meta"):
        tree = Puppet(config)
    expected = tree.state_dict()
    problems = []
    if missing := sorted(expected.keys() - tensors.keys()):
        problems.append(f"missing {missing}")
    if unexpected := sorted(tensors.keys() - expected.keys()):
        problems.append(f"unexpected {unexpected}")
    for name in sorted(expected.keys() & tensors.keys()):
        want, got = expected[name], tensors[name]
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            problems.append(f"{name}: {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}")
    if problems:
        raise ValueError(f"puppet weights {p} do not fit config {config.name!r}: " + "; ".join(problems))
    tree.load_state_dict(tensors, strict=True, assign=True)
    return tree.requires_grad_(False).eval()
