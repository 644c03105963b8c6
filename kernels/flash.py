"""Flash attention for the DiT: dense softmax attention without a materialised score matrix.

Why this kernel exists
----------------------
The DiT attends over every token of the chunk (no mask): avatar-720p has 16 frames x 920 tokens
= 14,720 tokens per head. XLA's fused attention writes the 14,720 x 14,720 float32 logits of each
head to HBM, reads them back for the softmax and again (as bf16 probabilities) for the value
product: about 12 bytes per logit, 2.6 GB per head, layer and step, against 15 MB of q, k, v and
output. That traffic, not the arithmetic, bounds the stage. Here the logits of one
(query block, key block) pair live only in VMEM:

* grid ``(heads, query blocks, key blocks)``, key blocks innermost; a query block's output block
  and its softmax state (running max m, running sum l, float32 accumulator) stay resident across
  the key blocks and are written once, after the last;
* online softmax: each key block raises the running max where it must and rescales the state by
  ``exp(m_old - m_new)``; bf16 operands into both matmuls with float32 accumulation (the MXU's
  native mode), the probabilities rounded to v's dtype for the value matmul, as the model does;
* every block is fully live (no mask), so there are no predicates and no padding: the block
  sizes divide the sequence (`default_blocks`).

What it reads: q once per query block (its block index is constant along the key axis), k and v
once per (query block, key block) step (their index changes every step), and writes the output
once. That is ``S / block_q`` passes over K and V instead of the score matrix; `cost_estimate`
counts exactly that, and the flops of every visited pair, for XLA's scheduler and for
``compile/_flops.py``.

This is our code; JAX's ``jax.experimental.pallas.ops.tpu.flash_attention`` follows the same
recipe (with a batch axis, causal masking, segment ids and a backward pass, none of which the DiT
needs) and was read to check the Mosaic layout rules: the last two dims of every block are
multiples of (8, 128) or the array's own, and a key block that is a multiple of 128 keeps the
(block_q, block_k) logits tile lane-dense.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.blocksparse import default_scale, dot_pv, dot_qk, resolve_interpret
from kernels.target import mosaic_flags

__all__ = [
    "NAME",
    "cost_estimate",
    "default_blocks",
    "dense_attention_bytes",
    "dense_attention_flops",
    "fetches",
    "flash_attention",
    "flash_attention_jit",
    "flash_reference",
]

NAME = "dit_flash_attention"  # the pallas_call name: how a compiled program's kernel is found again
LANES = 128  # TPU vector lanes: key blocks that are multiples of this keep the logits tile lane-dense
SUBLANES_BF16 = 16  # finest bf16 tiling along the sequence
_STATIC = ("block_q", "block_k", "scale", "interpret")


# ---- ground truth ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("scale",))
def flash_reference(q: jax.Array, k: jax.Array, v: jax.Array, scale: float | None = None) -> jax.Array:
    """Dense softmax attention in plain JAX, all in float32 at full precision: the ground truth.

    q, k, v: (heads, S, head_dim) -> (heads, S, head_dim) in q's dtype. The (S, S) logits are
    materialised here on purpose; this is what the kernel must agree with, at small shapes.
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    hi = lax.Precision.HIGHEST
    s = jnp.einsum("hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32), precision=hi) * scale
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p, v.astype(jnp.float32), precision=hi).astype(q.dtype)


# ---- blocks and cost --------------------------------------------------------------------------


def _divisors(seq: int, step: int, limit: int) -> list[int]:
    return [b for b in range(step, min(seq, limit) + 1, step) if seq % b == 0]


