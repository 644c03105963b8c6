"""kernels/window_gpu.py: the SR's frame-window attention for Triton, without a table.

Its numerics run here through the Pallas interpreter (the same kernel body, discharged to XLA ops on
the CPU) against the dense masked reference; its Triton lowering is compiled for the pinned H200
description through the CUDA plugin (no GPU needed to compile, none here to run it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import masks
from kernels.blocksparse import frame_reference
from kernels.window_gpu import BLOCK, NAME, estimate, key_runs, visited_blocks, window_attention_gpu


def _qkv(heads, seq, head_dim, dtype, seed=0):
    return tuple(
        jax.random.normal(k, (heads, seq, head_dim), dtype) for k in jax.random.split(jax.random.PRNGKey(seed), 3)
    )


@pytest.mark.parametrize(
    "frames,tokens,window,heads,head_dim",
    [
        (9, 240, 1, 2, 8),  # tiny's SR: frames of 240 tokens (blocks straddle frame edges), head_dim padded to 16
        (5, 100, 1, 1, 16),  # a sequence that is not a whole number of blocks (padded, the pad masked)
        (4, 48, 2, 2, 24),  # frames shorter than a block; head_dim not a power of two
        (6, 64, 0, 1, 32),  # window 0: frame 0 and each frame itself
        (3, 16, 5, 1, 16),  # one block holds every frame; the window wider than the clip
    ],
)
def test_matches_the_dense_masked_reference_in_float32(frames, tokens, window, heads, head_dim):
    q, k, v = _qkv(heads, frames * tokens, head_dim, jnp.float32)
    out = window_attention_gpu(q, k, v, frames=frames, tokens_per_frame=tokens, window=window, interpret=True)
    ref = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-6, rtol=1e-5)


def test_bf16_stays_close_to_the_float32_reference():
    q, k, v = _qkv(2, 9 * 240, 8, jnp.bfloat16, seed=3)
    out = window_attention_gpu(q, k, v, frames=9, tokens_per_frame=240, window=1, interpret=True)
    ref = frame_reference(q, k, v, frames=9, tokens_per_frame=240, window=1)
    assert out.dtype == jnp.bfloat16
    err = np.abs(np.asarray(out, np.float32) - np.asarray(ref, np.float32)).max()
    assert err < 1e-2  # bf16 operands into the matmuls, float32 accumulation


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_the_reference_frame_sees_only_itself():
    """Frame 0's queries must ignore every other frame: changing frame 1's keys leaves them alone."""
    frames, tokens = 4, 64
    q, k, v = _qkv(1, frames * tokens, 16, jnp.float32)
    k2 = k.at[:, tokens : 2 * tokens].add(5.0)
    a = window_attention_gpu(q, k, v, frames=frames, tokens_per_frame=tokens, window=1, interpret=True)
    b = window_attention_gpu(q, k2, v, frames=frames, tokens_per_frame=tokens, window=1, interpret=True)
    assert np.array_equal(np.asarray(a[:, :tokens]), np.asarray(b[:, :tokens]))
    assert not np.allclose(np.asarray(a[:, tokens : 2 * tokens]), np.asarray(b[:, tokens : 2 * tokens]))


@pytest.mark.parametrize(
    "frames,tokens,window,block", [(9, 240, 1, 64), (17, 368, 2, 64), (5, 100, 3, 32), (3, 16, 0, 16)]
)
def test_every_block_with_a_live_key_is_visited_once_and_only_the_window_is_walked(frames, tokens, window, block):
    live = masks.token_mask(frames, tokens, window)
    seq = frames * tokens
    n_blocks = -(-seq // block)
    walked = 0
    for qb in range(n_blocks):
        end0, start1, end1 = key_runs(
            qb, block=block, frames=frames, tokens_per_frame=tokens, window=window, n_blocks=n_blocks
        )
        visited = list(range(end0)) + list(range(start1, end1))
        assert len(visited) == len(set(visited)) and end0 <= start1 <= end1 <= n_blocks
        rows = live[qb * block : (qb + 1) * block]
        needed = {c // block for c in np.flatnonzero(rows.any(axis=0))}
        assert needed <= set(visited)
        walked += len(visited)
    assert walked == visited_blocks(frames=frames, tokens_per_frame=tokens, window=window, block=block)
    assert walked < n_blocks * n_blocks or n_blocks == 1  # sparse: not every pair


def test_the_estimate_counts_the_visited_blocks_near_the_masks_own_flops():
    """avatar-720p's SR call (17 frames of 3,680 tokens, window 2, one head of 128 per device and
    group): the visited blocks' flops are within a few per cent of the live logits' (blocks straddle
    frame edges); K and V with L2 reuse are read once."""
    frames, tokens, window, head_dim = 17, 3680, 2, 128
    est = estimate(heads=1, head_dim=head_dim, frames=frames, tokens_per_frame=tokens, window=window)
    live_pairs = masks.live_fraction(frames, window) * (frames * tokens) ** 2
    floor = 4 * live_pairs * head_dim
    assert floor <= est["flops"] < 1.05 * floor
    assert est["bytes accessed"] == 4 * frames * tokens * head_dim * 2  # q, k, v, out once each
    no_reuse = estimate(
        heads=1, head_dim=head_dim, frames=frames, tokens_per_frame=tokens, window=window, l2_reuse=False
    )
    assert no_reuse["bytes accessed"] > 10 * est["bytes accessed"]


def test_bad_shapes_and_blocks_are_refused_with_what_was_expected():
    q, k, v = _qkv(1, 4 * 16, 16, jnp.float32)
    with pytest.raises(ValueError, match=r"\(heads, 80, head_dim\)"):
        window_attention_gpu(q, k, v, frames=5, tokens_per_frame=16, window=1, interpret=True)
    with pytest.raises(ValueError, match="power of two of at least 16"):
        window_attention_gpu(q, k, v, frames=4, tokens_per_frame=16, window=1, block=48, interpret=True)
    assert BLOCK & (BLOCK - 1) == 0


@pytest.mark.extra("gpu")
def test_lowers_for_triton_against_the_pinned_h200_description():
    from jax.sharding import SingleDeviceSharding

    from avatar_release.compile import target_devices
    from avatar_release.specs import load_target

    (device,) = target_devices(load_target("gpu-h200-1"))
    spec = jax.ShapeDtypeStruct((1, 9 * 240, 8), jnp.bfloat16, sharding=SingleDeviceSharding(device))
    fn = jax.jit(lambda q, k, v: window_attention_gpu(q, k, v, frames=9, tokens_per_frame=240, window=1))
    text = fn.lower(spec, spec, spec).compile().as_text()
    calls = [line for line in text.splitlines() if 'custom_call_target="__gpu$xla.gpu.triton"' in line]
    assert len(calls) == 1 and NAME in calls[0]
