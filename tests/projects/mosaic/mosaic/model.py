"""The mosaic stages, each returning what a library model might:

encode (image) -> identity                        EncodeOutput(sample=...), as UNet2DModel returns UNet2DOutput
motion (audio, pose, noise, identity) -> poses, last_pose    a dict, in another order than declared
decode (poses, image) -> frames, level            a tuple, by position

``encode`` reads only the photo, so its program is the same for every bucket.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from mosaic.config import MosaicConfig
from mosaic.outputs import EncodeOutput

STAGES = ("encode", "motion", "decode")


def _pool(image_u8: torch.Tensor, cell: int) -> torch.Tensor:
    """(H, W, 3) uint8 -> (H/cell, W/cell, 3) float32 in [0, 1]: the photo's mean per cell."""
    H, W, _ = image_u8.shape
    x = image_u8.to(torch.float32) / 255.0
    return x.reshape(H // cell, cell, W // cell, cell, 3).mean(dim=(1, 3))


class Encode(nn.Module):
    def __init__(self, c: MosaicConfig):
        super().__init__()
        self.c = c
        self.proj = nn.Linear(c.cells, c.identity)

    def forward(self, image_u8):
        return EncodeOutput(sample=torch.tanh(self.proj(_pool(image_u8, self.c.cell).reshape(-1))))


class Motion(nn.Module):
    def __init__(self, c: MosaicConfig):
        super().__init__()
        self.c = c
        self.audio_proj = nn.Linear(c.samples_per_frame, 8)
        self.step = nn.Linear(8 + c.identity + c.pose, c.pose)

    def forward(self, audio, pose, noise, identity):
        c, frames = self.c, noise.shape[0]
        feats = torch.tanh(self.audio_proj(audio.reshape(frames, c.samples_per_frame) * 4.0))  # (F, 8)
        poses = []
        for t in range(frames):
            drive = torch.tanh(self.step(torch.cat([feats[t], identity, pose])) + 0.1 * noise[t])
            pose = c.smoothing * pose + (1.0 - c.smoothing) * drive
            poses.append(pose)
        return {"last_pose": pose, "poses": torch.stack(poses)}


class Decode(nn.Module):
    def __init__(self, c: MosaicConfig):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(c.pose, c.cells)

    def forward(self, poses, image_u8):
        c, frames = self.c, poses.shape[0]
        gh, gw = c.height // c.cell, c.width // c.cell
        off = torch.tanh(self.fc(poses)).reshape(frames, gh, 1, gw, 1, 3)
        off = off.expand(frames, gh, c.cell, gw, c.cell, 3).reshape(frames, c.height, c.width, 3)
        x = (image_u8.to(torch.float32) / 255.0 + c.contrast * off).clamp(0.0, 1.0)
        return torch.round(x * 255.0).to(torch.uint8), x.mean(dim=(1, 2, 3))


class Mosaic(nn.Module):
    """The module tree: one attribute per stage, so its weights are named ``<stage>.<param>``."""

    def __init__(self, c: MosaicConfig):
        super().__init__()
        self.c = c
        self.encode, self.motion, self.decode = Encode(c), Motion(c), Decode(c)

    @torch.no_grad()
    def render(self, image_u8: np.ndarray, audio: np.ndarray, chunks: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """Eager reference: ``chunks`` is (frames, noise) per chunk, in order; the pose carried."""
        c, image = self.c, torch.from_numpy(np.ascontiguousarray(image_u8))
        identity = self.encode(image)["sample"]
        pose, start, out = torch.zeros(c.pose), 0, []
        for frames, noise in chunks:
            n = frames * c.samples_per_frame
            piece = torch.from_numpy(np.asarray(audio[start : start + n], np.float32))
            start += n
            moved = self.motion(piece, pose, torch.from_numpy(noise), identity)
            pose = moved["last_pose"]
            out.append(self.decode(moved["poses"], image)[0].numpy())
        return np.concatenate(out)


def init_weights(c: MosaicConfig, seed: int) -> Mosaic:
    """Every weight ~ N(0, 1 / fan_in) from one seeded generator in module order; biases 0."""
    g, tree = torch.Generator().manual_seed(int(seed)), Mosaic(c)
    with torch.no_grad():
        for m in tree.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / math.sqrt(m.weight.shape[1]))
                m.bias.zero_()
    return tree.requires_grad_(False).eval()


def load_weights(c: MosaicConfig, path: str) -> Mosaic:
    from safetensors.torch import load_file

    tree = Mosaic(c)
    try:
        tree.load_state_dict(load_file(path), strict=True)
    except (RuntimeError, OSError) as e:
        raise ValueError(f"mosaic weights {path} do not fit: {e}") from None
    return tree.requires_grad_(False).eval()


def signature(c: MosaicConfig, frames: int) -> dict[str, tuple[list, list]]:
    image = ("image", (c.height, c.width, 3), "uint8")
    poses = ("poses", (frames, c.pose), "float32")
    identity = ("identity", (c.identity,), "float32")
    return {
        "encode": ([image], [identity]),
        "motion": (
            [
                ("audio", (frames * c.samples_per_frame,), "float32"),
                ("pose", (c.pose,), "float32"),
                ("noise", (frames, c.pose), "float32"),
                identity,
            ],
            [poses, ("last_pose", (c.pose,), "float32")],
        ),
        "decode": (
            [poses, image],
            [("frames", (frames, c.height, c.width, 3), "uint8"), ("level", (frames,), "float32")],
        ),
    }
