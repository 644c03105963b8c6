"""The comparison point: a stock-style block-sparse kernel on 128-token tiles.

What the write-up started from: square tiles of a fixed size (128, the vector-lane width) over
the sequence padded to a multiple of the tile. A frame's token span is not a multiple of 128,
so live tiles straddle frame boundaries: this kernel visits every tile that is full or partial
and evaluates the frame mask (an iota predicate) inside every step, and the padding tokens
ride along. Same online softmax and float32 accumulation as ``kernels.blocksparse``; only the
tiling differs, which is what ``benchmarks/bench_kernels.py`` compares.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import masks
from kernels.blocksparse import (
    check_shapes,
    compiler_params,
    default_scale,
    dot_pv,
    dot_qk,
    pair_specs,
    resolve_interpret,
    segment_edges,
)

__all__ = ["cost_estimate", "tiled_table", "tiled_blocksparse_attention"]


def tiled_table(frames: int, tokens: int, window: int, tile: int) -> masks.LiveTable:
    """Every full or partial tile pair of the padded sequence, grouped by query tile."""
    codes = masks.block_live_map(frames, tokens, window, tile)
    qi, ki = np.nonzero(codes != masks.EMPTY)
    return masks.LiveTable(
        q_block=qi.astype(np.int32), k_block=ki.astype(np.int32), block=tile, n_blocks=codes.shape[0]
    )


def cost_estimate(
    *, heads: int, head_dim: int, frames: int, tokens_per_frame: int, window: int, tile: int = 128, itemsize: int = 2
) -> pl.CostEstimate:
    """What the kernel does, counted over the tiles it visits (full and partial, padding included).

    flops: 4 tile^2 d per visited tile pair and head (a partial tile costs a full one);
    transcendentals: one exp per visited logit plus one rescale exp per row per step; bytes: q
    and the output once per query tile, k and v re-read whenever the key tile index changes
    (`masks.kv_fetches`), plus the int32 tables. (The padding copies around the call are
    XLA's, counted by XLA.)
    """
    table = tiled_table(frames, tokens_per_frame, window, tile)
    visited = table.n_pairs * tile * tile
    q_tiles = len(np.unique(table.q_block))
    rows = (2 * q_tiles + 2 * masks.kv_fetches(table)) * tile  # q + out, k + v
    return pl.CostEstimate(
        flops=4 * visited * head_dim * heads,
        transcendentals=(visited + table.n_pairs * tile) * heads,
        bytes_accessed=heads * rows * head_dim * itemsize + 2 * 4 * table.n_pairs,
    )


def _kernel(
    q_block_ref,
    k_block_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_sc,
    l_sc,
    acc_sc,
    *,
    scale: float,
    tile: int,
    tokens: int,
    frames: int,
    window: int,
):
    p_id = pl.program_id(1)
    first, last = segment_edges(q_block_ref, p_id)

    @pl.when(first)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, -jnp.inf)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    rows = q_block_ref[p_id] * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, tile), 0)
    cols = k_block_ref[p_id] * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, tile), 1)
    fq, fk = rows // tokens, cols // tokens
    live = jnp.where(fq == 0, fk == 0, (jnp.abs(fq - fk) <= window) | (fk == 0)) & (fk < frames) & (fq < frames)
    s = jnp.where(live, dot_qk(q_ref[...], k_ref[...]) * scale, -jnp.inf)  # the mask predicate
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # rows with nothing live yet
    alpha = jnp.exp(m_prev - m_safe)
    p = jnp.exp(s - m_safe)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=-1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + dot_pv(p, v_ref[...])
    m_sc[...] = m_new

    @pl.when(last)
    def _finish():
        o_ref[...] = (acc_sc[...] / jnp.where(l_sc[...] == 0, 1.0, l_sc[...])).astype(o_ref.dtype)


def tiled_blocksparse_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    tile: int = 128,
    scale: float | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Frame-window attention with square ``tile`` blocks over the padded sequence, masked in-loop."""
    check_shapes(q, k, v, frames, tokens_per_frame)
    heads, seq, head_dim = q.shape
    padded = -(-seq // tile) * tile
    pad = ((0, 0), (0, padded - seq), (0, 0))
    qp, kp, vp = (jnp.pad(x, pad) for x in (q, k, v))
    scale = default_scale(head_dim) if scale is None else float(scale)
    table = tiled_table(frames, tokens_per_frame, window, tile)
    q_spec, k_spec, v_spec, o_spec = pair_specs(tile, head_dim)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(heads, table.n_pairs),
        in_specs=[q_spec, k_spec, v_spec],
        out_specs=o_spec,
        scratch_shapes=[
            pltpu.VMEM((tile, 1), jnp.float32),
            pltpu.VMEM((tile, 1), jnp.float32),
            pltpu.VMEM((tile, head_dim), jnp.float32),
        ],
    )
    call = pl.pallas_call(
        functools.partial(_kernel, scale=scale, tile=tile, tokens=tokens_per_frame, frames=frames, window=window),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        compiler_params=compiler_params(),
        cost_estimate=cost_estimate(
            heads=heads,
            head_dim=head_dim,
            frames=frames,
            tokens_per_frame=tokens_per_frame,
            window=window,
            tile=tile,
            itemsize=jnp.dtype(q.dtype).itemsize,
        ),
        interpret=resolve_interpret(interpret),
        name="sr_tiled_blocksparse_attention",
    )
    return call(jnp.asarray(table.q_block), jnp.asarray(table.k_block), qp, kp, vp)[:, :seq]