def default_blocks(seq: int) -> tuple[int, int]:
    """(block_q, block_k) for a sequence of ``seq`` tokens; both divide it, each leaves >= 2 blocks.

    K and V are read once per query block, so block_q sets the traffic: the largest multiple of
    16 (a bf16 sublane tile) up to 2048. block_k is the lane axis of the logits tile: the largest
    multiple of 128 up to 1024, else of 16 up to 512. avatar-720p (14,720 tokens) -> (1840, 640):
    8 passes over K and V, a 4.7 MB float32 logits tile in VMEM; avatar-1080p's 8-frame bucket
    (16,320, no multiple of 128 divides it) -> (1632, 480); tiny (480) -> (240, 240), so even tiny
    runs the online softmax across key blocks. When nothing divides, the whole sequence, which
    Mosaic accepts as a block of any length.
    """

    def largest(rules) -> int:
        for step, limit in rules:
            sizes = _divisors(seq, step, min(limit, seq // 2))
            if sizes:
                return sizes[-1]
        return seq

    return largest([(SUBLANES_BF16, 2048)]), largest([(LANES, 1024), (SUBLANES_BF16, 512)])


def _check_blocks(seq: int, block_q: int, block_k: int) -> None:
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b < 1 or seq % b or (b != seq and b % 8):
            raise ValueError(
                f"{name}={b} must divide the sequence ({seq} tokens) and be a multiple of 8 "
                "(a sublane tile) unless it is the whole sequence"
            )


def fetches(outer: int, middle: int, inner: int, index_changes_with_inner: bool) -> int:
    """Copies a pipelined ``(outer, middle, inner)`` grid makes of one input, per call.

    A Pallas pipeline re-copies an input block only when its block index changes between
    consecutive steps. q's index (head, query block) is constant along the key axis: one copy per
    (head, query block). k's and v's index (head, key block) changes at every step when there is
    more than one key block, and otherwise only with the head.
    """
    if index_changes_with_inner:
        return outer * middle * inner if inner > 1 else outer
    return outer * middle


def cost_estimate(
    *, heads: int, seq: int, head_dim: int, block_q: int, block_k: int, itemsize: int = 2
) -> pl.CostEstimate:
    """What the kernel does, counted over the blocks it visits (all of them: there is no mask).

    flops: 2 b_q b_k d for q k^T plus 2 b_q b_k d for p v per (query block, key block) pair and
           head (= 4 S^2 d per head);
    transcendentals: one exp per logit, plus one exp per row per key block (the rescale factor);
    bytes: q once per query block, k and v once per visited pair (`fetches`), the output once.
    """
    _check_blocks(seq, block_q, block_k)
    nq, nk = seq // block_q, seq // block_k
    pairs = heads * nq * nk
    flops = 4 * pairs * block_q * block_k * head_dim
    trans = pairs * block_q * block_k + pairs * block_q
    rows = (
        fetches(heads, nq, nk, False) * block_q + 2 * fetches(heads, nq, nk, True) * block_k + heads * seq
    )  # q, k + v, out
    return pl.CostEstimate(flops=int(flops), transcendentals=int(trans), bytes_accessed=int(rows * head_dim * itemsize))


# ---- the kernel -----------------------------------------------------------------------------


def _kernel(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, scale: float):
    """One (head, query block, key block) step of the online softmax."""
    j = pl.program_id(2)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, -jnp.inf)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    s = dot_qk(q_ref[...], k_ref[...]) * scale  # (b_q, b_k) f32, only ever in VMEM
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))  # finite: no masked logits
    alpha = jnp.exp(m_prev - m_new)  # 0 on the first key block (m_prev = -inf)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=-1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + dot_pv(p, v_ref[...])  # p rounded to v's dtype, f32 accumulation
    m_sc[...] = m_new

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    scale: float | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Dense softmax attention, one pass over key blocks per query block, no (S, S) array.

    q, k, v: (heads, S, head_dim) of one dtype (bf16 in the model; float32 for exactness tests).
    block_q, block_k: divide S (default `default_blocks`). scale: default 1/sqrt(head_dim), as
    F.scaled_dot_product_attention. interpret: the Pallas interpreter (default: unless the
    kernel is built for TPU, kernels.target). Returns (heads, S, head_dim) in q's dtype.
    """
    if q.ndim != 3 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be (heads, S, head_dim) of one shape, got {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    heads, seq, head_dim = q.shape
    dq, dk = default_blocks(seq)
    block_q, block_k = block_q or dq, block_k or dk
    _check_blocks(seq, block_q, block_k)
    scale = default_scale(head_dim) if scale is None else float(scale)
    q_spec = pl.BlockSpec((None, block_q, head_dim), lambda h, i, j: (h, i, 0))
    kv_spec = pl.BlockSpec((None, block_k, head_dim), lambda h, i, j: (h, j, 0))
    return pl.pallas_call(
        functools.partial(_kernel, scale=scale),
        grid=(heads, seq // block_q, seq // block_k),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((block_q, 1), jnp.float32),
            pltpu.VMEM((block_q, 1), jnp.float32),
            pltpu.VMEM((block_q, head_dim), jnp.float32),
        ],
        # Heads and query blocks are independent; key blocks carry the softmax state, in order.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"), flags=mosaic_flags() or None
        ),
        cost_estimate=cost_estimate(
            heads=heads,
            seq=seq,
            head_dim=head_dim,
            block_q=block_q,
            block_k=block_k,
            itemsize=jnp.dtype(q.dtype).itemsize,
        ),
        interpret=resolve_interpret(interpret),
        name=NAME,
    )(q, k, v)


flash_attention_jit = jax.jit(flash_attention, static_argnames=_STATIC)


def dense_attention_bytes(*, heads: int, seq: int, head_dim: int, itemsize: int = 2) -> int:
    """HBM bytes of attention that materialises its logits: the lower bound of that formulation.

    q, k, v read and the output written once, plus the (S, S) logits written and read back as
    float32 and the probabilities written and read back in v's dtype (the model's
    ``reference_attention``: a softmax between two matmuls that XLA does not fuse across).
    """
    return heads * (4 * seq * head_dim * itemsize + seq * seq * (4 + 4 + itemsize + itemsize))


def dense_attention_flops(*, heads: int, seq: int, head_dim: int) -> int:
    """The same matmul flops as the kernel: 4 S^2 d per head (softmax elementwise work not counted)."""
    return 4 * heads * seq * seq * head_dim
