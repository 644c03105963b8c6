"""The building blocks both transformers share: bf16 Linear, RMSNorm, 3-D rotary, self-attention.

Numerics contract ("bf16 weights and matmuls, fp32 residual stream"): every matmul weight is a
bf16 parameter and every matmul runs in bf16; its result comes back as float32 (or the configured
residual dtype) before it touches the residual stream, a norm or a softmax-free elementwise op.
Norm weights and biases stay float32.

`attention` is the one place any model computes softmax attention, so later kernel work (block-
sparse, bounded-softmax, head-grouped collectives) can route every call to a custom kernel.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BF16 = torch.bfloat16


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention. q, k, v: (..., heads, S, head_dim); mask: (S, S) bool, True = may attend.

    Returns (..., heads, S, head_dim) in the dtype of q.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Linear(nn.Module):
    """y = x W^T + b with W a bf16 parameter and the matmul in bf16; y returned in `out_dtype`."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        # Parts the contraction is split into (PipelineConfig.matmul_k_split; set by the pipeline).
        # Parts that would not divide d_in fall back to one dot.
        self.k_split = 1
        # Zeros, not torch's default init: construction must not draw from the global RNG.
        # model.weights.init_pipeline fills the values from a seeded generator.
        self.weight = nn.Parameter(torch.zeros(d_out, d_in, dtype=BF16))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        # bf16 operands, float32 accumulation and result: what a bf16 MXU / tensor-core matmul
        # with a float32 accumulator computes (jnp.dot(..., preferred_element_type=float32)).
        # Written as a float32 product of bf16-rounded values so eager torch and XLA agree.
        x = x.to(BF16).float()
        w = self.weight.float()
        k = self.k_split
        if k > 1 and x.shape[-1] % k == 0:
            y = None
            for xi, wi in zip(x.chunk(k, dim=-1), w.chunk(k, dim=-1)):  # partial products, summed in float32
                p = F.linear(xi, wi)
                y = p if y is None else y + p
        else:
            y = F.linear(x, w)
        y = y.to(out_dtype)
        return y if self.bias is None else y + self.bias.to(out_dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis, computed in float32; returns float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


# ---- rotary position embedding over (frame, row, col) ------------------------------------------


def rope_tables(
    frames: int, rows: int, cols: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (S, head_dim / 2) for S = frames * rows * cols tokens in frame-major, row, col order.

    The head_dim / 2 rotation pairs are split between the axes: a third each to row and column
    (rounded down), the rest to the frame index. Built in forward with device=... so the tables
    are traced as constants of the program, not captured CPU tensors.
    """
    pairs = head_dim // 2
    n_row = n_col = head_dim // 6
    n_frame = pairs - n_row - n_col

    def axis_angles(n_pos: int, n_pairs: int) -> torch.Tensor:  # (n_pos, n_pairs)
        pos = torch.arange(n_pos, device=device, dtype=torch.float32)
        freq = 10000.0 ** (-torch.arange(n_pairs, device=device, dtype=torch.float32) / n_pairs)
        return pos[:, None] * freq[None, :]

    f = axis_angles(frames, n_frame)[:, None, None, :].expand(frames, rows, cols, n_frame)
    r = axis_angles(rows, n_row)[None, :, None, :].expand(frames, rows, cols, n_row)
    c = axis_angles(cols, n_col)[None, None, :, :].expand(frames, rows, cols, n_col)
    angles = torch.cat([f, r, c], dim=-1).reshape(frames * rows * cols, pairs)  # (S, hd/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the (first half, second half) pairs of x (..., S, hd) by the table angles (S, hd/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@torch.library.custom_op("avatar::pre_attention", mutates_args=())
def pre_attention(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre-attention chain as one op: qkv projection -> per-head RMS norm of q, k -> rotary.

    x (S, D) -> q, k, v (heads, S, head_dim) bf16. In eager PyTorch this is exactly the unfused
    SelfAttention code below; while tracing for a build the compiler can route it to the fused
    Pallas kernel (kernels/preattn.py) through a torchax override of this op.
    """
    S, D = x.shape
    hd = D // heads
    y = F.linear(x.to(BF16).float(), w_qkv.float())
    if b_qkv is not None:
        y = y + b_qkv
    q, k, v = y.view(S, 3, heads, hd).permute(1, 2, 0, 3).unbind(0)

    def norm(t, w):
        return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + eps) * w

    q = apply_rope(norm(q, q_norm), cos, sin).to(BF16)
    k = apply_rope(norm(k, k_norm), cos, sin).to(BF16)
    return q, k, v.to(BF16)


@pre_attention.register_fake
def _pre_attention_shapes(x, w_qkv, b_qkv, q_norm, k_norm, cos, sin, heads, eps):
    S, D = x.shape
    shape = (heads, S, D // heads)
    return tuple(x.new_empty(shape, dtype=BF16) for _ in range(3))


class SelfAttention(nn.Module):
    """qkv projection -> per-head RMS q/k norm -> rotary -> attention -> output projection.

    The chain before `attention` is the one the layout work later fuses into one kernel whose
    output is already in the layout the Ulysses all-to-all wants.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = Linear(dim, 3 * dim)
        # q/k norms keep logits bounded, which the bounded-softmax kernel's per-head bound relies on.
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)
        self.proj = Linear(dim, dim)
        # PipelineConfig.fused_preattn (set by the pipeline): call the pre-attention chain as the
        # one op `pre_attention`, which a build can route to the fused kernel.
        self.fused_preattn = False

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        S, D = x.shape  # (S, D): the whole sequence of the chunk
        if self.fused_preattn and self.qkv.k_split == 1:
            q, k, v = pre_attention(
                x,
                self.qkv.weight,
                self.qkv.bias,
                self.q_norm.weight,
                self.k_norm.weight,
                rope[0],
                rope[1],
                self.heads,
                self.q_norm.eps,
            )
            y = attention(q, k, v, mask)  # (nh, S, hs) bf16
            return self.proj(y.transpose(0, 1).reshape(S, D))
        qkv = self.qkv(x).view(S, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)  # (3, nh, S, hs)
        q, k, v = qkv.unbind(0)  # each (nh, S, hs) float32
        q = apply_rope(self.q_norm(q), *rope).to(BF16)
        k = apply_rope(self.k_norm(k), *rope).to(BF16)
        y = attention(q, k, v.to(BF16), mask)  # (nh, S, hs) bf16
        return self.proj(y.transpose(0, 1).reshape(S, D))  # (S, D) float32
