"""Frame-aligned block tables and the block-sparse SR attention kernel (Pallas, interpret mode on CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from kernels import masks
from kernels.blocksparse import (
    blocksparse_attention,
    blocksparse_attention_jit,
    cost_estimate,
    frame_reference,
    reference_attention,
)

BF16_EPS = 2.0**-7  # bf16 spacing at 1.0


def _qkv(heads: int, frames: int, tokens: int, head_dim: int, dtype, seed: int = 0):
    q, k, v = jax.random.normal(jax.random.PRNGKey(seed), (3, heads, frames * tokens, head_dim), jnp.float32)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _max_err(a: jax.Array, b: jax.Array) -> float:
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


# ---- block tables ------------------------------------------------------------------------------


def test_token_mask_matches_model_rule():
    """Frame 0 sees only frame 0; frame q sees |q - k| <= window plus frame 0 (model/sr.py)."""
    m = masks.token_mask(4, 16, 1)
    f = np.arange(64) // 16
    for i in range(64):
        for j in range(64):
            want = f[j] == 0 if f[i] == 0 else (abs(f[i] - f[j]) <= 1 or f[j] == 0)
            assert m[i, j] == want


@pytest.mark.parametrize("tokens", [48, 96, 240, 960, 3680, 8160])
def test_aligned_sizes_divide_and_are_multiples_of_16(tokens):
    sizes = masks.aligned_block_sizes(tokens)
    assert sizes and all(b % 16 == 0 and tokens % b == 0 for b in sizes)
    assert 128 not in sizes  # T is deliberately not a multiple of 128
    assert masks.default_block(tokens) in sizes


@pytest.mark.parametrize(
    "frames,tokens,window", [(3, 240, 1), (9, 240, 1), (9, 960, 1), (17, 3680, 2), (4, 48, 0), (5, 96, 2)]
)
def test_aligned_blocks_have_no_partial_blocks(frames, tokens, window):
    for block in masks.aligned_block_sizes(tokens):
        c = masks.tile_counts(frames, tokens, window, block)
        assert c.partial == 0 and c.padded_length == frames * tokens
        # Live blocks cover exactly the live fraction of the mask.
        assert c.full * block * block == pytest.approx(masks.live_fraction(frames, window) * (frames * tokens) ** 2)


def test_stock_128_tiles_straddle_frames():
    """Counts for a 128 tile, sequence padded to a multiple of 128 (as a stock splash grid)."""
    assert masks.tile_counts(3, 240, 1, 128) == masks.TileCounts(128, 768, full=17, partial=15, empty=4)
    assert masks.tile_counts(9, 240, 1, 128) == masks.TileCounts(128, 2176, full=71, partial=66, empty=152)
    # avatar-720p: 17 frames x 3680 tokens, window 2.
    assert masks.tile_counts(17, 3680, 2, 128) == masks.TileCounts(128, 62592, full=74199, partial=1778, empty=163144)
    # The aligned default for 720p (368) has none, and no padding.
    assert masks.tile_counts(17, 3680, 2, 368) == masks.TileCounts(368, 62560, full=9100, partial=0, empty=19800)


@pytest.mark.parametrize(
    "frames,tokens,window,block", [(3, 240, 1, 128), (3, 240, 1, 48), (4, 48, 0, 32), (5, 96, 2, 64), (3, 96, 1, 16)]
)
def test_block_live_map_matches_token_mask(frames, tokens, window, block):
    seq = frames * tokens
    padded = -(-seq // block) * block
    tm = np.zeros((padded, padded), bool)
    tm[:seq, :seq] = masks.token_mask(frames, tokens, window)
    nb = padded // block
    cells = tm.reshape(nb, block, nb, block).transpose(0, 2, 1, 3).reshape(nb, nb, -1)
    want = np.where(cells.all(-1), masks.FULL, np.where(cells.any(-1), masks.PARTIAL, masks.EMPTY))
    np.testing.assert_array_equal(masks.block_live_map(frames, tokens, window, block), want)
    assert masks.live_fraction(frames, window) == pytest.approx(tm[:seq, :seq].mean())


def test_live_table_is_grouped_by_query_block():
    t = masks.live_block_table(4, 48, 1, 16)
    assert np.all(np.diff(t.q_block) >= 0)
    assert set(t.q_block.tolist()) == set(range(t.n_blocks))  # every output block is written
    codes = masks.block_live_map(4, 48, 1, 16)
    assert np.all(codes[t.q_block, t.k_block] == masks.FULL) and t.n_pairs == (codes == masks.FULL).sum()
    with pytest.raises(ValueError):
        masks.live_block_table(4, 48, 1, 32)  # 32 does not divide 48


# ---- kernel == reference ---------------------------------------------------------------------------

CASES = [  # frames, tokens, window, block
    (3, 240, 1, 48),
    (3, 240, 1, 240),
    (4, 48, 0, 16),
    (5, 96, 2, 32),
    (3, 96, 1, None),
]


@pytest.mark.slow  # ~1 s a case (interpret-mode compile); the fast lane keeps test_dense_* and test_dead_blocks_*
@pytest.mark.parametrize("frames,tokens,window,block", CASES)
def test_matches_reference_float32(frames, tokens, window, block):
    q, k, v = _qkv(2, frames, tokens, 8, jnp.float32)
    out = blocksparse_attention_jit(q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block)
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    assert out.dtype == jnp.float32 and out.shape == q.shape
    assert _max_err(out, ref) <= 2e-6


@pytest.mark.slow  # ~1 s a case (interpret-mode compile); the fast lane keeps test_dense_* and test_dead_blocks_*
@pytest.mark.parametrize("frames,tokens,window,block", CASES[:4])
def test_matches_reference_bf16(frames, tokens, window, block):
    q, k, v = _qkv(2, frames, tokens, 16, jnp.bfloat16, seed=1)
    out = blocksparse_attention_jit(q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block)
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    assert out.dtype == jnp.bfloat16
    # p is rounded to bf16 for the value matmul and the output to bf16: two bf16 ulps of the scale.
    assert _max_err(out, ref) <= 2 * BF16_EPS * float(jnp.max(jnp.abs(ref.astype(jnp.float32))))


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_dense_when_single_frame():
    """frames=1 is plain dense attention (frame 0 sees frame 0)."""
    q, k, v = _qkv(2, 1, 96, 8, jnp.float32)
    out = blocksparse_attention_jit(q, k, v, frames=1, tokens_per_frame=96, window=0, block=32)
    assert _max_err(out, reference_attention(q, k, v, None)) <= 2e-6


def test_rejects_unaligned_block():
    q, k, v = _qkv(1, 3, 48, 8, jnp.float32)
    with pytest.raises(ValueError):
        blocksparse_attention(q, k, v, frames=3, tokens_per_frame=48, window=1, block=32)


# ---- visits only live blocks ----------------------------------------------------------------------


def _pallas_eqn(fn, *args):
    eqns = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(eqns) == 1
    return eqns[0]


@pytest.mark.parametrize(
    "frames,tokens,window,block,q_block",
    [
        (3, 48, 1, 16, 16),
        (6, 96, 1, 32, 32),
        (6, 96, 2, 48, 48),
        (3, 48, 1, 16, 48),
        (6, 96, 2, 32, 96),
        (6, 96, 1, 48, 16),
    ],
)
def test_grid_is_exactly_the_live_blocks(frames, tokens, window, block, q_block):
    heads, d = 2, 16
    q, k, v = _qkv(heads, frames, tokens, d, jnp.bfloat16)
    eqn = _pallas_eqn(
        lambda q, k, v: blocksparse_attention(
            q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block, q_block=q_block
        ),
        q,
        k,
        v,
    )
    live = masks.live_fraction(frames, window)
    nq, nk = frames * tokens // q_block, frames * tokens // block
    assert eqn.params["grid_mapping"].grid == (heads, round(live * nq * nk))
    # The estimate XLA sees scales with the live fraction, not with S^2.
    cost = eqn.params["cost_estimate"]
    assert cost.flops == round(4 * live * (frames * tokens) ** 2 * d * heads)
    assert cost == cost_estimate(
        heads=heads, head_dim=d, frames=frames, tokens_per_frame=tokens, window=window, block=block, q_block=q_block
    )


def test_bytes_are_counted_from_the_blocks_the_grid_fetches():
    """Key and value rows are read again for every query block they meet: counted by hand here
    (a query block of a frame reads frame 0 and its window's frames, once each), against the
    estimate, for square and tall query blocks. Taller query blocks read fewer key rows."""
    frames, tokens, window, heads, d = 6, 96, 1, 2, 16
    seq = frames * tokens

    def by_hand(q_block: int) -> int:
        rows = 0
        for qf in range(frames):
            visible = set(masks.live_frames(frames, window)[qf])
            rows += (tokens // q_block) * len(visible) * tokens  # every live key row, per query block
        return heads * (2 * seq + 2 * rows) * d * 2 + 0

    for q_block in (16, 48, 96):
        est = cost_estimate(
            heads=heads, head_dim=d, frames=frames, tokens_per_frame=tokens, window=window, block=16, q_block=q_block
        )
        table = masks.live_block_table(frames, tokens, window, 16, q_block)
        assert est.bytes_accessed == by_hand(q_block) + 2 * 4 * table.n_pairs
    tall = cost_estimate(
        heads=heads, head_dim=d, frames=frames, tokens_per_frame=tokens, window=window, block=16, q_block=96
    )
    square = cost_estimate(
        heads=heads, head_dim=d, frames=frames, tokens_per_frame=tokens, window=window, block=16, q_block=16
    )
    assert tall.bytes_accessed < square.bytes_accessed / 4 and tall.flops == square.flops


@pytest.mark.parametrize("q_block", [48, 240])
def test_tall_query_blocks_give_the_square_kernels_result(q_block):
    """Each query row meets the same key blocks in the same order whatever the query block is."""
    frames, tokens, window = 3, 240, 1
    q, k, v = _qkv(2, frames, tokens, 8, jnp.float32)
    square = blocksparse_attention_jit(
        q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=48, q_block=48
    )
    tall = blocksparse_attention_jit(
        q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=48, q_block=q_block
    )
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    assert _max_err(tall, ref) <= 2e-6
    assert _max_err(tall, square) <= 1e-6


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_dead_blocks_are_never_read():
    """NaN keys/values in a frame that query frame 0 cannot see leave frame 0's rows finite.

    A kernel that visited dead blocks and masked them would compute 0 * NaN = NaN in p @ v.
    """
    frames, tokens = 4, 48
    q, k, v = _qkv(2, frames, tokens, 8, jnp.float32)
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=0)  # clean inputs
    k = k.at[:, 2 * tokens :].set(jnp.nan)
    v = v.at[:, 2 * tokens :].set(jnp.nan)
    out = blocksparse_attention_jit(q, k, v, frames=frames, tokens_per_frame=tokens, window=0, block=16)
    assert _max_err(out[:, : 2 * tokens], ref[:, : 2 * tokens]) <= 2e-6  # frames 0 and 1 never see 2, 3
    assert bool(jnp.isnan(out[:, 2 * tokens :]).all())


# ---- inside jit, compiled, serialised -----------------------------------------------------------


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_inside_jit_serializes_and_reloads_bit_exact():
    frames, tokens, window = 3, 48, 1

    @jax.jit
    def program(x, wq, wk, wv):
        q, k, v = (jnp.einsum("hsd,de->hse", x, w).astype(jnp.bfloat16) for w in (wq, wk, wv))
        o = blocksparse_attention_jit(q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=16)
        return o.astype(jnp.float32).sum(axis=0)

    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    x = jax.random.normal(keys[0], (2, frames * tokens, 16))
    ws = [jax.random.normal(kk, (16, 16)) * 0.25 for kk in keys[1:]]
    compiled = program.lower(x, *ws).compile()
    expected = compiled(x, *ws)
    payload, in_tree, out_tree = serialize(compiled)
    assert isinstance(payload, bytes) and payload
    # The program was compiled for one device; load it onto that one (the tests run with 8).
    reloaded = deserialize_and_load(payload, in_tree, out_tree, execution_devices=jax.devices()[:1])
    np.testing.assert_array_equal(np.asarray(reloaded(x, *ws)), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(program(x, *ws)), np.asarray(expected))
