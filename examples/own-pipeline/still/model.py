"""The one stage: each frame is the photo with its three channels scaled by a learned function of
the frame's time. No audio, no noise: deterministic, and driven only by the frame times the
runtime feeds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["StillConfig", "Still", "CONFIGS", "stage_inputs", "stage_outputs"]


@dataclass(frozen=True)
class StillConfig:
    name: str = "tiny"
    height: int = 32
    width: int = 64
    fps: int = 25
    hz: float = 0.5  # sway cycles per second
    depth: float = 0.2  # how far a channel's gain moves from 1


CONFIGS = {"tiny": StillConfig}


class Sway(nn.Module):
    def __init__(self, config: StillConfig):
        super().__init__()
        self.config = config
        self.mix = nn.Linear(2, 3)  # (sin, cos) of the phase -> a gain per channel

    def forward(self, image: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        c = self.config
        phase = (2 * math.pi * c.hz) * times  # (F,)
        feats = torch.stack([torch.sin(phase), torch.cos(phase)], dim=-1)  # (F, 2)
        gain = 1 + c.depth * torch.tanh(self.mix(feats))  # (F, 3)
        frames = image.to(torch.float32)[None] * gain[:, None, None, :]  # (F, H, W, 3)
        return torch.clamp(torch.round(frames), 0, 255).to(torch.uint8)


class Still(nn.Module):
    def __init__(self, config: StillConfig):
        super().__init__()
        self.sway = Sway(config)


def stage_inputs(config: StillConfig, frames: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [("image", (config.height, config.width, 3), "uint8"), ("times", (frames,), "float32")]


def stage_outputs(config: StillConfig, frames: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [("frames", (frames, config.height, config.width, 3), "uint8")]
