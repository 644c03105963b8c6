"""The DiT's flash attention kernel: equal to dense attention, no S x S array, counted by _flops,
and lowered through Mosaic for the tpu-v6e-8 target."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from avatar_release.compile._flops import traced_flops
from kernels.flash import NAME, cost_estimate, default_blocks, flash_attention, flash_attention_jit, flash_reference
from kernels.ulysses import reference_attention, ulysses_attention

BF16_EPS = 2.0**-7  # bf16 spacing at 1.0


def _qkv(heads: int, seq: int, head_dim: int, dtype, seed: int = 0, spread: float = 1.0):
    q, k, v = jax.random.normal(jax.random.PRNGKey(seed), (3, heads, seq, head_dim), jnp.float32)
    return (q * spread).astype(dtype), (k * spread).astype(dtype), v.astype(dtype)


def _max_err(a, b) -> float:
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


def test_default_blocks_divide_the_sequence_and_leave_two_blocks():
    assert default_blocks(14720) == (1840, 640)  # avatar-720p: 16 frames x 920 tokens = 115 x 128
    assert default_blocks(32640) == (1920, 640)  # avatar-1080p at 16 frames
    assert default_blocks(16320) == (1632, 480)  # avatar-1080p's 8-frame bucket: no multiple of 128 divides
    assert default_blocks(480) == (240, 240)  # tiny: still two key blocks
    assert default_blocks(40) == (40, 40)  # nothing aligned divides it: the whole axis


@pytest.mark.parametrize("seq,block_q,block_k", [(480, 96, 160), (480, None, None), (256, 256, 64)])
def test_matches_the_reference_float32(seq, block_q, block_k):
    # spread 3: logits of a few units, so later key blocks raise the running max and rescale.
    q, k, v = _qkv(2, seq, 16, jnp.float32, spread=3.0)
    out = flash_attention_jit(q, k, v, block_q=block_q, block_k=block_k)
    assert out.dtype == jnp.float32 and out.shape == q.shape
    # float32 logits of tens of units carry ~1e-6 absolute rounding into exp: 1e-5 on outputs of O(1).
    assert _max_err(out, flash_reference(q, k, v)) <= 1e-5


@pytest.mark.slow  # a second interpret-mode compile
def test_matches_the_reference_bf16_like_the_model():
    q, k, v = _qkv(2, 480, 16, jnp.bfloat16, seed=1)
    out = flash_attention_jit(q, k, v, block_q=96, block_k=160)
    ref = flash_reference(q, k, v)
    assert out.dtype == jnp.bfloat16
    # p is rounded to bf16 for the value matmul and the output to bf16: two bf16 ulps of the scale.
    assert _max_err(out, ref) <= 2 * BF16_EPS * float(jnp.max(jnp.abs(ref.astype(jnp.float32))))
    # ...and as close to the model's own attention (XLA's, the GSPMD path) as that is to the truth.
    xla = reference_attention(q, k, v)
    assert _max_err(out, xla) <= 2 * _max_err(xla, ref) + BF16_EPS


def test_rejects_blocks_that_do_not_divide_the_sequence():
    q, k, v = _qkv(1, 96, 8, jnp.float32)
    with pytest.raises(ValueError, match="block_k=36 must divide"):
        flash_attention(q, k, v, block_q=48, block_k=36)
    with pytest.raises(ValueError, match="block_q=12"):
        flash_attention(q, k, v, block_q=12, block_k=48)  # divides, but not a sublane multiple


def test_no_score_matrix_is_ever_materialised():
    """Outside the kernel nothing is (S, S); inside, the largest value is one (b_q, b_k) tile."""
    seq, bq, bk = 480, 96, 160
    q, k, v = _qkv(2, seq, 16, jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda q, k, v: flash_attention(q, k, v, block_q=bq, block_k=bk))(q, k, v).jaxpr
    (call,) = [e for e in jaxpr.eqns if e.primitive.name == "pallas_call"]
    outer = [v.aval.shape for e in jaxpr.eqns for v in e.outvars]
    assert all(shape.count(seq) <= 1 for shape in outer)
    inner = [v.aval.shape for e in call.params["jaxpr"].eqns for v in e.outvars]
    assert (bq, bk) in inner and max(jnp.prod(jnp.array(s)) for s in inner if s) == bq * bk
    assert call.params["name"] == NAME
    assert call.params["cost_estimate"] == cost_estimate(heads=2, seq=seq, head_dim=16, block_q=bq, block_k=bk)


def test_the_flop_count_of_a_build_counts_the_kernel_inside_shard_map():
    """compile/_flops.py reads the kernel's CostEstimate (scaled by the mesh inside shard_map):
    the same 4 S^2 d per head as the dense attention's two dots."""
    heads, seq, d = 8, 480, 8
    mesh = Mesh(jax.devices()[:8], ("fsdp",))
    q, k, v = _qkv(heads, seq, d, jnp.bfloat16)

    def dit_attention(fn):
        return lambda q, k, v: ulysses_attention(q, k, v, mesh=mesh, axis="fsdp", attention_fn=fn)

    flash = traced_flops(
        jax.make_jaxpr(dit_attention(lambda a, b, c, m: flash_attention(a, b, c)))(q, k, v), count_trips=True
    )
    dense = traced_flops(jax.make_jaxpr(dit_attention(reference_attention))(q, k, v), count_trips=True)
    assert flash == dense == 4 * heads * seq * seq * d


@pytest.mark.extra("tpu")
@pytest.mark.parametrize("heads,seq,head_dim", [(8, 480, 8), (40, 1280, 128)])  # tiny's DiT; 720p's heads
def test_lowers_through_mosaic_for_the_tpu_target_with_its_flags(heads, seq, head_dim):
    """Compiled for v6e:2x4 on this host: one Mosaic call per device program, carrying the flag
    profile's kernel flags, and XLA:TPU's cost analysis takes the kernel's estimate."""
    from avatar_release.compile import make_mesh, target_devices
    from avatar_release.machine import configure_compile_env
    from avatar_release.specs import load_flag_profile, load_target
    from kernels.target import kernel_target

    tgt = load_target("tpu-v6e-8")
    configure_compile_env(tgt)
    flags = load_flag_profile(tgt.flag_profile)
    mesh = make_mesh(target_devices(tgt), tgt)
    x = jax.ShapeDtypeStruct(
        (heads, seq, head_dim), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec(None, "fsdp", None))
    )

    def dit_attention(q, k, v):
        return ulysses_attention(
            q, k, v, mesh=mesh, axis="fsdp", attention_fn=lambda a, b, c, m: flash_attention(a, b, c)
        )

    with kernel_target("tpu", flags.kernel_flags):
        lowered = jax.jit(dit_attention).lower(x, x, x)
    compiled = lowered.compile(compiler_options=dict(flags.compiler_options))
    calls = [line for line in compiled.as_text().splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    assert len(calls) == 1 and NAME in calls[0]
    assert all(name in calls[0] for name in flags.kernel_flags)
    local = heads // 8
    bq, bk = default_blocks(seq)
    est = cost_estimate(heads=local, seq=seq, head_dim=head_dim, block_q=bq, block_k=bk)
    assert est.flops <= compiled.cost_analysis()["flops"] < 1.05 * est.flops
