"""Bounded-softmax attention: a precomputed per-row upper bound replaces the online running max.

Why
---
Flash-style attention keeps a running row max m and rescales its accumulator by exp(m_old - m_new)
whenever a key block raises it: a serial chain through the hottest loop. If an upper bound M_i on
every logit of row i is known up front, exp(s_ij - M_i) <= 1 never overflows and the accumulator
never needs rescaling; softmax is invariant to the constant M_i, so the result is unchanged.

The bound (Cauchy-Schwarz, on mean-centred keys)
------------------------------------------------
Subtracting one vector c from every key of a head shifts every logit of row i by the same amount
q_i . c, so the softmax of each row is unchanged, under any mask (a masked row still sees its own
keys shifted by the same constant). With c = the head's mean key, the centred keys k_j - c lose
their large common component, and

    s_ij = scale * q_i . k_j = scale * (q_i . c + q_i . (k_j - c))
         <= scale * (q_i . c + |q_i| * R_i),      R_i = max over keys j visible to row i of |k_j - c|.

The kernel uses M_i = scale * (q_i . c + |q_i| R_i) directly against the raw logits: this is the
centred bound with the centring folded into a per-row offset, so keys are never rewritten (no extra
pass over K, and the MXU still sees the original bf16 keys).

Under the windowed SR mask each row sees a different slice of the keys. R_i is taken as the max
over the key *frames* row i can see (frames within +-window plus frame 0). The mask is
frame-aligned, so those frames' keys are exactly row i's visible keys: every visible logit obeys the
inequality with this R_i, and it is tighter than the global max. (The global max over all keys is
also a valid bound, being a max over a superset of the visible keys, just looser;
`key_stats(..., radius="global")` gives it for comparison.) Dead keys never enter the kernel, so
they need no bound. The per-frame table R (heads x frames floats) and the per-head eligibility
flags are scalar-prefetched; |q_i| and q_i . c are computed in the kernel once per query block.

Eligibility
-----------
A loose bound is safe from overflow but not from underflow: the row's largest term is exp(-gap_i)
with gap_i = M_i - max_j s_ij. float32 exp underflows to subnormals below e^-87.3. A head is
eligible when an *upper estimate* of its largest gap is <= `DEFAULT_MAX_GAP` = 60: then the
row's largest term is >= e^-60 (normal), and only terms below e^-27 (2e-12) of the largest lose
precision (summed over all 62560 keys of avatar-720p at most ~1.2e-7 relative, i.e. float32
rounding). The estimate needs no
pass over the logits: the max of the visible logits is at least their mean, so

    gap_i <= scale * (|q_i| R_i - q_i . (mu_i - c)),    mu_i = mean of the keys row i can see.

Ineligible heads (e.g. one key with a huge norm makes R loose for every row that can see it) run
the standard online-softmax path in the same kernel, selected per head by the prefetched flag.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import blocksparse as bs
from kernels import masks

DEFAULT_MAX_GAP = 60.0  # largest allowed (bound - true row max), in logit units, float32
_STATIC = ("frames", "tokens_per_frame", "window", "block", "scale", "max_gap", "interpret")

Radius = Literal["visible", "global"]


# ---- statistics of the keys, plain JAX --------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("frames", "tokens_per_frame", "window", "radius"))
def key_stats(
    k: jax.Array, *, frames: int, tokens_per_frame: int, window: int, radius: Radius = "visible"
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-head centre and per-(head, query frame) bound radius and visible key mean.

    Returns (centre (heads, d) f32, R (heads, frames) f32, mu (heads, frames, d) f32):
    centre = mean key of the head; R[h, f] = max |k_j - centre| over the keys query frame f can see
    ("visible") or over all keys ("global"); mu[h, f] = mean of the keys query frame f can see.
    O(S d) work, a tiny fraction of the attention itself.
    """
    heads, seq, d = k.shape
    kf = k.astype(jnp.float32).reshape(heads, frames, tokens_per_frame, d)
    centre = kf.mean(axis=(1, 2))  # (h, d)
    norms = jnp.sqrt(jnp.sum(jnp.square(kf - centre[:, None, None, :]), axis=-1))  # (h, F, T)
    frame_max = norms.max(axis=-1)  # (h, F)
    fm = jnp.asarray(masks.frame_mask(frames, window))  # (F_q, F_k) bool
    if radius == "visible":
        r = jnp.max(jnp.where(fm[None], frame_max[:, None, :], 0.0), axis=-1)  # norms >= 0
    elif radius == "global":
        r = jnp.broadcast_to(frame_max.max(axis=-1, keepdims=True), frame_max.shape)
    else:
        raise ValueError(f"radius must be 'visible' or 'global', got {radius!r}")
    frame_mean = kf.mean(axis=2)  # (h, F, d)
    weights = fm.astype(jnp.float32) / fm.sum(axis=-1, keepdims=True)  # equal tokens per frame
    mu = jnp.einsum("qk,hkd->hqd", weights, frame_mean, precision=lax.Precision.HIGHEST)
    return centre, r, mu


