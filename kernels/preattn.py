"""Fused pre-attention: qkv projection + per-head RMS norm of q, k + 3-D rotary + head packing.

In ``model.attention.SelfAttention`` the chain before attention is a handful of small ops (a
matmul, a view/permute, two norms, two rotaries, casts). Left to the compiler, each boundary is
a chance for a layout change, and the all-to-all that follows in the Ulysses layout wants its
operand in one specific layout: any mismatch is patched with a copy on the critical path. This
kernel owns the whole chain for a tile of tokens and writes its result directly in the layout the
Ulysses all-to-all consumes:

    packed (G, 3, heads / G, S_local, head_dim) bf16

group g holding the contiguous heads [g * heads / G, (g + 1) * heads / G), q, k and v stacked, so
``packed[g]`` is exactly group g's all-to-all operand (see ``kernels.ulysses``) and
``unpack_qkv`` recovers q, k, v as (heads, S_local, head_dim).

Numerics mirror the model: the matmul has bf16 operands and float32 accumulation (the model's
``Linear`` writes it as a float32 product of bf16-rounded values, which is the same products
summed in float32), the bias is added in float32, norms and rotary run in float32, and q, k, v
are rounded to bf16 last. ``preattn_reference`` is the plain-JAX mirror, op for op; ``preattn``
is the Pallas kernel, tiled over tokens (interpreted on CPU).

Exactness. The kernel and the jitted reference with ``matmul="bf16"`` (the kernel's dot) agree
bit for bit on XLA:CPU. Two things had to be pinned for that: the norm's sum of squares runs in
a fixed pairwise order (``_sum_last``), and the dot formulation is explicit (``_qkv_dot``).
Against the model's own formulation (``matmul="f32"``, the reference's default) the values
differ only by float32 summation order, i.e. in rare q/k/v elements by one bf16 step. Left to
the compiler is FMA contraction inside fusions: compiled code computes the rotary's
``x1 * cos - x2 * sin`` as one fused multiply-add, eager (op-by-op) execution, like eager torch,
rounds both products, so eager and compiled results differ in about 1e-5 of the q/k elements.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec

from kernels.target import interpret_default, mosaic_flags
from kernels.ulysses import _place, _shard_map, pack_groups

__all__ = [
    "PreAttnParams",
    "cost_estimate",
    "default_block_tokens",
    "preattn",
    "preattn_reference",
    "preattn_sharded",
    "rope_tables",
    "unpack_qkv",
]

BF16 = jnp.bfloat16
F32 = jnp.float32
Matmul = Literal["bf16", "f32"]


class PreAttnParams(NamedTuple):
    """SelfAttention's pre-attention weights, as the model stores them (a pytree).

    w_qkv (3D, D) bf16 (``qkv.weight``), b_qkv (3D,) float32 or None (``qkv.bias``),
    q_norm / k_norm (head_dim,) float32 (``q_norm.weight`` / ``k_norm.weight``).
    """

    w_qkv: jax.Array
    b_qkv: jax.Array | None
    q_norm: jax.Array
    k_norm: jax.Array


# ---- rotary tables --------------------------------------------------------------------------


def rope_tables(frames: int, rows: int, cols: int, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """cos, sin (S, head_dim / 2) float32 for frame-major (frame, row, col) tokens.

    Mirrors ``model.attention.rope_tables``: a third of the rotation pairs each (rounded down) to
    row and column, the rest to the frame index.
    """
    pairs = head_dim // 2
    n_row = n_col = head_dim // 6
    n_frame = pairs - n_row - n_col

    def axis_angles(n_pos: int, n_pairs: int) -> jax.Array:
        pos = jnp.arange(n_pos, dtype=F32)
        freq = 10000.0 ** (-jnp.arange(n_pairs, dtype=F32) / n_pairs)
        return pos[:, None] * freq[None, :]

    shape = (frames, rows, cols)
    f = jnp.broadcast_to(axis_angles(frames, n_frame)[:, None, None, :], (*shape, n_frame))
    r = jnp.broadcast_to(axis_angles(rows, n_row)[None, :, None, :], (*shape, n_row))
    c = jnp.broadcast_to(axis_angles(cols, n_col)[None, None, :, :], (*shape, n_col))
    angles = jnp.concatenate([f, r, c], axis=-1).reshape(frames * rows * cols, pairs)
    return jnp.cos(angles), jnp.sin(angles)


# ---- shared pieces of the math --------------------------------------------------------------


def _qkv_dot(x: jax.Array, w: jax.Array, matmul: Matmul) -> jax.Array:
    """x (T, D) @ w (3D, D)^T with bf16-rounded operands and float32 accumulation.

    Both forms compute the same exact products summed in float32; they differ only in summation
    order, so results agree to float32 rounding, not bit for bit. "f32" is the model's own
    formulation (a float32 dot of bf16-rounded values; what torchax traces from ``Linear``);
    "bf16" is the bf16 x bf16 -> f32 dot the MXU runs natively, with no float32 copy of the
    weights, and the one the kernel uses. On XLA:CPU the two go to different GEMM libraries
    (Eigen, YNNPACK): the f32 one even changes its order with the number of output columns,
    while the bf16 one gave the same bits for every tile shape tried, which is what lets the
    kernel's per-tile dots match the reference's single dot.
    """
    if matmul == "f32":
        xf = x.astype(BF16).astype(F32)
        return jax.lax.dot_general(xf, w.astype(F32), (((1,), (1,)), ((), ())), precision=jax.lax.Precision.HIGHEST)
    if matmul == "bf16":
        return jax.lax.dot_general(x.astype(BF16), w.astype(BF16), (((1,), (1,)), ((), ())), preferred_element_type=F32)
    raise ValueError(f"matmul must be 'bf16' or 'f32', got {matmul!r}")


def _sum_last(x: jax.Array) -> jax.Array:
    """Sum over the last axis in a fixed pairwise order, written as elementwise adds (keepdims).

    ``jnp.sum`` leaves the order to the backend, and XLA:CPU picks it by shape and fusion: the
    reference's reduction over (3, H, S, hd) goes to a YNNPACK fusion while the kernel's over a
    (tokens, hd) tile goes to XLA's loop emitter, and the two disagree in the last bit of f32
    for about half the rows. Halving the axis with slice-and-add pins one order for both. The
    model (torch) leaves its order unspecified too, so this is still the model's mean.
    """
    while x.shape[-1] > 1:
        width, half = x.shape[-1], x.shape[-1] // 2
        folded = x[..., :half] + x[..., half : 2 * half]
        x = folded if width % 2 == 0 else jnp.concatenate([folded, x[..., 2 * half :]], axis=-1)
    return x


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``model.attention.RMSNorm`` on float32: x * rsqrt(mean(x^2) + eps) * weight."""
    mean_sq = _sum_last(jnp.square(x)) / x.shape[-1]
    return x * jax.lax.rsqrt(mean_sq + eps) * weight


