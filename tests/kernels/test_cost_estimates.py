"""Every Pallas kernel's CostEstimate against a direct count of the blocks it visits.

The count here is written independently of the kernels' own cost functions: live blocks are
found by brute force from the (S, S) token mask, and the bytes by walking the kernel's grid in
order with its index maps, copying a block whenever its index changes from the previous step
(what a Pallas TPU pipeline does). Each kernel is traced (no compile) and the estimate its
pallas_call carries is compared with the count.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import masks
from kernels.blocksparse import blocksparse_attention
from kernels.blocksparse_tiled import tiled_blocksparse_attention
from kernels.bounded_softmax import bounded_softmax_attention
from kernels.flash import flash_attention
from kernels.preattn import PreAttnParams, preattn, rope_tables


def _estimate(fn, *args):
    """The CostEstimate on the one pallas_call in fn's jaxpr."""
    calls = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(calls) == 1
    return calls[0].params["cost_estimate"]


def _copies(steps, index) -> int:
    """Block copies of one operand over the grid steps, in order: one per change of its index."""
    n, last = 0, object()
    for step in steps:
        i = index(*step)
        if i != last:
            n, last = n + 1, i
    return n


def _live_pairs_by_hand(frames, tokens, window, block, pad: bool = False, q_block: int | None = None):
    """(q block, k block) pairs with at least one live token pair, from the token mask itself;
    query blocks of `q_block` rows (default `block`), key blocks of `block`."""
    qb = block if q_block is None else q_block
    seq = frames * tokens
    n = -(-seq // block) if pad else seq // block
    nq = -(-seq // qb) if pad else seq // qb
    tm = np.zeros((max(n * block, nq * qb),) * 2, bool)
    tm[:seq, :seq] = masks.token_mask(frames, tokens, window)
    return [(i, j) for i in range(nq) for j in range(n) if tm[i * qb : (i + 1) * qb, j * block : (j + 1) * block].any()]


def _qkv(heads, seq, d):
    q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, heads, seq, d), jnp.float32)
    return q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)


SR_CASES = [(3, 48, 1, 16), (5, 96, 2, 32), (6, 96, 1, 48)]  # frames, tokens, window, block


def _pair_kernel_count(pairs, heads, d, block, itemsize=2, q_block: int | None = None):
    """flops and bytes of a (head, pair) grid over `pairs`: q/out follow the q block (`q_block`
    rows, default `block`), k/v the k block (`block` rows)."""
    qb_rows = block if q_block is None else q_block
    steps = [(h, qb, kb) for h in range(heads) for qb, kb in pairs]
    q = _copies(steps, lambda h, qb, kb: (h, qb))
    kv = _copies(steps, lambda h, qb, kb: (h, kb))
    out = _copies(steps, lambda h, qb, kb: (h, qb))
    flops = heads * len(pairs) * (2 * qb_rows * block * d) * 2  # q k^T and p v per visited pair
    tables = 2 * 4 * len(pairs)  # the two int32 prefetched tables
    return flops, ((q + out) * qb_rows + 2 * kv * block) * d * itemsize + tables


@pytest.mark.parametrize("q_rows", ["square", "default"])
@pytest.mark.parametrize("frames,tokens,window,block", SR_CASES)
def test_blocksparse_counts_the_live_blocks_and_refetched_kv(frames, tokens, window, block, q_rows):
    heads, d = 2, 16
    q_block = block if q_rows == "square" else masks.default_query_block(tokens)  # tall: the whole frame here
    pairs = _live_pairs_by_hand(frames, tokens, window, block, q_block=q_block)
    flops, nbytes = _pair_kernel_count(pairs, heads, d, block, q_block=q_block)
    est = _estimate(
        lambda q, k, v: blocksparse_attention(
            q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block, q_block=q_block
        ),
        *_qkv(heads, frames * tokens, d),
    )
    assert (est.flops, est.bytes_accessed) == (flops, nbytes)
    # Re-fetched K/V blocks are counted: more than one pass over K and V whenever a key block
    # is visited by several query blocks.
    assert nbytes > 4 * heads * frames * tokens * d * 2


