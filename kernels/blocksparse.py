"""Frame-aligned block-sparse attention for the SR stage (Pallas, one online-softmax pass).

Why this kernel exists
----------------------
The SR mask (model/sr.py `frame_window_mask`) is frame-aligned: a query frame sees the frames
within +-window of itself plus the reference frame 0. A stock block-sparse kernel tiles the
sequence in multiples of 128; T (tokens per frame) is not a multiple of 128, so its blocks straddle
frame edges, some come out partial and need mask predicates, and the sequence must be padded.
Here the block size is a multiple of 16 that divides T (`masks.aligned_block_sizes`), so every
block is wholly live or wholly dead:

* the grid visits only live (query block, key block) pairs, nothing else (no skipped steps);
* the reference frame's key blocks are just more live blocks of the same online softmax, so one
  pass covers the whole mask (no second pass, no merge of partial results);
* no mask predicates in the inner loop (every visited block is fully live) and no padding.

Grid / table design
-------------------
The live pairs are flattened into one list, grouped by query block (`masks.live_block_table`):
``q_block[p], k_block[p]`` for p in range(n_pairs). The grid is ``(heads, n_pairs)``; both int32
arrays are scalar-prefetched (``pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2)``) and the
BlockSpec index maps read them, so step p copies exactly query block ``q_block[p]`` and key/value
block ``k_block[p]``. A query block's pairs are consecutive, so its output block stays resident
across them (Pallas writes an output block back when its index changes); the first pair of a run
initialises the softmax state, the last one normalises and writes. First/last are derived from
neighbouring ``q_block`` entries, so no extra table is needed. This is the same grid/table idea as
splash attention's prefetched block lists, but flattened so that no step is a no-op.

On CPU (jax 0.10.2) ``PrefetchScalarGridSpec`` works in plain ``interpret=True`` mode: Pallas
discharges the kernel to ordinary XLA ops (a loop over the grid with dynamic slices), so the
program compiles, runs and serialises like any other XLA program. (The TPU-faithful interpreter,
``interpret=pltpu.InterpretParams()``, goes through host callbacks, which cannot be serialised, so
it is not used here.)

SMEM note: the tables are ``2 * n_pairs`` int32 (avatar-720p, block 368: 9100 pairs, 73 KB per
call, heads share them). If that is too much scalar memory on the target chip, the same grid can
be driven by O(query blocks) data: a query block's live key blocks are at most two contiguous
runs (frame 0, then its window), so (q block, run start, run length) per query block suffices.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import masks
from kernels.target import interpret_default, mosaic_flags

_STATIC = ("frames", "tokens_per_frame", "window", "block", "scale", "interpret", "q_block")


# ---- ground truth ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("scale",))
def reference_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | np.ndarray | None, scale: float | None = None
) -> jax.Array:
    """Dense masked softmax attention in plain JAX: the ground truth the kernels are tested against.

    q, k, v: (heads, S, head_dim); mask: (S, S) bool, True = may attend (or None: dense).
    Logits, softmax and the value product in float32 at full precision; output in q's dtype.
    Same semantics as F.scaled_dot_product_attention(q, k, v, attn_mask=mask) (scale 1/sqrt(d)).
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    hi = lax.Precision.HIGHEST
    s = jnp.einsum("hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32), precision=hi) * scale
    if mask is not None:
        s = jnp.where(jnp.asarray(mask)[None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("hqk,hkd->hqd", p, v.astype(jnp.float32), precision=hi).astype(q.dtype)


def default_scale(head_dim: int) -> float:
    """1/sqrt(head_dim), the default of F.scaled_dot_product_attention."""
    return 1.0 / math.sqrt(head_dim)


# ---- shared kernel pieces (also used by kernels.bounded_softmax) ------------------------------


@functools.lru_cache(maxsize=64)
def live_table(
    frames: int, tokens_per_frame: int, window: int, block: int, q_block: int | None = None
) -> masks.LiveTable:
    """Cached `masks.live_block_table` (static per shape; built once per trace)."""
    table = masks.live_block_table(frames, tokens_per_frame, window, block, q_block)
    table.q_block.setflags(write=False)
    table.k_block.setflags(write=False)
    return table


def resolve_block(tokens_per_frame: int, block: int | None) -> int:
    """The block size to use: `block` if aligned, else raise; None -> `masks.default_block`."""
    if block is None:
        return masks.default_block(tokens_per_frame)
    if block not in masks.aligned_block_sizes(tokens_per_frame):
        raise ValueError(
            f"block {block} must be a multiple of 16 dividing tokens per frame "
            f"{tokens_per_frame}: one of {masks.aligned_block_sizes(tokens_per_frame)}"
        )
    return block


def resolve_query_block(tokens_per_frame: int, q_block: int | None) -> int:
    """The query block size: `q_block` if aligned, else raise; None -> `masks.default_query_block`."""
    if q_block is None:
        return masks.default_query_block(tokens_per_frame)
    return resolve_block(tokens_per_frame, q_block)


def resolve_interpret(interpret: bool | None) -> bool:
    """None -> interpret unless built for TPU (the kernel uses TPU grid specs); see kernels.target."""
    return interpret_default() if interpret is None else bool(interpret)


def check_shapes(q: jax.Array, k: jax.Array, v: jax.Array, frames: int, tokens_per_frame: int) -> None:
    """q, k, v must be (heads, frames * tokens_per_frame, head_dim) of one dtype."""
    want = frames * tokens_per_frame
    if q.ndim != 3 or q.shape[1] != want:
        raise ValueError(f"q must be (heads, {want}, head_dim), got {q.shape}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v shapes differ: {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")


def segment_edges(q_block_ref, p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Is grid step p the first / last pair of its query block? (pairs are grouped by q block)."""
    n = pl.num_programs(1)
    here = q_block_ref[p]
    first = (p == 0) | (q_block_ref[jnp.maximum(p - 1, 0)] != here)
    last = (p == n - 1) | (q_block_ref[jnp.minimum(p + 1, n - 1)] != here)
    return first, last


def _precision(dtype) -> lax.Precision:
    """Full-precision MXU passes for float32 inputs; native single pass for bf16."""
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def dot_qk(q: jax.Array, k: jax.Array) -> jax.Array:
    """(b, d) x (b, d) -> (b, b) float32 logits, contracting head_dim without a transpose."""
    return lax.dot_general(
        q, k, (((1,), (1,)), ((), ())), precision=_precision(q.dtype), preferred_element_type=jnp.float32
    )


def dot_pv(p: jax.Array, v: jax.Array) -> jax.Array:
    """(b, b) probabilities x (b, d) values -> (b, d) float32; p is cast to v's dtype for the MXU."""
    return lax.dot_general(
        p.astype(v.dtype),
        v,
        (((1,), (0,)), ((), ())),
        precision=_precision(v.dtype),
        preferred_element_type=jnp.float32,
    )


def pair_specs(block: int, head_dim: int, n_extra_prefetch: int = 0, q_block: int | None = None):
    """BlockSpecs for q, k, v and out driven by the prefetched (q_block, k_block) tables:
    `q_block` rows of q and out (default `block`), `block` rows of k and v.

    Index maps get (head, pair, q_block_ref, k_block_ref, *other prefetched refs).
    """
    shape = (None, block, head_dim)
    q_shape = (None, block if q_block is None else q_block, head_dim)

    def q_map(h, p, qb, kb, *_):
        return h, qb[p], 0

    def kv_map(h, p, qb, kb, *_):
        return h, kb[p], 0

    q_spec = pl.BlockSpec(q_shape, q_map)
    kv_spec = pl.BlockSpec(shape, kv_map)
    return q_spec, kv_spec, kv_spec, pl.BlockSpec(q_shape, q_map)


def compiler_params() -> pltpu.CompilerParams:
    """Heads are independent (parallel); pairs carry the softmax state (arbitrary, in order).

    On a TPU target, plus the Mosaic flags the build's flag profile pins (kernels.target).
    """
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"), flags=mosaic_flags() or None)


# ---- cost model -----------------------------------------------------------------------------


def cost_estimate(
    *,
    heads: int,
    head_dim: int,
    frames: int,
    tokens_per_frame: int,
    window: int,
    block: int | None = None,
    itemsize: int = 2,
    rescale: bool = True,
    q_block: int | None = None,
) -> pl.CostEstimate:
    """What the kernel actually does, counted over the live pairs only (so XLA schedules it honestly).

    flops: 2*bq*bk*d for q k^T plus 2*bq*bk*d for p v per visited block pair and head
           (= 4 * live token pairs * head_dim * heads);
    transcendentals: one exp per live logit, plus one exp per row per step for the online
           rescale factor when `rescale` (the bounded-softmax path has none);
    bytes: q read once per query block (it stays resident over its run of pairs), k and v re-read
           whenever the key block index changes between steps (`masks.kv_fetches`), out written
           once; plus the int32 tables.
    """
    block = resolve_block(tokens_per_frame, block)
    q_block = block if q_block is None else resolve_block(tokens_per_frame, q_block)
    table = live_table(frames, tokens_per_frame, window, block, q_block)
    seq = frames * tokens_per_frame
    live_pairs = table.n_pairs * q_block * block
    flops = 4 * live_pairs * head_dim * heads
    trans = live_pairs * heads + (table.n_pairs * q_block * heads if rescale else 0)
    kv_rows = masks.kv_fetches(table) * block
    per_head = (seq + 2 * kv_rows + seq) * head_dim * itemsize
    bytes_accessed = heads * per_head + 2 * 4 * table.n_pairs
    return pl.CostEstimate(flops=int(flops), transcendentals=int(trans), bytes_accessed=int(bytes_accessed))


# ---- the kernel -----------------------------------------------------------------------------


def _kernel(q_block_ref, k_block_ref, q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, scale: float):
    """One live (query block, key block) pair of one head: a flash-attention step with no mask.

    The state (running max m, running sum l, f32 accumulator) lives in scratch across the
    consecutive pairs of one query block.
    """
    first, last = segment_edges(q_block_ref, pl.program_id(1))

    @pl.when(first)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, -jnp.inf)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    s = dot_qk(q_ref[...], k_ref[...]) * scale  # (b, b) f32; every entry is live
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))  # finite: the block is fully live
    alpha = jnp.exp(m_prev - m_new)  # 0 on the first pair (m_prev = -inf)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=-1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + dot_pv(p, v_ref[...])
    m_sc[...] = m_new

    @pl.when(last)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


def blocksparse_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    block: int | None = None,
    scale: float | None = None,
    interpret: bool | None = None,
    q_block: int | None = None,
) -> jax.Array:
    """Attention under the SR frame-window mask, visiting only live blocks, in one pass.

    q, k, v: (heads, frames * tokens_per_frame, head_dim), bf16 (or float32 for exactness tests).
    block: key rows per step, a multiple of 16 dividing tokens_per_frame (default: the largest
    such <= 512). q_block: query rows per step, likewise (default: the largest such <= 2048);
    each key block is read once per query block it meets, so larger query blocks read less.
    Each query row meets the same key blocks in the same order whatever q_block is.
    scale: logit scale (default 1/sqrt(head_dim), as F.scaled_dot_product_attention).
    interpret: run the kernel through the Pallas interpreter (default: unless on TPU).
    Returns (heads, S, head_dim) in q's dtype; f32 accumulation inside.
    Traceable under jax.jit (all arguments after v are static).
    """
    check_shapes(q, k, v, frames, tokens_per_frame)
    heads, seq, head_dim = q.shape
    block = resolve_block(tokens_per_frame, block)
    q_block = resolve_query_block(tokens_per_frame, q_block)
    scale = default_scale(head_dim) if scale is None else float(scale)
    table = live_table(frames, tokens_per_frame, window, block, q_block)
    q_spec, k_spec, v_spec, o_spec = pair_specs(block, head_dim, q_block=q_block)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(heads, table.n_pairs),
        in_specs=[q_spec, k_spec, v_spec],
        out_specs=o_spec,
        scratch_shapes=[
            pltpu.VMEM((q_block, 1), jnp.float32),
            pltpu.VMEM((q_block, 1), jnp.float32),
            pltpu.VMEM((q_block, head_dim), jnp.float32),
        ],
    )
    call = pl.pallas_call(
        functools.partial(_kernel, scale=scale),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=compiler_params(),
        cost_estimate=cost_estimate(
            heads=heads,
            head_dim=head_dim,
            frames=frames,
            tokens_per_frame=tokens_per_frame,
            window=window,
            block=block,
            itemsize=jnp.dtype(q.dtype).itemsize,
            q_block=q_block,
        ),
        interpret=resolve_interpret(interpret),
        name="sr_blocksparse_attention",
    )
    return call(jnp.asarray(table.q_block), jnp.asarray(table.k_block), q, k, v)


# The wrapper to call from inside a larger jitted program (or on its own): shape arguments static.
blocksparse_attention_jit = jax.jit(blocksparse_attention, static_argnames=_STATIC)


def frame_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    scale: float | None = None,
) -> jax.Array:
    """`reference_attention` under the SR token mask built from (frames, tokens_per_frame, window)."""
    mask = masks.token_mask(frames, tokens_per_frame, window)
    return reference_attention(q, k, v, mask, scale)
