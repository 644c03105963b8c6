"""The one stage: each sample is the speech track through a learned gain and a soft clip, mixed
with a learned fraction of the sample one frame earlier within the chunk (a short echo). No
image, no noise: deterministic, driven only by the audio the runtime feeds."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["EchoConfig", "Echo", "CONFIGS", "stage_inputs", "stage_outputs"]


@dataclass(frozen=True)
class EchoConfig:
    name: str = "tiny"
    sample_rate: int = 8000
    fps: int = 25
    samples_per_frame: int = 320  # sample_rate / fps


CONFIGS = {"tiny": EchoConfig}


class Shape(nn.Module):
    def __init__(self, config: EchoConfig):
        super().__init__()
        self.config = config
        self.gain = nn.Parameter(torch.ones(2))  # (dry gain, echo gain), before a squash

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        lag = self.config.samples_per_frame
        earlier = torch.cat([torch.zeros_like(audio[:lag]), audio[:-lag]])  # one frame earlier (zeros first)
        dry, wet = torch.sigmoid(self.gain[0]), 0.5 * torch.sigmoid(self.gain[1])
        return torch.tanh(dry * audio + wet * earlier)


class Echo(nn.Module):
    def __init__(self, config: EchoConfig):
        super().__init__()
        self.shape = Shape(config)


def stage_inputs(config: EchoConfig, frames: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [("audio", (frames * config.samples_per_frame,), "float32")]


def stage_outputs(config: EchoConfig, frames: int) -> list[tuple[str, tuple[int, ...], str]]:
    return [("out", (frames * config.samples_per_frame,), "float32")]