@pytest.mark.parametrize("frames,tokens,window,block", SR_CASES)
def test_bounded_softmax_adds_the_centre_flags_and_radius_table(frames, tokens, window, block):
    heads, d = 2, 16
    seq = frames * tokens
    pairs = _live_pairs_by_hand(frames, tokens, window, block)
    flops, nbytes = _pair_kernel_count(pairs, heads, d, block)
    steps = [(h, qb, kb) for h in range(heads) for qb, kb in pairs]
    centre = _copies(steps, lambda h, qb, kb: h) * d * 4  # (1, d) float32 per head
    smem = heads * 4 + heads * frames * 4  # eligibility flags, per-frame radius
    bound = heads * seq * 4 * d  # |q|^2 and q . c per row, once per query block
    est = _estimate(
        lambda q, k, v: bounded_softmax_attention(
            q, k, v, frames=frames, tokens_per_frame=tokens, window=window, block=block
        ),
        *_qkv(heads, seq, d),
    )
    assert (est.flops, est.bytes_accessed) == (flops + bound, nbytes + centre + smem)


@pytest.mark.parametrize("frames,tokens,window", [(3, 240, 1), (4, 96, 2)])
def test_tiled_counts_full_and_partial_tiles_of_the_padded_sequence(frames, tokens, window):
    heads, d, tile = 2, 16, 128
    pairs = _live_pairs_by_hand(frames, tokens, window, tile, pad=True)
    flops, nbytes = _pair_kernel_count(pairs, heads, d, tile)
    est = _estimate(
        lambda q, k, v: tiled_blocksparse_attention(
            q, k, v, frames=frames, tokens_per_frame=tokens, window=window, tile=tile
        ),
        *_qkv(heads, frames * tokens, d),
    )
    assert (est.flops, est.bytes_accessed) == (flops, nbytes)
    aligned = _live_pairs_by_hand(frames, tokens, window, tokens)
    assert len(pairs) * tile**2 > len(aligned) * tokens**2  # it visits more token pairs than the live ones


@pytest.mark.parametrize("seq,block_q,block_k", [(480, 96, 160), (480, 480, 160), (256, 64, 256)])
def test_flash_counts_every_block_pair_and_one_kv_pass_per_query_block(seq, block_q, block_k):
    heads, d = 2, 16
    nq, nk = seq // block_q, seq // block_k
    steps = list(itertools.product(range(heads), range(nq), range(nk)))
    q = _copies(steps, lambda h, i, j: (h, i))
    kv = _copies(steps, lambda h, i, j: (h, j))
    out = _copies(steps, lambda h, i, j: (h, i))
    flops = len(steps) * 2 * (2 * block_q * block_k * d)
    nbytes = (q * block_q + 2 * kv * block_k + out * block_q) * d * 2
    est = _estimate(lambda q, k, v: flash_attention(q, k, v, block_q=block_q, block_k=block_k), *_qkv(heads, seq, d))
    assert (est.flops, est.bytes_accessed) == (flops, nbytes) and est.flops == 4 * heads * seq * seq * d
    assert est.transcendentals == heads * seq * seq + heads * seq * nk  # exp per logit + rescale per row


@pytest.mark.parametrize("tokens,block_tokens,block_heads", [(240, None, None), (240, 48, 2), (240, None, 2)])
def test_preattn_counts_what_its_grid_copies(tokens, block_tokens, block_heads):
    dim, heads = 64, 8
    hd = dim // heads
    bt = block_tokens or 240
    hb = block_heads or heads
    steps = list(itertools.product(range(heads // hb), range(tokens // bt)))  # (head block, token tile)
    per_slot = heads // hb
    weights = sum(_copies(steps, lambda n, i, j=j: j * per_slot + n) for j in range(3)) * hb * hd * dim * 2
    bias = sum(_copies(steps, lambda n, i, j=j: j * per_slot + n) for j in range(3)) * hb * hd * 4
    norms = 2 * _copies(steps, lambda n, i: 0) * hd * 4
    x = _copies(steps, lambda n, i: i) * bt * dim * 4
    tables = 2 * _copies(steps, lambda n, i: i) * bt * (hd // 2) * 4
    out = _copies(steps, lambda n, i: (n, i)) * 3 * hb * bt * hd * 2
    rng = np.random.default_rng(0)
    params = PreAttnParams(
        jnp.asarray(rng.standard_normal((3 * dim, dim)), jnp.bfloat16),
        jnp.zeros((3 * dim,), jnp.float32),
        jnp.ones((hd,)),
        jnp.ones((hd,)),
    )
    cos, sin = rope_tables(5, 6, 8, hd)
    est = _estimate(
        lambda x: preattn(x, params, cos, sin, heads=heads, block_tokens=block_tokens, block_heads=block_heads),
        jnp.zeros((tokens, dim), jnp.float32),
    )
    assert est.bytes_accessed == weights + bias + norms + x + tables + out
    assert est.flops >= 2 * tokens * dim * 3 * dim  # the qkv matmul at least (the rest is op by op)
