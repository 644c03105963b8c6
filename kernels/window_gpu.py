"""The SR's frame-window attention on NVIDIA GPUs: a Pallas kernel for Triton, no scalar prefetch.

``kernels/blocksparse.py`` visits only the live (query block, key block) pairs through tables it
prefetches into scalar memory (Mosaic's ``PrefetchScalarGridSpec``), which Pallas' Triton backend
does not have. The frame-window mask needs no table, though: which keys a query block meets follows
from its position. A query block covering frames ``fa..fb`` meets the reference frame (frame 0) and
the frames ``fa - window .. fb + window`` (frame 0's own queries see only frame 0): two runs of key tokens, each computed from
``pl.program_id`` with integer arithmetic. So the grid is (query blocks, heads); each program keeps
its query block and its online-softmax state in registers and walks two ``fori_loop`` runs of key
blocks (frame 0's, then its window's, starting where the first run ended so that no block is met
twice), and never writes a logit to HBM.

Triton takes power-of-two blocks; the SR's frames are not (avatar-720p: 3,680 tokens per frame,
whose largest power-of-two divisor is 32). So blocks here are ``BLOCK`` tokens whatever the frame
size, a block may straddle a frame edge, and each visited block applies the exact mask
(``masks.frame_mask``): key frame 0, or, for a query row past frame 0, within ``window`` frames of
its own; and inside the sequence. The sequence is
padded to a whole number of blocks and the head dimension to a power of two of at least 16
(Triton's smallest matmul), both with zeros outside the kernel (a padded key is masked, a padded
query row or column is dropped). Every query row has a live key in the first block it meets (frame
0's first tokens), so the running maximum is a real logit from the first step on.

Numerics: bf16 operands into both matmuls with float32 accumulation; the softmax runs online over
key blocks in base 2 (a reassociation, as in ``kernels/blocksparse.py``), so a build with this
route is judged by the similarity band. ``interpret=True`` runs the same kernel through the Pallas
interpreter on any backend: how its numerics are tested without a GPU.

Cost, per call and device (XLA's cost model sees nothing inside the custom call: ``estimate``): the
two matmuls over the visited blocks (their masked parts included: the kernel computes them), one
exp per visited logit, and the HBM bytes of q and the output once, with K and V read once per query
block over its runs, unless ``l2_reuse``: neighbouring query blocks share their window, so the K and
V a window covers (720p: five frames, 9.4 MB, plus frame 0's 1.9 MB) are taken to stay in the 50 MB
L2 cache of an H100 or H200 while the blocks that share it run, and HBM sees K and V once. An
assumption about the hardware, not a measurement.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

__all__ = ["NAME", "BLOCK", "window_attention_gpu", "visited_blocks", "key_runs", "estimate"]

NAME = "sr_window_attention"  # the pallas_call name: how a compiled program's kernel is found again
BLOCK = 64  # query and key tokens per step: a power of two (Triton), 64 x 128 f32 accumulator per program
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: exp2 of (masked - max) is 0, never NaN
_LOG2E = math.log2(math.e)


def _pow2_at_least(n: int, floor: int = 16) -> int:
    return max(floor, 1 << (n - 1).bit_length())


def key_runs(qb, *, block: int, frames: int, tokens_per_frame: int, window: int, n_blocks: int):
    """(first run end, second run start, second run end), in key blocks, for query block ``qb``:
    frame 0's blocks are [0, end0); the window's are [start1, end1), starting no earlier than end0.
    One formula for a traced int32 inside the kernel (``lax``/``jnp`` arithmetic, which lowers for
    Triton; every value is non-negative, so ``lax.div``'s truncation is floor division) and for a
    Python int (the cost count, the tests)."""
    static = isinstance(qb, int)
    div = (lambda a, b: a // b) if static else lax.div
    maximum, minimum = (max, min) if static else (jnp.maximum, jnp.minimum)
    pick = (lambda c, a, b: a if c else b) if static else jnp.where
    t = tokens_per_frame
    end0 = -(-t // block)
    first_row = qb * block
    last_row = minimum(first_row + (block - 1), frames * t - 1)
    lo = maximum(div(first_row, t) - window, 0) * t
    last_frame = div(last_row, t)
    hi = (pick(last_frame > 0, minimum(last_frame + window, frames - 1), 0) + 1) * t  # frame 0 sees only itself
    start1 = maximum(div(lo, block), end0)
    return end0, start1, maximum(start1, minimum(div(hi + (block - 1), block), n_blocks))


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    *,
    scale: float,
    block: int,
    frames: int,
    tokens_per_frame: int,
    window: int,
    n_blocks: int,
):
    from jax.experimental.pallas import triton as plgpu

    t, seq = tokens_per_frame, frames * tokens_per_frame
    qb = pl.program_id(0)
    q = q_ref[...]
    rows = qb * block + jnp.arange(block, dtype=jnp.int32)
    row_frame = lax.div(rows, t)

    def step(kb, carry):
        acc, m, l = carry
        k = k_ref[pl.ds(kb * block, block), :]
        v = v_ref[pl.ds(kb * block, block), :]
        s = plgpu.dot(q, k, trans_b=True) * (scale * _LOG2E)  # (block, block) f32, base-2 logits
        cols = kb * block + jnp.arange(block, dtype=jnp.int32)
        col_frame = lax.div(cols, t)
        near = (row_frame[:, None] > 0) & (jnp.abs(row_frame[:, None] - col_frame[None, :]) <= window)
        live = ((col_frame[None, :] == 0) | near) & (cols[None, :] < seq)
        s = jnp.where(live, s, _MASKED)
        m_new = jnp.maximum(m, s.max(axis=-1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        l_new = alpha * l + p.sum(axis=-1)
        acc_new = alpha[:, None] * acc + plgpu.dot(p.astype(v.dtype), v)
        return acc_new, m_new, l_new

    end0, start1, end1 = key_runs(qb, block=block, frames=frames, tokens_per_frame=t, window=window, n_blocks=n_blocks)
    state = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((block,), -jnp.inf, jnp.float32),
        jnp.zeros((block,), jnp.float32),
    )
    state = lax.fori_loop(0, end0, step, state)
    acc, _, l = lax.fori_loop(start1, end1, step, state)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def window_attention_gpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    scale: float | None = None,
    block: int = BLOCK,
    interpret: bool = False,
) -> jax.Array:
    """Attention under the SR frame-window mask (frame 0 and +-``window`` frames), as one Triton
    kernel. q, k, v: (heads, frames * tokens_per_frame, head_dim) of one dtype; ``scale`` defaults
    to 1/sqrt(head_dim). Returns (heads, S, head_dim) in q's dtype. ``interpret`` runs it through the
    Pallas interpreter (any backend) instead of lowering it for Triton."""
    from jax.experimental.pallas import triton as plgpu

    seq = frames * tokens_per_frame
    if q.ndim != 3 or q.shape[1] != seq or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be (heads, {seq}, head_dim) of one shape, got {q.shape}, {k.shape}, {v.shape}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two of at least 16 (Triton), got {block}")
    heads, _, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    n_blocks = -(-seq // block)
    padded_seq, padded_dim = n_blocks * block, _pow2_at_least(head_dim)

    def pad(x: jax.Array) -> jax.Array:
        if (padded_seq, padded_dim) == (seq, head_dim):
            return x
        return jnp.pad(x, ((0, 0), (0, padded_seq - seq), (0, padded_dim - head_dim)))

    kernel = functools.partial(
        _kernel,
        scale=scale,
        block=block,
        frames=frames,
        tokens_per_frame=tokens_per_frame,
        window=window,
        n_blocks=n_blocks,
    )
    out = pl.pallas_call(
        kernel,
        grid=(n_blocks, heads),
        in_specs=[
            pl.BlockSpec((None, block, padded_dim), lambda i, h: (h, i, 0)),
            pl.BlockSpec((None, padded_seq, padded_dim), lambda i, h: (h, 0, 0)),
            pl.BlockSpec((None, padded_seq, padded_dim), lambda i, h: (h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, block, padded_dim), lambda i, h: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct((heads, padded_seq, padded_dim), q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4 if padded_dim <= 64 else 8, num_stages=2),
        interpret=interpret,
        name=NAME,
    )(pad(q), pad(k), pad(v))
    return out[:, :seq, :head_dim]


def visited_blocks(*, frames: int, tokens_per_frame: int, window: int, block: int = BLOCK) -> int:
    """(query block, key block) steps one head takes: the two runs of every query block."""
    n_blocks = -(-(frames * tokens_per_frame) // block)
    total = 0
    for qb in range(n_blocks):
        end0, start1, end1 = key_runs(
            qb, block=block, frames=frames, tokens_per_frame=tokens_per_frame, window=window, n_blocks=n_blocks
        )
        total += end0 + (end1 - start1)
    return total


def estimate(
    *,
    heads: int,
    head_dim: int,
    frames: int,
    tokens_per_frame: int,
    window: int,
    itemsize: int = 2,
    block: int = BLOCK,
    l2_reuse: bool = True,
) -> dict[str, float]:
    """One call's cost on one device, as declared with the route (the compile adds it per call site:
    XLA's cost model cannot see into a Triton kernel). flops: the two matmuls of every visited step
    (2 x block^2 x head_dim each); one exp per visited logit; bytes: q, k, v and the output once
    with ``l2_reuse`` (an assumption about the hardware), else K and V once per visited step."""
    steps = visited_blocks(frames=frames, tokens_per_frame=tokens_per_frame, window=window, block=block)
    d = _pow2_at_least(head_dim)
    seq = frames * tokens_per_frame
    one = heads * seq * head_dim * itemsize
    kv = 2 * one if l2_reuse else 2 * heads * steps * block * d * itemsize
    return {
        "flops": float(4 * heads * steps * block * block * d),
        "transcendentals": float(heads * steps * block * block),
        "bytes accessed": float(2 * one + kv),
    }