def _row_frames(frames: int, tokens_per_frame: int) -> np.ndarray:
    return np.arange(frames * tokens_per_frame) // tokens_per_frame


@functools.partial(jax.jit, static_argnames=("frames", "tokens_per_frame", "window", "scale", "radius"))
def row_bounds(
    q: jax.Array,
    k: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    scale: float | None = None,
    radius: Radius = "visible",
) -> jax.Array:
    """(heads, S) f32: M_i = scale * (q_i . c + |q_i| R_i), an upper bound on row i's visible logits."""
    scale = bs.default_scale(q.shape[-1]) if scale is None else scale
    centre, r, _ = key_stats(k, frames=frames, tokens_per_frame=tokens_per_frame, window=window, radius=radius)
    qf = q.astype(jnp.float32)
    qn = jnp.sqrt(jnp.sum(qf * qf, axis=-1))
    qc = jnp.sum(qf * centre[:, None, :], axis=-1)
    return scale * (qc + qn * r[:, _row_frames(frames, tokens_per_frame)])


@functools.partial(jax.jit, static_argnames=("frames", "tokens_per_frame", "window", "scale"))
def gap_estimate(
    q: jax.Array, k: jax.Array, *, frames: int, tokens_per_frame: int, window: int, scale: float | None = None
) -> jax.Array:
    """(heads,) f32: an upper bound on max_i (M_i - max visible logit of row i), without the logits.

    Uses max >= mean over the visible keys: gap_i <= scale * (|q_i| R_i - q_i . (mu_i - c)).
    """
    scale = bs.default_scale(q.shape[-1]) if scale is None else scale
    centre, r, mu = key_stats(k, frames=frames, tokens_per_frame=tokens_per_frame, window=window)
    rows = _row_frames(frames, tokens_per_frame)
    qf = q.astype(jnp.float32)
    qn = jnp.sqrt(jnp.sum(qf * qf, axis=-1))
    mean_logit = jnp.sum(qf * (mu[:, rows, :] - centre[:, None, :]), axis=-1)
    return (scale * (qn * r[:, rows] - mean_logit)).max(axis=-1)


@functools.partial(jax.jit, static_argnames=("frames", "tokens_per_frame", "window", "scale", "max_gap"))
def eligible_heads(
    q: jax.Array,
    k: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    scale: float | None = None,
    max_gap: float = DEFAULT_MAX_GAP,
) -> tuple[jax.Array, jax.Array]:
    """Per-head flags (heads,) bool: True = the bounded path is safe; and the eligible share (f32)."""
    gap = gap_estimate(q, k, frames=frames, tokens_per_frame=tokens_per_frame, window=window, scale=scale)
    flags = gap <= max_gap
    return flags, flags.mean(dtype=jnp.float32)


# ---- plain-JAX reference ------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("scale",))
def bounded_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | np.ndarray,
    eligible: jax.Array,
    scale: float | None = None,
) -> jax.Array:
    """Bounded softmax in plain JAX at token level, written independently of the kernel's tables.

    Keys are explicitly centred; R_i is the max centred-key norm over row i's True mask entries;
    eligible heads use exp(s' - |q_i| R_i) with no max, ineligible heads the standard softmax.
    """
    scale = bs.default_scale(q.shape[-1]) if scale is None else scale
    hi = lax.Precision.HIGHEST
    mask = jnp.asarray(mask)
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    kc = kf - kf.mean(axis=1, keepdims=True)
    s = jnp.einsum("hqd,hkd->hqk", qf, kc, precision=hi) * scale
    knorm = jnp.sqrt(jnp.sum(kc * kc, axis=-1))  # (h, S)
    r = jnp.max(jnp.where(mask[None], knorm[:, None, :], 0.0), axis=-1)  # (h, S_q)
    bound = scale * jnp.sqrt(jnp.sum(qf * qf, axis=-1)) * r
    p = jnp.where(mask[None], jnp.exp(s - bound[..., None]), 0.0)
    bounded = jnp.einsum("hqk,hkd->hqd", p, vf, precision=hi) / p.sum(-1, keepdims=True)
    standard = bs.reference_attention(qf, kf, vf, mask, scale)
    out = jnp.where(jnp.asarray(eligible)[:, None, None], bounded, standard)
    return out.astype(q.dtype)


# ---- the kernel -----------------------------------------------------------------------------------


