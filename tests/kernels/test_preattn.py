"""Fused pre-attention: Pallas kernel vs the plain-JAX mirror vs the PyTorch model, and the chain
kernel -> Ulysses on the 8-device mesh, compiled, serialized and loaded back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from kernels.preattn import (
    PreAttnParams,
    cost_estimate,
    default_block_tokens,
    preattn,
    preattn_reference,
    preattn_sharded,
    rope_tables,
    unpack_qkv,
)
from kernels.ulysses import FrameWindow, frame_window_mask, reference_attention, ulysses_attention_packed
from tests import tools


def _params(rng: np.random.Generator, dim: int, heads: int, bias: bool = True) -> PreAttnParams:
    hd = dim // heads
    return PreAttnParams(
        w_qkv=jnp.asarray(rng.standard_normal((3 * dim, dim)) * dim**-0.5, jnp.bfloat16),
        b_qkv=jnp.asarray(rng.standard_normal(3 * dim) * 0.1, jnp.float32) if bias else None,
        q_norm=jnp.asarray(1 + 0.1 * rng.standard_normal(hd), jnp.float32),
        k_norm=jnp.asarray(1 + 0.1 * rng.standard_normal(hd), jnp.float32),
    )


# Bit-exact comparisons are between compiled programs. Eager (op-by-op) JAX rounds differently
# in about 1e-5 of the q/k elements: unfused, XLA:CPU cannot contract the rotary's multiply-add
# into an FMA as it does inside a fusion (the kernel and the jitted reference both fuse).


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def _bf16_close(a: jax.Array, b: jax.Array) -> None:
    """Equal up to one bf16 rounding step (what a different f32 summation order can cause)."""
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2**-7, atol=1e-6)


# (tokens, frames/rows/cols for the rope tables, dim, heads, groups, block_tokens, block_heads, bias)
CASES = [
    # hd 16, 3 token tiles, a head block per group (~2 s on 2 cores: full suite only)
    pytest.param(48, (2, 4, 6), 128, 8, 2, 16, None, True, marks=pytest.mark.slow),
    (96, (4, 4, 6), 64, 8, 4, None, 1, False),  # hd 8, one token tile, 8 head blocks, no bias
]


@pytest.mark.parametrize("tokens, grid, dim, heads, groups, block_tokens, block_heads, bias", CASES)
def test_kernel_vs_reference(tokens, grid, dim, heads, groups, block_tokens, block_heads, bias):
    """Bit-exact vs the reference with the kernel's dot; close to the model's formulation."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((tokens, dim)), jnp.float32)
    params = _params(rng, dim, heads, bias)
    cos, sin = rope_tables(*grid, dim // heads)
    blocks = dict(block_tokens=block_tokens, block_heads=block_heads)
    out = jax.jit(lambda *a: preattn(*a, heads=heads, groups=groups, **blocks))(x, params, cos, sin)
    assert out.shape == (groups, 3, heads // groups, tokens, dim // heads) and out.dtype == jnp.bfloat16
    same_dot = jax.jit(lambda *a: preattn_reference(*a, heads=heads, groups=groups, matmul="bf16"))(x, params, cos, sin)
    np.testing.assert_array_equal(_bits(out), _bits(same_dot))
    model_dot = jax.jit(lambda *a: preattn_reference(*a, heads=heads, groups=groups))(x, params, cos, sin)
    _bf16_close(out, model_dot)


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_packing_layout():
    """packed[g] is group g's all-to-all operand: contiguous heads, q/k/v stacked."""
    rng = np.random.default_rng(2)
    tokens, dim, heads, groups = 48, 128, 8, 4
    x = jnp.asarray(rng.standard_normal((tokens, dim)), jnp.float32)
    params = _params(rng, dim, heads)
    cos, sin = rope_tables(2, 4, 6, dim // heads)
    packed = jax.jit(lambda *a: preattn_reference(*a, heads=heads, groups=groups))(x, params, cos, sin)
    q, k, v = jax.jit(lambda *a: unpack_qkv(preattn_reference(*a, heads=heads)))(x, params, cos, sin)
    hg = heads // groups
    for g in range(groups):
        for j, t in enumerate((q, k, v)):
            np.testing.assert_array_equal(_bits(packed[g, j]), _bits(t[g * hg : (g + 1) * hg]))
    assert all(a.shape == (heads, tokens, dim // heads) for a in jax.jit(unpack_qkv)(packed))


@pytest.mark.slow  # seconds on 2 cores
def test_reference_matches_torch_selfattention(monkeypatch):
    """q, k, v as model.attention.SelfAttention.forward hands them to `attention` (eager torch)."""
    torch = tools.module("torch")
    import model.attention as mattn

    dim, heads, (frames, rows, cols) = 128, 8, (2, 4, 6)
    hd, tokens = dim // heads, frames * rows * cols
    rng = np.random.default_rng(3)
    params = _params(rng, dim, heads)
    x = rng.standard_normal((tokens, dim)).astype(np.float32)

    module = mattn.SelfAttention(dim, heads)
    as_torch = lambda a: torch.from_numpy(np.array(a, np.float32))  # noqa: E731 - a writable copy
    with torch.no_grad():
        module.qkv.weight.copy_(as_torch(params.w_qkv).to(torch.bfloat16))  # exact: already bf16 values
        module.qkv.bias.copy_(as_torch(params.b_qkv))
        module.q_norm.weight.copy_(as_torch(params.q_norm))
        module.k_norm.weight.copy_(as_torch(params.k_norm))
    captured = {}

    def capture(q, k, v, mask=None):
        captured.update(q=q, k=k, v=v)
        return q

    monkeypatch.setattr(mattn, "attention", capture)
    rope = mattn.rope_tables(frames, rows, cols, hd, torch.device("cpu"))
    with torch.no_grad():
        module(torch.from_numpy(x), rope)

    # The JAX rope tables mirror the model's (to float32 rounding of pow / cos / sin).
    cos, sin = rope_tables(frames, rows, cols, hd)
    np.testing.assert_allclose(np.asarray(cos), rope[0].numpy(), atol=2e-6)
    np.testing.assert_allclose(np.asarray(sin), rope[1].numpy(), atol=2e-6)

    tables = (jnp.asarray(rope[0].numpy()), jnp.asarray(rope[1].numpy()))
    ours = unpack_qkv(preattn_reference(jnp.asarray(x), params, *tables, heads=heads))
    for name, mine in zip("qkv", ours):
        theirs = captured[name].float().numpy()
        assert captured[name].dtype == torch.bfloat16 and theirs.shape == mine.shape
        _bf16_close(mine, theirs)
        assert np.mean(np.asarray(mine, np.float32) == theirs) > 0.99, name


def test_cost_estimate_is_honest():
    """Flops and transcendentals agree with XLA's own count for the unfused reference."""
    tokens, dim, heads = 240, 128, 8
    est = cost_estimate(tokens, dim, heads)
    x = jnp.zeros((tokens, dim), jnp.float32)
    params = _params(np.random.default_rng(0), dim, heads)
    cos, sin = rope_tables(5, 6, 8, dim // heads)
    xla = jax.jit(lambda *a: preattn_reference(*a, heads=heads)).lower(x, params, cos, sin).compile().cost_analysis()
    assert est.flops == pytest.approx(xla["flops"], rel=0.05)
    assert est.transcendentals == xla["transcendentals"] == 2 * tokens * heads
    hd = dim // heads
    once = 3 * dim * dim * 2 + 3 * dim * 4 + 2 * hd * 4 + 3 * tokens * dim * 2  # weights, bias, norms, output
    per_head_block = tokens * dim * 4 + 2 * tokens * (hd // 2) * 4  # x and the rope tables
    assert est.bytes_accessed == once + per_head_block
    # One token tile (240 tokens): x and the tables are copied once whatever the head blocks, as
    # their block index never changes; five 48-token tiles are re-copied for every head block.
    assert cost_estimate(tokens, dim, heads, block_heads=2).bytes_accessed == once + per_head_block
    assert (
        cost_estimate(tokens, dim, heads, block_heads=2, block_tokens=48).bytes_accessed
        == once + (heads // 2) * per_head_block
    )


def test_default_block_tokens():
    assert default_block_tokens(30) == 30  # no multiple-of-16 divisor: the whole axis
    assert default_block_tokens(1440) == 480
    assert default_block_tokens(48) == 48
    with pytest.raises(ValueError, match="block_tokens"):
        x = jnp.zeros((48, 64))
        preattn(x, _params(np.random.default_rng(0), 64, 8), *rope_tables(2, 4, 6, 8), heads=8, block_tokens=32)


@pytest.mark.slow  # seconds on 2 cores
def test_sharded_chain_compiles_serializes_and_matches():
    """x -> preattn on each token shard -> grouped Ulysses, on the 8-device mesh, as one program."""
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    mesh = jax.make_mesh((8,), ("fsdp",))
    frames, rows, cols, dim, heads, groups = 8, 5, 6, 128, 16, 2  # 240 tokens, hd 8
    hd, tokens = dim // heads, frames * rows * cols
    rng = np.random.default_rng(4)
    params = _params(rng, dim, heads)
    x_host = jnp.asarray(rng.standard_normal((tokens, dim)), jnp.float32)
    cos, sin = rope_tables(frames, rows, cols, hd)
    seq = NamedSharding(mesh, PartitionSpec("fsdp", None))
    x, cos_s, sin_s = (jax.device_put(a, seq) for a in (x_host, cos, sin))
    mask = FrameWindow(frames, rows * cols, 1)

    def chain(x, params, cos, sin):
        packed = preattn_sharded(x, params, cos, sin, mesh=mesh, heads=heads, groups=groups, block_heads=4)
        return ulysses_attention_packed(packed, mesh=mesh, mask=mask)

    compiled = jax.jit(chain).lower(x, params, cos_s, sin_s).compile()
    out = compiled(x, params, cos_s, sin_s)
    assert out.shape == (heads, tokens, hd) and out.sharding.spec == PartitionSpec(None, "fsdp", None)

    # One device, unfused, same dot formulation: the same bits.
    def single_device(x, params, cos, sin):
        q, k, v = unpack_qkv(preattn_reference(x, params, cos, sin, heads=heads, matmul="bf16"))
        return reference_attention(q, k, v, frame_window_mask(frames, rows * cols, 1))

    ref = jax.jit(single_device)(x_host, params, cos, sin)
    np.testing.assert_array_equal(_bits(out), _bits(ref))

    payload, in_tree, out_tree = serialize(compiled)
    loaded = deserialize_and_load(payload, in_tree, out_tree)
    np.testing.assert_array_equal(_bits(loaded(x, params, cos_s, sin_s)), _bits(out))
