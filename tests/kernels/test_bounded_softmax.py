"""Bounded-softmax SR attention: bound validity, eligibility, fallback, exactness, serialisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from kernels import masks
from kernels.blocksparse import frame_reference, reference_attention
from kernels.bounded_softmax import (
    DEFAULT_MAX_GAP,
    bounded_reference,
    bounded_softmax_attention,
    bounded_softmax_attention_jit,
    eligible_heads,
    gap_estimate,
    key_stats,
    row_bounds,
)

BF16_EPS = 2.0**-7


def _qkv(heads: int, frames: int, tokens: int, head_dim: int, seed: int = 0):
    return jax.random.normal(jax.random.PRNGKey(seed), (3, heads, frames * tokens, head_dim), jnp.float32)


def _max_err(a: jax.Array, b: jax.Array) -> float:
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


def _true_row_max(q, k, frames, tokens, window):
    s = jnp.einsum("hqd,hkd->hqk", q, k, precision="highest") / np.sqrt(q.shape[-1])
    return jnp.where(masks.token_mask(frames, tokens, window)[None], s, -jnp.inf).max(-1)


def _shared_component(k: jax.Array, shift: float) -> jax.Array:
    """Keys with a large common component, as real keys have: centring removes it from the bound."""
    return k + shift * jnp.ones((k.shape[-1],), k.dtype)


def _loose_head(q, k, head: int, outlier_row: int, norm: float = 1000.0):
    """One key of `head` with a huge norm along a direction (dim 0) orthogonal to every query.

    Its logits stay moderate (0), but Cauchy-Schwarz gives |q| * ~norm: a very loose bound.
    """
    q = q.at[head, :, 0].set(0.0)
    k = k.at[head, outlier_row].set(0.0).at[head, outlier_row, 0].set(norm)
    return q, k


# ---- the bound -------------------------------------------------------------------------------------


@pytest.mark.slow  # seconds on 2 cores
@pytest.mark.parametrize("frames,tokens,window", [(3, 48, 1), (5, 32, 2), (4, 48, 0)])
def test_bound_dominates_visible_logits_and_gap_estimate_dominates_gap(frames, tokens, window):
    q, k, _ = _qkv(3, frames, tokens, 8)
    k = _shared_component(k, 2.0).at[1, frames * tokens - 1].multiply(20.0)  # last frame: an outlier
    true_max = _true_row_max(q, k, frames, tokens, window)
    kw = dict(frames=frames, tokens_per_frame=tokens, window=window)
    visible = row_bounds(q, k, **kw)
    glob = row_bounds(q, k, **kw, radius="global")
    assert bool(jnp.all(visible >= true_max - 1e-5))
    assert bool(jnp.all(glob >= visible - 1e-6))  # the global radius is valid but looser
    gap = (visible - true_max).max(axis=-1)
    assert bool(jnp.all(gap_estimate(q, k, **kw) >= gap - 1e-4))


def test_visible_radius_ignores_frames_a_row_cannot_see():
    """Under the window mask, frame 0's rows never see the last frame, so its outlier is not in R."""
    frames, tokens = 4, 32
    _, k, _ = _qkv(1, frames, tokens, 8)
    k = k.at[0, -1].multiply(50.0)
    _, r_vis, _ = key_stats(k, frames=frames, tokens_per_frame=tokens, window=1)
    _, r_glob, _ = key_stats(k, frames=frames, tokens_per_frame=tokens, window=1, radius="global")
    assert float(r_vis[0, 0]) < float(r_glob[0, 0]) / 5  # frames 0 and 1 do not see frame 3
    assert float(r_vis[0, 1]) < float(r_glob[0, 1]) / 5
    assert float(r_vis[0, 3]) == pytest.approx(float(r_glob[0, 3]))


# ---- eligibility ----------------------------------------------------------------------------------


@pytest.mark.slow  # seconds on 2 cores
def test_typical_heads_are_eligible_and_a_loose_head_is_not():
    frames, tokens, window = 3, 48, 1
    q, k, _ = _qkv(4, frames, tokens, 16)
    k = _shared_component(k, 3.0)
    q, k = _loose_head(q, k, head=2, outlier_row=2 * tokens + 5)
    flags, share = eligible_heads(q, k, frames=frames, tokens_per_frame=tokens, window=window)
    np.testing.assert_array_equal(np.asarray(flags), [True, True, False, True])
    assert float(share) == 0.75
    gaps = gap_estimate(q, k, frames=frames, tokens_per_frame=tokens, window=window)
    assert float(gaps[2]) > DEFAULT_MAX_GAP > float(jnp.max(gaps.at[2].set(0.0)))


