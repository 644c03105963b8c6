"""Motion DiT: a rectified-flow transformer that turns noise into one chunk of motion latents.

Per chunk of F frames, conditioned on
  - the photo            -> one reference token per latent patch (same for every frame),
  - the previous chunk   -> its last latent frame, one token per patch (continuity across chunks),
  - the audio            -> log-mel features per frame, which with the timestep drive adaLN
                            (shift / scale / gate) per frame.
Self-attention runs over all F * T_d tokens (3-D rotary positions). The sampler is N Euler steps
along the straight noise -> data path, unrolled into the traced program:

    x_1 = noise;   x_{t'} = x_t + (t' - t) * v(x_t, t, cond)   for t = 1 -> 0 in N equal steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from avatar_release.pipeline import run_blocks
from model.attention import MLP, Linear, SelfAttention, rope_tables
from model.config import PipelineConfig
from model.patches import image_tokens, patchify, unpatchify


def log_mel(audio: torch.Tensor, frames: int, sample_rate: int, n_mels: int) -> torch.Tensor:
    """Per-frame log-mel features (F, n_mels) of a waveform (F * n,), one n-sample window per frame.

    Plain torch ops with every constant built on audio.device, so the same code runs in eager
    torch and traces through torchax (which has no lowering for torch.hann_window).
    """
    n = audio.shape[0] // frames  # samples per frame: the DFT length
    dev = audio.device
    k = torch.arange(n, device=dev, dtype=torch.float32)
    window = 0.5 - 0.5 * torch.cos(2 * math.pi * k / n)  # periodic Hann, (n,)
    spec = torch.fft.rfft(audio.float().reshape(frames, n) * window, dim=-1)  # (F, n/2+1) complex
    power = spec.real.square() + spec.imag.square()  # (F, n/2+1)

    # Triangular filters evenly spaced on the HTK mel scale from 0 Hz to Nyquist.
    mel_max = 2595.0 * math.log10(1.0 + (sample_rate / 2) / 700.0)
    mels = torch.arange(n_mels + 2, device=dev, dtype=torch.float32) * (mel_max / (n_mels + 1))
    edges = 700.0 * (torch.pow(10.0, mels / 2595.0) - 1.0)  # (n_mels + 2,) Hz
    bins = torch.arange(n // 2 + 1, device=dev, dtype=torch.float32) * (sample_rate / n)  # (n/2+1,) Hz
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # (n_mels, 1) each
    filters = torch.clamp(torch.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), min=0.0)
    return torch.log(power @ filters.T + 1e-6)  # (F, n_mels)


def timestep_embedding(t: float, dim: int, device: torch.device) -> torch.Tensor:
    """Sinusoidal features (1, dim) of a flow time t in [0, 1] (scaled to 0..1000 like DDPM steps)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=device, dtype=torch.float32) * (-math.log(10000.0) / half))
    args = (t * 1000.0) * freqs[None, :]  # (1, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: layer-normalise x (F, T, D) in float32, then per-frame scale and shift (F, 1, D)."""
    x = F.layer_norm(x.float(), x.shape[-1:], eps=1e-6)
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.attn = SelfAttention(dim, heads)
        self.mlp = MLP(dim, mlp_ratio * dim)
        self.modulation = Linear(dim, 6 * dim)  # per-frame condition -> shift/scale/gate x (attn, mlp)
        # A third of the block's weights, applied to one row per frame: a compiler gathering the
        # block's weights layer by layer leaves these where they are and moves the 6 x dim output
        # per frame instead (avatar_release.pipeline.stationary_params).
        self.modulation.weight_layout = "stationary"

    def forward(self, x: torch.Tensor, c: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n, T, D = x.shape  # (F, T, D) in the residual dtype; c (F, D) float32
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(c))[:, None].chunk(6, dim=-1)
        h = modulate(x, shift1, scale1).reshape(n * T, D)  # (F*T, D): attention sees the whole chunk
        x = x + (gate1 * self.attn(h, rope).view(n, T, D)).to(x.dtype)
        x = x + (gate2 * self.mlp(modulate(x, shift2, scale2))).to(x.dtype)
        return x