def _rope_halves(x: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``model.attention.apply_rope`` as its two output halves (the kernel stores them apart)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x1 * cos - x2 * sin, x1 * sin + x2 * cos


def _check_shapes(x: jax.Array, params: PreAttnParams, cos: jax.Array, heads: int, groups: int) -> tuple[int, int, int]:
    tokens, dim = x.shape
    if dim % heads or heads % groups:
        raise ValueError(f"dim={dim} must divide into heads={heads}, heads into groups={groups}")
    hd = dim // heads
    if hd % 2:
        raise ValueError(f"head_dim={hd} must be even for the rotary")
    if params.w_qkv.shape != (3 * dim, dim):
        raise ValueError(f"w_qkv must be ({3 * dim}, {dim}), got {params.w_qkv.shape}")
    if cos.shape != (tokens, hd // 2):
        raise ValueError(f"rope tables must be ({tokens}, {hd // 2}), got {cos.shape}")
    return tokens, dim, hd


# ---- plain-JAX reference --------------------------------------------------------------------


def preattn_reference(
    x: jax.Array,
    params: PreAttnParams,
    cos: jax.Array,
    sin: jax.Array,
    *,
    heads: int,
    groups: int = 1,
    eps: float = 1e-6,
    matmul: Matmul = "f32",
) -> jax.Array:
    """SelfAttention.forward up to ``attention``, op for op, then packed for the all-to-all.

    x (S, D), any float dtype (the model feeds float32). Returns (G, 3, heads / G, S, hd) bf16.
    ``matmul`` picks the dot's formulation (see ``_qkv_dot``); the default is the model's.
    """
    tokens, dim, hd = _check_shapes(x, params, cos, heads, groups)
    # Linear: bf16-rounded operands, exact products, float32 accumulation, then + bias.
    y = _qkv_dot(x, params.w_qkv, matmul)
    if params.b_qkv is not None:
        y = y + params.b_qkv.astype(F32)
    qkv = y.reshape(tokens, 3, heads, hd).transpose(1, 2, 0, 3)  # (3, H, S, hd), .view().permute()
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = jnp.concatenate(_rope_halves(_rms_norm(q, params.q_norm, eps), cos, sin), axis=-1).astype(BF16)
    k = jnp.concatenate(_rope_halves(_rms_norm(k, params.k_norm, eps), cos, sin), axis=-1).astype(BF16)
    return pack_groups(q, k, v.astype(BF16), groups)


def unpack_qkv(packed: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(G, 3, heads / G, S, hd) -> q, k, v each (heads, S, hd): the inverse of the packing."""
    groups, _, hg, tokens, hd = packed.shape
    qkv = jnp.swapaxes(packed, 0, 1).reshape(3, groups * hg, tokens, hd)
    return qkv[0], qkv[1], qkv[2]


# ---- Pallas kernel --------------------------------------------------------------------------


def default_block_tokens(tokens: int, cap: int = 512) -> int:
    """Largest token tile <= cap that divides ``tokens`` and is a multiple of 16, else all tokens.

    16 rows is the bf16 sublane tile of the output; a tile that is not a multiple of it would be
    rejected on TPU unless it spans the whole axis.
    """
    for bt in range(min(cap, tokens) // 16 * 16, 0, -16):
        if tokens % bt == 0:
            return bt
    return tokens


def cost_estimate(
    tokens: int,
    dim: int,
    heads: int,
    x_itemsize: int = 4,
    has_bias: bool = True,
    block_heads: int | None = None,
    block_tokens: int | None = None,
) -> pl.CostEstimate:
    """What the kernel does for ``tokens`` tokens, counted op by op and copy by copy.

    flops: the qkv matmul (2 S D 3D), the bias add (S 3D), the two norms (square, sum, scale by
    rsqrt, scale by weight: 4 per element; mean's divide and + eps: 2 per row), the two rotaries
    (2 multiplies and an add per element). transcendentals: one rsqrt per token per head for q
    and for k. bytes: what the pipeline copies. A block is re-copied only when its index changes
    between consecutive grid steps (head blocks outer, token tiles inner): the weights and bias
    once (their index moves with the head block only), x and the rope tables once per (head
    block, token tile), or once in all when one tile covers the tokens; the bf16 output once.
    """
    hd = dim // heads
    head_blocks = heads // (block_heads or heads)
    bt = default_block_tokens(tokens) if block_tokens is None else block_tokens
    tiles = tokens // bt
    tile_copies = head_blocks * tiles if tiles > 1 else 1  # x, cos, sin: index (tile, 0)
    qk = 2 * tokens * dim  # q and k elements
    rows = 2 * tokens * heads  # q and k (token, head) rows
    flops = 2 * tokens * dim * 3 * dim + (tokens * 3 * dim if has_bias else 0) + 4 * qk + 2 * rows + 3 * qk
    bytes_accessed = (
        3 * dim * dim * 2  # w_qkv bf16
        + (3 * dim * 4 if has_bias else 0)  # bias f32
        + 2 * hd * 4  # norm weights
        + tile_copies * bt * dim * x_itemsize  # x
        + tile_copies * 2 * bt * (hd // 2) * 4  # cos, sin
        + 3 * tokens * dim * 2  # q, k, v bf16
    )
    return pl.CostEstimate(flops=flops, transcendentals=rows, bytes_accessed=bytes_accessed)


def _kernel(*refs, block_heads: int, hd: int, eps: float, has_bias: bool) -> None:
    """One (head block, token tile): per q|k|v a matmul for the block's columns, then per head
    norm, rotary and store into the packed output block.

    The head loop is static: each head is an aligned column slice of the matmul result (128 lanes
    at the production head_dim), and the rotary halves are stored separately so no lane
    concatenation is needed.
    """
    x_ref, w_refs = refs[0], refs[1:4]
    b_refs, rest = (refs[4:7], refs[7:]) if has_bias else ((None,) * 3, refs[4:])
    qn_ref, kn_ref, cos_ref, sin_ref, out_ref = rest
    half = hd // 2
    x = x_ref[...]
    cos, sin = cos_ref[...], sin_ref[...]
    norms = (qn_ref[...], kn_ref[...])
    for j in range(3):  # q, k, v
        y = _qkv_dot(x, w_refs[j][...], "bf16")  # (bt, block_heads * hd) float32
        if b_refs[j] is not None:
            y = y + b_refs[j][...]
        for h in range(block_heads):
            t = y[:, h * hd : (h + 1) * hd]
            if j == 2:
                out_ref[0, j, h, :, :] = t.astype(BF16)
                continue
            lo, hi = _rope_halves(_rms_norm(t, norms[j], eps), cos, sin)
            out_ref[0, j, h, :, :half] = lo.astype(BF16)
            out_ref[0, j, h, :, half:] = hi.astype(BF16)


def preattn(
    x: jax.Array,
    params: PreAttnParams,
    cos: jax.Array,
    sin: jax.Array,
    *,
    heads: int,
    groups: int = 1,
    eps: float = 1e-6,
    block_tokens: int | None = None,
    block_heads: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """The fused Pallas pre-attention over a token axis: (S, D) -> (G, 3, heads / G, S, hd) bf16.

    Grid (head blocks, token tiles), tokens inner so a head block's weights are fetched once.
    ``block_tokens`` defaults to ``default_block_tokens``; ``block_heads`` (a divisor of
    heads / G, default heads / G) bounds the resident weights to 3 * block_heads * hd * D bf16,
    which at production size (D = 3072) must be well below all heads' 56 MB. ``interpret``
    defaults to True on CPU (the Pallas interpreter). The dot is the native bf16 x bf16 -> f32
    one; the jitted ``preattn_reference(..., matmul="bf16")`` gives the same bits, the model's
    own formulation (the reference's default) the same values to f32 summation order.
    """
    tokens, dim, hd = _check_shapes(x, params, cos, heads, groups)
    hg = heads // groups
    bt = default_block_tokens(tokens) if block_tokens is None else block_tokens
    hb = hg if block_heads is None else block_heads
    if tokens % bt:
        raise ValueError(f"block_tokens={bt} must divide the {tokens} tokens")
    if hg % hb:
        raise ValueError(f"block_heads={hb} must divide the {hg} heads of a group")
    if interpret is None:
        interpret = interpret_default()
    has_bias = params.b_qkv is not None
    per_slot = heads // hb  # head blocks in each of the q, k, v column ranges
    per_group = hg // hb  # head blocks in a group

    def weight_spec(j: int) -> pl.BlockSpec:
        # Rows [j D + n hb hd, j D + (n + 1) hb hd) of w_qkv: slot j's columns for head block n.
        return pl.BlockSpec((hb * hd, dim), lambda n, i: (j * per_slot + n, 0))

    def bias_spec(j: int) -> pl.BlockSpec:
        # The bias as (3 * per_slot, 1, hb hd): a block's last two dims are then the array's own,
        # which Mosaic accepts at any width (a (1, hb hd) slice of a row needs hb hd % 128 == 0).
        return pl.BlockSpec((pl.Squeezed(), 1, hb * hd), lambda n, i: (j * per_slot + n, 0, 0))

    w = params.w_qkv.astype(BF16)
    in_specs = [pl.BlockSpec((bt, dim), lambda n, i: (i, 0))] + [weight_spec(j) for j in range(3)]
    args = [x, w, w, w]
    if has_bias:
        b = params.b_qkv.astype(F32).reshape(3 * per_slot, 1, hb * hd)
        in_specs += [bias_spec(j) for j in range(3)]
        args += [b, b, b]
    norm_spec = pl.BlockSpec((1, hd), lambda n, i: (0, 0))
    table_spec = pl.BlockSpec((bt, hd // 2), lambda n, i: (i, 0))
    in_specs += [norm_spec, norm_spec, table_spec, table_spec]
    args += [params.q_norm.astype(F32).reshape(1, hd), params.k_norm.astype(F32).reshape(1, hd), cos, sin]
    # Head block n is heads [n hb, (n + 1) hb): group n // per_group, offset (n % per_group) hb.
    out_spec = pl.BlockSpec((1, 3, hb, bt, hd), lambda n, i: (n // per_group, 0, n % per_group, i, 0))

    kernel = functools.partial(_kernel, block_heads=hb, hd=hd, eps=eps, has_bias=has_bias)
    return pl.pallas_call(
        kernel,
        grid=(per_slot, tokens // bt),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct((groups, 3, hg, tokens, hd), BF16),
        cost_estimate=cost_estimate(tokens, dim, heads, x.dtype.itemsize, has_bias, hb, bt),
        compiler_params=pltpu.CompilerParams(flags=mosaic_flags() or None),
        interpret=interpret,
        name="preattn",
    )(*args)


def preattn_sharded(
    x: jax.Array,
    params: PreAttnParams,
    cos: jax.Array,
    sin: jax.Array,
    *,
    mesh: Mesh,
    axis: str = "fsdp",
    heads: int,
    groups: int = 1,
    eps: float = 1e-6,
    block_tokens: int | None = None,
    block_heads: int | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """``preattn`` on every device's token shard: x (S, D) and rope tables sharded on S.

    Returns packed (G, 3, heads / G, S, hd) sharded on S: the input of
    ``kernels.ulysses.ulysses_attention_packed``. The weights are replicated into the kernel.
    """

    def local(xl: jax.Array, p: PreAttnParams, cl: jax.Array, sl: jax.Array) -> jax.Array:
        return preattn(
            xl,
            p,
            cl,
            sl,
            heads=heads,
            groups=groups,
            eps=eps,
            block_tokens=block_tokens,
            block_heads=block_heads,
            interpret=interpret,
        )

    seq = PartitionSpec(axis, None)
    rep = jax.tree.map(lambda _: PartitionSpec(), params)
    return _shard_map()(
        local,
        mesh=mesh,
        in_specs=(seq, rep, seq, seq),
        out_specs=PartitionSpec(None, None, None, axis, None),
        check_vma=False,
    )(_place(x, mesh, seq), params, _place(cos, mesh, seq), _place(sin, mesh, seq))
