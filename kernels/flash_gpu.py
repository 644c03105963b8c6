"""The DiT's flash attention on NVIDIA GPUs: JAX's Pallas kernel for Triton, in the model's layout.

``kernels/flash.py`` is written for Mosaic (TPU): VMEM scratch and TPU compiler parameters, which
Pallas' GPU backends do not lower ("Cannot lower pallas_call on platform: gpu"). JAX ships a flash
attention for GPUs written in Pallas for Triton, ``jax.experimental.pallas.ops.gpu.attention.mha``
(forward kernel ``mha_forward``): grid (query blocks, batch, heads), each program keeps one query
block and its online-softmax state in registers and walks the key blocks, so no (S, S) logits reach
HBM either. With jaxlib 0.10.2 it lowers to one ``__gpu$xla.gpu.triton`` custom call that XLA
compiles for the target's compute capability, with or without a GPU present (without one, Triton
assumes compute capability 9.0, the H100's and H200's).

This module only adapts the layout: the Ulysses chain hands each device (heads, S, head_dim); the
kernel takes (batch, S, heads, head_dim). The two transposes around it are XLA copies of q, k, v and
the output (4 x S x heads x head_dim elements), small beside the logits the kernel never writes.

Numerics: bf16 operands into both matmuls with float32 accumulation, as the reference; the softmax
runs online over key blocks (a reassociation, as in ``kernels/flash.py``), so a build with
``dit.attention = "flash"`` is judged by the similarity band like on TPU.

Cost, per call and device (XLA's cost model sees nothing inside the custom call, so the route
declares it: ``estimate``): 4 x S^2 x head_dim flops per head (two matmuls, ``cost_flops``), one exp
per logit, and the HBM bytes of q, k, v and the output, with one head's K and V assumed to stay in
L2 across its query blocks (``cost_bytes``; without that reuse, S / block passes over K and V).
"""

from __future__ import annotations

import math

import jax

__all__ = ["NAME", "MAX_BLOCK", "gpu_blocks", "flash_attention_gpu", "cost_bytes", "cost_flops", "estimate"]

NAME = "mha_forward"  # the pallas_call name of JAX's kernel: how a compiled program's kernel is found again
# Pallas' Triton lowering takes only power-of-two array shapes inside a kernel, and Triton's matmul
# tiles at least 16 rows; JAX's kernel defaults to 128 x 128 blocks and keeps a (block_q, head_dim)
# float32 accumulator per program: larger blocks only raise register pressure.
BLOCKS = (128, 64, 32, 16)
MAX_BLOCK = BLOCKS[0]


def gpu_blocks(seq: int) -> int | None:
    """The largest power-of-two block from 128 down to 16 dividing ``seq``; None when none does
    (the kernel needs blocks that divide the sequence: the caller keeps XLA's attention).
    avatar-720p's DiT (14,720 tokens) -> 128; avatar-1080p's (24 frames) -> 16."""
    return next((b for b in BLOCKS if b <= seq and seq % b == 0), None)


def flash_attention_gpu(
    q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float | None = None, interpret: bool = False
) -> jax.Array:
    """Dense softmax attention through JAX's Triton flash kernel. q, k, v: (heads, S, head_dim) of one
    dtype; ``scale`` defaults to 1/sqrt(head_dim) (F.scaled_dot_product_attention's). Returns
    (heads, S, head_dim) in q's dtype. Raises ValueError when no block divides S (``gpu_blocks``).
    ``interpret`` runs the kernel through the Pallas interpreter (any backend)."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    if q.ndim != 3 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be (heads, S, head_dim) of one shape, got {q.shape}, {k.shape}, {v.shape}")
    heads, seq, head_dim = q.shape
    block = gpu_blocks(seq)
    if block is None:
        raise ValueError(f"no power-of-two block of 16..128 tokens divides the sequence ({seq} tokens)")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)

    def to_kernel(x: jax.Array) -> jax.Array:  # (heads, S, hd) -> (1, S, heads, hd)
        return x.transpose(1, 0, 2)[None]

    out = gpu_attention.mha(
        to_kernel(q),
        to_kernel(k),
        to_kernel(v),
        segment_ids=None,
        sm_scale=scale,
        block_sizes=gpu_attention.BlockSizes(block_q=block, block_k=block),
        interpret=interpret,
    )
    return out[0].transpose(1, 0, 2)


def cost_flops(*, heads: int, seq: int, head_dim: int) -> int:
    """Matmul flops of one call: q.k and p.v, 2 x S^2 x head_dim each, per head."""
    return 4 * heads * seq * seq * head_dim


def cost_bytes(*, heads: int, seq: int, head_dim: int, itemsize: int = 2, l2_reuse: bool = True) -> int:
    """HBM bytes of one call. Each program reads its query block once and writes its output block
    once; it walks all of K and V, so without reuse K and V are read once per query block
    (S / block passes, ``l2_reuse=False``). With ``l2_reuse`` (the default), one head's K and V
    (2 x S x head_dim x itemsize: 7.5 MB at avatar-720p) are taken to stay in the L2 cache (50 MB on
    an H100 and an H200, XLA's target descriptions) while that head's query blocks run, so HBM sees
    q, k, v and the output once. An assumption about the hardware, not a measurement."""
    one = heads * seq * head_dim * itemsize
    if l2_reuse:
        return 4 * one
    block = gpu_blocks(seq) or seq
    return 2 * one + 2 * one * (seq // block)


def estimate(*, heads: int, seq: int, head_dim: int, itemsize: int = 2) -> dict[str, float]:
    """One call's cost on one device, as declared with the kernel's route (the compile adds it per
    call site: XLA's cost model cannot see into a Triton kernel): flops, one exp per logit, and the
    HBM bytes with L2 reuse (``cost_bytes``)."""
    return {
        "flops": float(cost_flops(heads=heads, seq=seq, head_dim=head_dim)),
        "transcendentals": float(heads * seq * seq),
        "bytes accessed": float(cost_bytes(heads=heads, seq=seq, head_dim=head_dim, itemsize=itemsize)),
    }
