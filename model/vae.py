"""VAE decoder: SR latents (F, C, H', W') -> delivered frames (F, H, W, 3) uint8.

A convolutional decoder with one 2x upsample per level (log2(vae_scale) of them), cropped to the
delivered size (1088 -> 1080 rows at 1080p). Quantisation to uint8 happens inside the stage: the
bytes it returns are the bytes that get hashed by the bit-exact gate and encoded into the video.

The photo is a skip connection: pixels = photo + skip_scale * tanh(decoded), so even random
weights give a video that visibly is the photo, moving.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import BF16
from model.config import PipelineConfig
from model.patches import upsample_nearest


class Conv2d(nn.Module):
    """Same-padded k x k convolution: bf16 weight and operands, float32 accumulation and result
    (the numerics of model.attention.Linear)."""

    def __init__(self, c_in: int, c_out: int, k: int = 3):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(c_out, c_in, k, k, dtype=BF16))  # filled by init_pipeline
        self.bias = nn.Parameter(torch.zeros(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x.to(BF16).float(), self.weight.float(), padding=self.weight.shape[-1] // 2)
        return y + self.bias[:, None, None]


class GroupNorm(nn.Module):
    """GroupNorm in float32 (parameters created here, not by nn.GroupNorm, to stay off the global RNG)."""

    def __init__(self, groups: int, channels: int, eps: float = 1e-6):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    # "grouped": F.group_norm (statistics over the tensor reshaped to its groups); "per_channel":
    # per-channel means first, then each group's mean of them, then the same for the variance
    # around the group mean. The same two-pass statistics summed in another order; the full-size
    # tensor is never reshaped, which on TPU costs a layout copy of it per norm (VAEConfig.norm_stats).
    stats = "grouped"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats != "per_channel":
            return F.group_norm(x.float(), self.groups, self.weight, self.bias, self.eps)
        x = x.float()
        n, c = x.shape[:2]
        per = c // self.groups

        def per_group(t: torch.Tensor) -> torch.Tensor:  # (N, C) -> the group means, per channel (N, C, 1, 1)
            return t.view(n, self.groups, per).mean(-1).repeat_interleave(per, dim=1)[:, :, None, None]

        mean = per_group(x.mean((2, 3)))
        centred = x - mean
        rstd = torch.rsqrt(per_group(centred.square().mean((2, 3))) + self.eps)
        return centred * rstd * self.weight[:, None, None] + self.bias[:, None, None]


class ResBlock(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm1 = GroupNorm(groups, channels)
        self.conv1 = Conv2d(channels, channels)
        self.norm2 = GroupNorm(groups, channels)
        self.conv2 = Conv2d(channels, channels)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class Upsample(nn.Module):
    """2x nearest upsample, then a conv that also changes the channel count."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = Conv2d(c_in, c_out)

    def forward(self, x):
        return self.conv(upsample_nearest(x, 2))


class VAEDecoder(nn.Module):
    def __init__(self, config: PipelineConfig):
        super().__init__()
        self.config = config
        ch, g = config.vae.channels, config.vae.groups
        self.conv_in = Conv2d(config.latent_channels, ch[0])
        self.res = nn.ModuleList(ResBlock(c, g) for c in ch)  # one per level
        self.up = nn.ModuleList(Upsample(a, b) for a, b in zip(ch[:-1], ch[1:]))  # between levels
        self.norm_out = GroupNorm(g, ch[-1])
        self.conv_out = Conv2d(ch[-1], 3)
        # A compiler's layout hint (avatar_release.pipeline.weight_layout_of), from the config: at production
        # size the decoder is 15M parameters (30 MB of bf16). Replicated, each device decodes its
        # own frames; sharded like the transformers, every convolution splits over output
        # channels and full-resolution activations are gathered between layers.
        self.weight_layout = config.vae.weights
        for m in self.modules():
            if isinstance(m, GroupNorm):
                m.stats = config.vae.norm_stats

    def forward(self, sr_latents, image_u8):
        """sr_latents (F, C, H', W') f32, image_u8 (H, W, 3) uint8 -> frames (F, H, W, 3) uint8."""
        c = self.config
        x = self.conv_in(sr_latents)  # (F, ch0, H', W')
        for i, res in enumerate(self.res):
            x = res(x)
            if i < len(self.up):
                x = self.up[i](x)  # (F, ch_{i+1}, 2^{i+1} H', 2^{i+1} W')
        x = self.conv_out(F.silu(self.norm_out(x)))  # (F, 3, H' vae_scale, W' vae_scale)
        x = x[:, :, : c.height, : c.width].permute(0, 2, 3, 1)  # (F, H, W, 3): crop the padding rows
        pixels = image_u8.float()[None] + c.vae.skip_scale * torch.tanh(x)
        return pixels.round().clamp(0, 255).to(torch.uint8)