@pytest.mark.slow  # seconds on 2 cores
def test_loose_head_falls_back_and_stays_exact():
    frames, tokens, window = 3, 48, 1
    q, k, v = _qkv(3, frames, tokens, 8, seed=1)
    q, k = _loose_head(q, k, head=1, outlier_row=2 * tokens + 5)
    kw = dict(frames=frames, tokens_per_frame=tokens, window=window, block=16)
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    out = bounded_softmax_attention_jit(q, k, v, **kw)
    assert _max_err(out, ref) <= 2e-6
    # Forcing the bounded path on the loose head underflows every term of the rows that see the
    # outlier (exp(-~1000) = 0): that is what the fallback protects against.
    forced = bounded_softmax_attention_jit(q, k, v, **kw, eligible=jnp.ones((3,), bool))
    assert not bool(jnp.isfinite(forced[1, tokens:]).all())
    assert _max_err(forced[0], ref[0]) <= 2e-6 and _max_err(forced[2], ref[2]) <= 2e-6


# ---- kernel == reference -----------------------------------------------------------------------------


@pytest.mark.slow  # seconds on 2 cores
@pytest.mark.parametrize("frames,tokens,window,block", [(3, 240, 1, 48), (4, 48, 0, None), (5, 96, 2, 32)])
def test_matches_reference_float32_under_window_mask(frames, tokens, window, block):
    q, k, v = _qkv(3, frames, tokens, 8)
    # Frames of different key scales: each query frame gets a different visible radius.
    scales = jnp.repeat(jnp.linspace(1.0, 2.5, frames), tokens)[None, :, None]
    k = _shared_component(k * scales, 4.0)
    kw = dict(frames=frames, tokens_per_frame=tokens, window=window)
    flags, share = eligible_heads(q, k, **kw)
    assert float(share) == 1.0  # the bounded path is what is being tested
    out = bounded_softmax_attention_jit(q, k, v, **kw, block=block, eligible=flags)  # one compile for both
    mask = masks.token_mask(frames, tokens, window)
    ref = reference_attention(q, k, v, mask)
    assert _max_err(out, ref) <= 2e-6
    assert _max_err(bounded_reference(q, k, v, mask, flags), ref) <= 2e-6
    # The all-online path of the same kernel agrees too.
    online = bounded_softmax_attention_jit(q, k, v, **kw, block=block, eligible=jnp.zeros((3,), bool))
    assert _max_err(online, ref) <= 2e-6


@pytest.mark.slow  # seconds on 2 cores
def test_matches_reference_bf16_mixed_heads():
    frames, tokens, window = 3, 240, 1
    q, k, v = _qkv(4, frames, tokens, 16, seed=2)
    q, k = _loose_head(q, _shared_component(k, 2.0), head=3, outlier_row=5)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    kw = dict(frames=frames, tokens_per_frame=tokens, window=window)
    flags, _ = eligible_heads(q, k, **kw)
    np.testing.assert_array_equal(np.asarray(flags), [True, True, True, False])
    out = bounded_softmax_attention_jit(q, k, v, **kw, block=80)
    ref = frame_reference(q, k, v, **kw)
    assert out.dtype == jnp.bfloat16
    assert _max_err(out, ref) <= 2 * BF16_EPS * float(jnp.max(jnp.abs(ref.astype(jnp.float32))))


# ---- inside jit, compiled, serialised -------------------------------------------------------------


def test_inside_jit_serializes_and_reloads_bit_exact():
    frames, tokens, window = 3, 48, 1

    @jax.jit
    def program(q, k, v):
        o = bounded_softmax_attention(
            q.astype(jnp.bfloat16),
            k.astype(jnp.bfloat16),
            v.astype(jnp.bfloat16),
            frames=frames,
            tokens_per_frame=tokens,
            window=window,
            block=16,
        )
        return jnp.tanh(o.astype(jnp.float32))

    q, k, v = _qkv(2, frames, tokens, 16, seed=4)
    compiled = program.lower(q, k, v).compile()
    expected = compiled(q, k, v)
    payload, in_tree, out_tree = serialize(compiled)
    # The program was compiled for one device; load it onto that one (the tests run with 8).
    reloaded = deserialize_and_load(payload, in_tree, out_tree, execution_devices=jax.devices()[:1])
    np.testing.assert_array_equal(np.asarray(reloaded(q, k, v)), np.asarray(expected))