class MotionDiT(nn.Module):
    def __init__(self, config: PipelineConfig):
        super().__init__()
        self.config = config
        c, d, p = config, config.dit.dim, config.dit.patch
        cell = c.vae_scale * c.sr_scale  # pixels per DiT latent cell side
        self.latent_embed = Linear(c.latent_channels * p * p, d)  # noisy latent patch -> token
        self.prev_embed = Linear(c.latent_channels * p * p, d)  # previous chunk's last latent patch
        self.ref_embed = Linear(3 * (cell * p) ** 2, d)  # the photo's pixels under the patch
        self.audio_in = Linear(c.n_mels, d)
        self.audio_out = Linear(d, d)
        self.time_in = Linear(c.dit.freq_dim, d)
        self.time_out = Linear(d, d)
        self.blocks = nn.ModuleList(DiTBlock(d, c.dit.heads, c.dit.mlp_ratio) for _ in range(c.dit.depth))
        self.final_modulation = Linear(d, 2 * d)
        self.out = Linear(d, c.latent_channels * p * p)  # token -> velocity patch

    def audio_features(self, audio: torch.Tensor) -> torch.Tensor:
        """(F * samples_per_frame,) waveform -> (F, n_mels) log-mel features."""
        c = self.config
        return log_mel(audio, audio.shape[0] // c.samples_per_frame, c.sample_rate, c.n_mels)

    def velocity(self, x, t, context, audio_c, rope):
        """v(x_t, t): x (F, C, h, w) f32, t a python float, context (1, T, D), audio_c (F, D) -> (F, C, h, w)."""
        c, p = self.config, self.config.dit.patch
        time_c = self.time_out(F.silu(self.time_in(timestep_embedding(t, c.dit.freq_dim, x.device))))  # (1, D)
        cond = audio_c + time_c  # (F, D)
        dtype = getattr(torch, c.residual_dtype)
        h = (self.latent_embed(patchify(x, p)) + context).to(dtype)  # (F, T, D)
        h = run_blocks(self.blocks, h, cond, rope, scan=c.scan_layers)
        shift, scale = self.final_modulation(F.silu(cond))[:, None].chunk(2, dim=-1)  # (F, 1, D) each
        v = self.out(modulate(h, shift, scale))  # (F, T, C p p) float32
        return unpatchify(v, p, c.dit_grid)  # (F, C, h, w)

    def forward(self, image_u8, audio, prev_latent, noise):
        """image_u8 (H, W, 3) uint8, audio (F*spf,) f32, prev_latent (C, h, w) f32, noise (F, C, h, w) f32
        -> latents (F, C, h, w) f32, last_latent (C, h, w) f32."""
        c, p = self.config, self.config.dit.patch
        n, (h, w) = noise.shape[0], c.dit_grid

        # Conditioning, computed once per chunk.
        ref = self.ref_embed(image_tokens(image_u8, c.vae_scale * c.sr_scale * p, c.decoded_size))  # (T, D)
        prev = self.prev_embed(patchify(prev_latent[None], p))  # (1, T, D)
        context = ref[None] + prev  # (1, T, D), the same for every frame
        feats = self.audio_features(audio)  # (F, n_mels)
        feats = F.layer_norm(feats, feats.shape[-1:], eps=1e-5)  # loudness-invariant shape of the spectrum
        audio_c = self.audio_out(F.silu(self.audio_in(feats)))  # (F, D)
        rope = rope_tables(n, h // p, w // p, c.dit.dim // c.dit.heads, noise.device)

        x = noise.float()  # (F, C, h, w), at t = 1
        ts = [1.0 - i / c.dit.steps for i in range(c.dit.steps + 1)]  # python floats: unrolled at trace
        for t, t_next in zip(ts[:-1], ts[1:]):
            x = x + (t_next - t) * self.velocity(x, t, context, audio_c, rope)
        return x, x[-1]