def _kernel(
    q_block_ref,
    k_block_ref,
    eligible_ref,
    radius_ref,
    q_ref,
    k_ref,
    v_ref,
    c_ref,
    o_ref,
    m_sc,
    l_sc,
    acc_sc,
    *,
    scale: float,
    frames: int,
    blocks_per_frame: int,
):
    """One live (query block, key block) pair of one head; the head's flag picks the path.

    Bounded path: m is the precomputed bound, fixed for the whole row; no max, no rescale.
    Fallback path: the standard online softmax (running max, rescaled accumulator).
    """
    h, p = pl.program_id(0), pl.program_id(1)
    first, last = bs.segment_edges(q_block_ref, p)
    bounded = eligible_ref[h] != 0

    @pl.when(first)
    def _init():
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)
        q = q_ref[...].astype(jnp.float32)
        r = radius_ref[h * frames + q_block_ref[p] // blocks_per_frame]
        q_norm = jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True))
        q_dot_c = jnp.sum(q * c_ref[...], axis=-1, keepdims=True)
        bound = scale * (q_dot_c + q_norm * r)
        m_sc[...] = jnp.where(bounded, bound, -jnp.inf)

    s = bs.dot_qk(q_ref[...], k_ref[...]) * scale  # (b, b) f32, every entry live

    @pl.when(bounded)
    def _fixed_max():
        e = jnp.exp(s - m_sc[...])  # <= 1 (up to rounding): no overflow, no rescale
        l_sc[...] += e.sum(axis=-1, keepdims=True)
        acc_sc[...] += bs.dot_pv(e, v_ref[...])

    @pl.when(jnp.logical_not(bounded))
    def _online():
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        e = jnp.exp(s - m_new)
        l_sc[...] = alpha * l_sc[...] + e.sum(axis=-1, keepdims=True)
        acc_sc[...] = alpha * acc_sc[...] + bs.dot_pv(e, v_ref[...])
        m_sc[...] = m_new

    @pl.when(last)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


def cost_estimate(
    *,
    heads: int,
    head_dim: int,
    frames: int,
    tokens_per_frame: int,
    window: int,
    block: int | None = None,
    itemsize: int = 2,
) -> pl.CostEstimate:
    """Cost of the kernel: as the block-sparse one, plus the centre reads and the per-row bound.

    Transcendentals are counted for the worst case (every head on the fallback path, with its
    rescale exps): the flags are data, unknown when the program is scheduled.
    """
    base = bs.cost_estimate(
        heads=heads,
        head_dim=head_dim,
        frames=frames,
        tokens_per_frame=tokens_per_frame,
        window=window,
        block=block,
        itemsize=itemsize,
        rescale=True,
    )
    seq = frames * tokens_per_frame
    extra_flops = heads * seq * 4 * head_dim  # |q|^2 and q . c per row
    extra_bytes = heads * (head_dim * 4 + 4 + frames * 4)  # centre, flag, radius table
    return pl.CostEstimate(
        flops=base.flops + extra_flops,
        transcendentals=base.transcendentals + heads * seq,
        bytes_accessed=base.bytes_accessed + extra_bytes,
    )


def bounded_softmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    frames: int,
    tokens_per_frame: int,
    window: int,
    block: int | None = None,
    scale: float | None = None,
    max_gap: float = DEFAULT_MAX_GAP,
    eligible: jax.Array | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Block-sparse SR attention with the bounded softmax on eligible heads, online on the rest.

    Same grid as `kernels.blocksparse.blocksparse_attention` (only live blocks, one pass, no
    mask). eligible: optional (heads,) bool override of `eligible_heads` (tests and benchmarks;
    forcing True on a loose head can underflow). Returns (heads, S, head_dim) in q's dtype.
    Traceable under jax.jit (all keyword arguments but `eligible` are static).
    """
    bs.check_shapes(q, k, v, frames, tokens_per_frame)
    heads, seq, head_dim = q.shape
    block = bs.resolve_block(tokens_per_frame, block)
    scale = bs.default_scale(head_dim) if scale is None else float(scale)
    table = bs.live_table(frames, tokens_per_frame, window, block)
    centre, radius, _ = key_stats(k, frames=frames, tokens_per_frame=tokens_per_frame, window=window)
    if eligible is None:
        eligible, _ = eligible_heads(
            q, k, frames=frames, tokens_per_frame=tokens_per_frame, window=window, scale=scale, max_gap=max_gap
        )
    q_spec, k_spec, v_spec, o_spec = bs.pair_specs(block, head_dim)
    c_spec = pl.BlockSpec((None, 1, head_dim), lambda h, p, *_: (h, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(heads, table.n_pairs),
        in_specs=[q_spec, k_spec, v_spec, c_spec],
        out_specs=o_spec,
        scratch_shapes=[
            pltpu.VMEM((block, 1), jnp.float32),
            pltpu.VMEM((block, 1), jnp.float32),
            pltpu.VMEM((block, head_dim), jnp.float32),
        ],
    )
    kernel = functools.partial(_kernel, scale=scale, frames=frames, blocks_per_frame=tokens_per_frame // block)
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=bs.compiler_params(),
        cost_estimate=cost_estimate(
            heads=heads,
            head_dim=head_dim,
            frames=frames,
            tokens_per_frame=tokens_per_frame,
            window=window,
            block=block,
            itemsize=jnp.dtype(q.dtype).itemsize,
        ),
        interpret=bs.resolve_interpret(interpret),
        name="sr_bounded_softmax_attention",
    )
    return call(
        jnp.asarray(table.q_block),
        jnp.asarray(table.k_block),
        jnp.asarray(eligible).astype(jnp.int32).reshape(heads),
        radius.reshape(heads * frames).astype(jnp.float32),
        q,
        k,
        v,
        centre[:, None, :],
    )


bounded_softmax_attention_jit = jax.jit(bounded_softmax_attention, static_argnames=_STATIC)
