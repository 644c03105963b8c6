"""Super-resolution transformer: DiT latents (F, C, h, w) -> SR latents (F, C, H', W').

The DiT latent is upsampled sr_scale x (nearest) and a transformer predicts a residual on top of
it. The sequence is (F + 1) frames x T tokens: frame 0 is a global reference frame encoded from
the photo, frames 1..F the video. The attention mask is frame-aligned:

    video frame i  ->  video frames j with |i - j| <= window, and the reference frame
    reference      ->  the reference frame only

Every live region of the mask is a whole (frame x frame) square of T x T tokens; that is the
structure the block-sparse kernel exploits once its blocks divide T. The reference frame is
dropped from the output.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from avatar_release.pipeline import replicated, run_blocks
from model.attention import MLP, Linear, RMSNorm, SelfAttention, rope_tables
from model.config import PipelineConfig
from model.patches import image_tokens, patchify, unpatchify, upsample_nearest


def frame_window_mask(frames: int, tokens: int, window: int, device: torch.device) -> torch.Tensor:
    """(S, S) bool, S = frames * tokens, True = may attend; frame 0 is the reference frame."""
    f = torch.arange(frames * tokens, device=device) // tokens  # (S,) frame of each token
    q, k = f[:, None], f[None, :]  # (S, 1), (1, S)
    video = ((q - k).abs() <= window) | (k == 0)
    return torch.where(q == 0, k == 0, video)


class SRBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = RMSNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim)

    def forward(self, x, rope, mask):
        x = x + self.attn(self.norm1(x), rope, mask).to(x.dtype)  # (S, D) in the residual dtype
        x = x + self.mlp(self.norm2(x)).to(x.dtype)
        return x


class SuperResolution(nn.Module):
    def __init__(self, config: PipelineConfig):
        super().__init__()
        self.config = config
        c, d, p = config, config.sr.dim, config.sr.patch
        self.latent_embed = Linear(c.latent_channels * p * p, d)  # upsampled latent patch -> token
        self.ref_embed = Linear(3 * (c.vae_scale * p) ** 2, d)  # the photo's pixels under the patch
        self.blocks = nn.ModuleList(SRBlock(d, c.sr.heads, c.sr.mlp_ratio) for _ in range(c.sr.depth))
        self.norm_out = RMSNorm(d)
        self.out = Linear(d, c.latent_channels * p * p)  # token -> residual latent patch

    def forward(self, latents, image_u8):
        """latents (F, C, h, w) f32, image_u8 (H, W, 3) uint8 -> sr_latents (F, C, H', W') f32."""
        c, p = self.config, self.config.sr.patch
        n = latents.shape[0]
        hs, ws = c.sr_grid
        T, D = c.sr_tokens_per_frame, c.sr.dim

        up = upsample_nearest(latents.float(), c.sr_scale)  # (F, C, H', W')
        video = self.latent_embed(patchify(up, p))  # (F, T, D)
        # (T, D), held whole by every device: it goes in front of the frame-sharded video
        ref = replicated(self.ref_embed(image_tokens(image_u8, c.vae_scale * p, c.decoded_size)))
        x = torch.cat([ref[None], video], dim=0).reshape((n + 1) * T, D)  # (S, D), frame 0 = reference
        x = x.to(getattr(torch, c.residual_dtype))

        mask = frame_window_mask(n + 1, T, c.sr.window, x.device)  # (S, S)
        rope = rope_tables(n + 1, hs // p, ws // p, D // c.sr.heads, x.device)
        x = run_blocks(self.blocks, x, rope, mask, scan=c.scan_layers)

        x = x.view(n + 1, T, D)[1:]  # (F, T, D): drop the reference frame
        residual = self.out(self.norm_out(x))  # (F, T, C p p) float32
        return up + unpatchify(residual, p, (hs, ws))  # (F, C, H', W')
