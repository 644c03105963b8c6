"""The 128-tile comparison kernel: same answer as the reference, more (and partial) tiles visited."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kernels import masks
from kernels.blocksparse import frame_reference, live_table
from kernels.blocksparse_tiled import tiled_blocksparse_attention, tiled_table


@pytest.mark.parametrize("frames, tokens, window", [(3, 240, 1), (4, 96, 2), (3, 48, 0)])
def test_tiled_kernel_matches_the_reference(frames, tokens, window):
    rng = np.random.default_rng(frames * tokens + window)
    q, k, v = (jnp.asarray(rng.standard_normal((2, frames * tokens, 16)), jnp.float32) for _ in range(3))
    got = tiled_blocksparse_attention(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    want = frame_reference(q, k, v, frames=frames, tokens_per_frame=tokens, window=window)
    assert float(jnp.max(jnp.abs(got - want))) <= 2e-6


def test_128_tiles_visit_partial_tiles_and_more_token_pairs_than_aligned_blocks():
    frames, tokens, window = 9, 240, 1
    tiled = tiled_table(frames, tokens, window, 128)
    counts = masks.tile_counts(frames, tokens, window, 128)
    assert tiled.n_pairs == counts.full + counts.partial and counts.partial > 0
    aligned = live_table(frames, tokens, window, 240)
    assert tiled.n_pairs * 128**2 > aligned.n_pairs * 240**2
