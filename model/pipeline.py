"""The whole pipeline: DiT -> SR -> VAE per chunk, and an eager reference renderer.

Each stage is compiled as its own program; `stage_inputs` / `stage_outputs` give the positional
(name, shape, dtype) signature of each, from the config alone, so the compile step can build
abstract shapes without running anything. Every stage takes the photo as a uint8 input: it is
small, and keeping it an input (not a baked constant) keeps one program per shape, not per photo.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from model.attention import Linear, SelfAttention
from model.chunks import audio_chunks, num_frames
from model.config import STAGES, PipelineConfig
from model.dit import MotionDiT
from model.noise import chunk_noise
from model.sr import SuperResolution
from model.vae import VAEDecoder

Signature = list[tuple[str, tuple[int, ...], str]]


class AvatarPipeline(nn.Module):
    def __init__(self, config: PipelineConfig):
        super().__init__()
        self.config = config
        self.dit = MotionDiT(config)
        self.sr = SuperResolution(config)
        self.vae = VAEDecoder(config)
        for m in self.modules():
            if isinstance(m, Linear):
                m.k_split = config.matmul_k_split
            if isinstance(m, SelfAttention):
                m.fused_preattn = config.fused_preattn

    def forward(self, image_u8, audio, prev_latent, noise):
        return self.render_chunk(image_u8, audio, prev_latent, noise)

    def render_chunk(self, image_u8, audio, prev_latent, noise):
        """One chunk: -> frames (F, H, W, 3) uint8, last_latent (C, h, w) f32 for the next chunk."""
        latents, last_latent = self.dit(image_u8, audio, prev_latent, noise)  # (F, C, h, w), (C, h, w)
        sr_latents = self.sr(latents, image_u8)  # (F, C, H', W')
        frames = self.vae(sr_latents, image_u8)  # (F, H, W, 3) uint8
        return frames, last_latent

    @torch.no_grad()
    def render(self, image_u8: np.ndarray, audio: np.ndarray, seed: int) -> np.ndarray:
        """Eager reference render of a whole track: -> (N, H, W, 3) uint8, N = ceil(len(audio) / spf).

        Whole chunks only (the tail is padded with silence; frames past the end are trimmed), the
        last latent carried from chunk to chunk, noise from (seed, chunk index).
        """
        c = self.config
        image = torch.from_numpy(np.ascontiguousarray(image_u8, dtype=np.uint8))
        if tuple(image.shape) != (c.height, c.width, 3):
            raise ValueError(
                f"image must have shape {(c.height, c.width, 3)} for config {c.name!r}, got {tuple(image.shape)}"
            )
        prev = torch.zeros(c.latent_channels, *c.dit_grid)  # the first chunk continues from nothing
        out = []
        for i, chunk in enumerate(audio_chunks(c, audio)):
            noise = torch.from_numpy(chunk_noise(c, seed, i))
            frames, prev = self.render_chunk(image, torch.from_numpy(chunk), prev, noise)
            out.append(frames.numpy())
        if not out:
            return np.zeros((0, c.height, c.width, 3), dtype=np.uint8)
        return np.concatenate(out)[: num_frames(c, len(audio))]


def stage_module(pipeline: AvatarPipeline, name: str) -> nn.Module:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return getattr(pipeline, name)


def stage_inputs(config: PipelineConfig, frames: int | None = None) -> dict[str, Signature]:
    """Each stage's positional inputs (name, shape, dtype) for a chunk of `frames` frames."""
    n = config.frames_per_chunk if frames is None else frames
    C, (h, w), (hs, ws) = config.latent_channels, config.dit_grid, config.sr_grid
    image = ("image", (config.height, config.width, 3), "uint8")
    return {
        "dit": [
            image,
            ("audio", (config.chunk_samples(n),), "float32"),
            ("prev_latent", (C, h, w), "float32"),
            ("noise", (n, C, h, w), "float32"),
        ],
        "sr": [("latents", (n, C, h, w), "float32"), image],
        "vae": [("sr_latents", (n, C, hs, ws), "float32"), image],
    }


def stage_outputs(config: PipelineConfig, frames: int | None = None) -> dict[str, Signature]:
    """Each stage's outputs (name, shape, dtype); dit returns a tuple, sr and vae one tensor."""
    n = config.frames_per_chunk if frames is None else frames
    C, (h, w), (hs, ws) = config.latent_channels, config.dit_grid, config.sr_grid
    return {
        "dit": [("latents", (n, C, h, w), "float32"), ("last_latent", (C, h, w), "float32")],
        "sr": [("sr_latents", (n, C, hs, ws), "float32")],
        "vae": [("frames", (n, config.height, config.width, 3), "uint8")],
    }
