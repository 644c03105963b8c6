"""The puppet: two stages per chunk.

motion (image, audio, pose, noise) -> (poses, last_pose)
    An identity code from the average-pooled photo, per-frame audio features, and a pose vector
    stepped frame by frame (smoothed, driven by audio and noise). ``last_pose`` is carried into
    the next chunk's ``pose`` (zeros before the first chunk).
decode (poses, image) -> frames
    Each frame's pose becomes a coarse RGB offset map, upsampled by repetition and added to the
    photo: uint8 (frames, H, W, 3).

Everything is float32 and deterministic; no buffers (a stage's state is its parameters only).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from puppet.config import PuppetConfig
from puppet.layers import Linear

STAGES = ("motion", "decode")


def _pool(image_u8: torch.Tensor, cell: int) -> torch.Tensor:
    """(H, W, 3) uint8 -> (H/cell * W/cell * 3,) float32 in [0, 1]: the photo's mean per cell."""
    H, W, _ = image_u8.shape
    x = image_u8.to(torch.float32) / 255.0
    return x.reshape(H // cell, cell, W // cell, cell, 3).mean(dim=(1, 3)).reshape(-1)


class Motion(nn.Module):
    def __init__(self, config: PuppetConfig):
        super().__init__()
        m, k = config.motion, config.matmul_k_split
        self.config = config
        self.audio_proj = Linear(config.samples_per_frame, m.audio_features, k)
        self.id_proj = Linear(config.id_dim, m.hidden, k)
        self.step = Linear(m.audio_features + m.hidden + m.pose_dim, m.hidden, k)
        self.out = Linear(m.hidden, m.pose_dim, k)

    def forward(self, image_u8, audio, pose, noise):
        c, m = self.config, self.config.motion
        frames = noise.shape[0]
        feats = torch.tanh(self.audio_proj(audio.reshape(frames, c.samples_per_frame) * 4.0))  # (F, A)
        ident = torch.tanh(self.id_proj(_pool(image_u8, c.id_cell)))  # (hidden,)
        poses = []
        for t in range(frames):
            h = torch.tanh(self.step(torch.cat([feats[t], ident, pose])))
            drive = torch.tanh(self.out(h) + m.noise_scale * noise[t])
            pose = m.smoothing * pose + (1.0 - m.smoothing) * drive
            poses.append(pose)
        return torch.stack(poses), pose


class Decode(nn.Module):
    weight_layout = "replicated"  # a few thousand weights: cheaper whole on every device than gathered

    def __init__(self, config: PuppetConfig):
        super().__init__()
        d, k = config.decode, config.matmul_k_split
        gh, gw = config.offset_grid
        self.config = config
        self.fc1 = Linear(config.motion.pose_dim + config.id_dim, d.hidden, k)
        self.fc2 = Linear(d.hidden, gh * gw * 3, k)

    def forward(self, poses, image_u8):
        c, d = self.config, self.config.decode
        frames, (gh, gw) = poses.shape[0], c.offset_grid
        ident = _pool(image_u8, c.id_cell).expand(frames, c.id_dim)
        h = torch.tanh(self.fc1(torch.cat([poses, ident], dim=-1)))
        off = torch.tanh(self.fc2(h)).reshape(frames, gh, 1, gw, 1, 3)
        off = off.expand(frames, gh, d.cell, gw, d.cell, 3).reshape(frames, c.height, c.width, 3)
        x = image_u8.to(torch.float32) / 255.0 + d.contrast * off
        return torch.round(x.clamp(0.0, 1.0) * 255.0).to(torch.uint8)


class Puppet(nn.Module):
    """The module tree: one attribute per stage, so its weights are named ``<stage>.<param>``."""

    def __init__(self, config: PuppetConfig):
        super().__init__()
        self.config = config
        self.motion = Motion(config)
        self.decode = Decode(config)

    @torch.no_grad()
    def render(self, image_u8: np.ndarray, audio: np.ndarray, noise_fn, frames_per_chunk: int) -> np.ndarray:
        """Eager reference: whole chunks, the pose carried, ``noise_fn(chunk_index, shape)`` per chunk."""
        c = self.config
        image = torch.from_numpy(np.ascontiguousarray(image_u8, dtype=np.uint8))
        n = frames_per_chunk * c.samples_per_frame
        chunks = max(1, -(-len(audio) // n))
        audio = np.pad(np.asarray(audio, np.float32), (0, chunks * n - len(audio)))
        pose, out = torch.zeros(c.motion.pose_dim), []
        for i in range(chunks):
            noise = torch.from_numpy(noise_fn(i, (frames_per_chunk, c.motion.pose_dim)))
            poses, pose = self.motion(image, torch.from_numpy(audio[i * n : (i + 1) * n]), pose, noise)
            out.append(self.decode(poses, image).numpy())
        return np.concatenate(out)


def stage_module(tree: Puppet, name: str) -> nn.Module:
    if name not in STAGES:
        raise ValueError(f"unknown puppet stage {name!r}; stages: {', '.join(STAGES)}")
    return getattr(tree, name)


Signature = list[tuple[str, tuple[int, ...], str]]


def stage_inputs(config: PuppetConfig, frames: int) -> dict[str, Signature]:
    image = ("image", (config.height, config.width, 3), "uint8")
    P = config.motion.pose_dim
    return {
        "motion": [
            image,
            ("audio", (config.chunk_samples(frames),), "float32"),
            ("pose", (P,), "float32"),
            ("noise", (frames, P), "float32"),
        ],
        "decode": [("poses", (frames, P), "float32"), image],
    }


def stage_outputs(config: PuppetConfig, frames: int) -> dict[str, Signature]:
    P = config.motion.pose_dim
    return {
        "motion": [("poses", (frames, P), "float32"), ("last_pose", (P,), "float32")],
        "decode": [("frames", (frames, config.height, config.width, 3), "uint8")],
    }
