"""Ulysses attention with head groups: exactness across G, the compiled collectives, serialization.

Compiling a program with collectives takes about a second on XLA:CPU, so the frame-window
programs (the production case) are compiled once per module and shared by the tests that read
their outputs, their HLO and their serialized executable.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from kernels.ulysses import (
    FrameWindow,
    alltoall_bytes,
    frame_window_mask,
    hlo_all_to_alls,
    reference_attention,
    ulysses_attention,
    ulysses_attention_ungrouped,
)
from tests.tools import module

HEADS, SEQ, HEAD_DIM, P = 32, 240, 16, 8  # heads / G must be a multiple of P for G up to 4
FRAMES, TOKENS, WINDOW = 8, 30, 1  # 8 frames x 30 tokens = 240, frame 0 the reference
GROUPS = (1, 2, 4)


@dataclass
class Program:
    lowered: jax.stages.Lowered
    compiled: jax.stages.Compiled
    out: jax.Array


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((P,), ("fsdp",))


@pytest.fixture(scope="module")
def qkv_host() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return tuple(
        np.asarray(jnp.asarray(rng.standard_normal((HEADS, SEQ, HEAD_DIM)) * 2, jnp.bfloat16)) for _ in range(3)
    )


@pytest.fixture(scope="module")
def qkv(mesh, qkv_host):
    sharding = NamedSharding(mesh, PartitionSpec(None, "fsdp", None))
    return tuple(jax.device_put(t, sharding) for t in qkv_host)


def _build(fn, args) -> Program:
    lowered = jax.jit(fn).lower(*args)
    compiled = lowered.compile()
    return Program(lowered, compiled, compiled(*args))


@pytest.fixture(scope="module")
def window_programs(mesh, qkv) -> dict:
    """Separately compiled programs, frame-window mask: 'ungrouped' and G = 1, 2, 4."""
    mask = FrameWindow(FRAMES, TOKENS, WINDOW)
    programs = {"ungrouped": _build(lambda q, k, v: ulysses_attention_ungrouped(q, k, v, mesh=mesh, mask=mask), qkv)}
    for g in GROUPS:
        programs[g] = _build(lambda q, k, v, g=g: ulysses_attention(q, k, v, mesh=mesh, groups=g, mask=mask), qkv)
    return programs


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def test_groups_bit_exact_frame_window(window_programs, qkv_host):
    base = window_programs["ungrouped"].out
    for g in GROUPS:
        out = window_programs[g].out
        assert out.shape == (HEADS, SEQ, HEAD_DIM) and out.dtype == jnp.bfloat16
        assert out.sharding.spec == PartitionSpec(None, "fsdp", None)
        np.testing.assert_array_equal(_bits(out), _bits(base), err_msg=f"G={g}")
    # vs one device holding everything, with the dense (S, S) mask.
    ref = jax.jit(reference_attention)(*(jnp.asarray(t) for t in qkv_host), frame_window_mask(FRAMES, TOKENS, WINDOW))
    np.testing.assert_allclose(np.asarray(base, np.float32), np.asarray(ref, np.float32), rtol=2**-7, atol=1e-3)


def test_other_mask_forms(mesh, qkv, qkv_host, window_programs):
    """An (S, S) array and a callable give the frame-window bits; no mask is plain attention.

    All in one program: compiling collectives is the slow part of these tests.
    """
    dense = frame_window_mask(FRAMES, TOKENS, WINDOW)
    as_callable = lambda qi, ki: FrameWindow(FRAMES, TOKENS, WINDOW)(qi, ki)  # noqa: E731 - a plain function

    def variants(q, k, v):
        return (
            ulysses_attention(q, k, v, mesh=mesh, groups=2, mask=dense),
            ulysses_attention(q, k, v, mesh=mesh, groups=4, mask=as_callable),
            ulysses_attention(q, k, v, mesh=mesh, groups=2, mask=None),
        )

    with_array, with_callable, unmasked = jax.jit(variants)(*qkv)
    np.testing.assert_array_equal(_bits(with_array), _bits(window_programs[1].out))
    np.testing.assert_array_equal(_bits(with_callable), _bits(window_programs[1].out))
    ref = jax.jit(reference_attention)(*(jnp.asarray(t) for t in qkv_host))
    np.testing.assert_allclose(np.asarray(unmasked, np.float32), np.asarray(ref, np.float32), rtol=2**-7, atol=1e-3)


def test_head_loop_bit_exact(mesh, qkv, window_programs):
    """The opt-in one-head-at-a-time loop computes the same bits as the batched heads."""
    mask = FrameWindow(FRAMES, TOKENS, WINDOW)
    looped = jax.jit(lambda q, k, v: ulysses_attention(q, k, v, mesh=mesh, groups=4, mask=mask, head_loop=True))(*qkv)
    np.testing.assert_array_equal(_bits(looped), _bits(window_programs[1].out))


def test_custom_attention_fn_sees_full_sequence(mesh, qkv):
    """attention_fn gets this device's heads of the group over all S tokens, and the (S, S) mask."""
    seen = []

    def identity_on_v(q, k, v, mask):
        seen.append((q.shape, v.shape, None if mask is None else mask.shape))
        return v  # then the two all-to-alls must be exact inverses of each other

    mask = FrameWindow(FRAMES, TOKENS, WINDOW)
    out = jax.jit(
        lambda q, k, v: ulysses_attention(q, k, v, mesh=mesh, groups=2, mask=mask, attention_fn=identity_on_v)
    )(*qkv)
    local = (HEADS // 2 // P, SEQ, HEAD_DIM)
    assert seen and all(s == (local, local, (SEQ, SEQ)) for s in seen)
    np.testing.assert_array_equal(_bits(out), _bits(qkv[2]))


def test_frame_window_matches_model():
    torch = module("torch")
    from model.sr import frame_window_mask as torch_frame_window_mask

    expected = torch_frame_window_mask(FRAMES, TOKENS, WINDOW, torch.device("cpu")).numpy()
    np.testing.assert_array_equal(np.asarray(frame_window_mask(FRAMES, TOKENS, WINDOW)), expected)


def test_alltoall_bytes_equal_total_for_every_g():
    one = alltoall_bytes(HEADS, SEQ, HEAD_DIM, jnp.bfloat16, P, 1)
    assert one.total == 4 * HEADS * (SEQ // P) * HEAD_DIM * 2  # q, k, v in + output back, bf16
    for g in GROUPS:
        b = alltoall_bytes(HEADS, SEQ, HEAD_DIM, jnp.bfloat16, P, g)
        assert b.total == one.total and b.per_group * g == b.total
        assert b.per_group_in == 3 * b.per_group_out and b.wire_total == b.total * (P - 1) // P
    with pytest.raises(ValueError):
        alltoall_bytes(HEADS, SEQ, HEAD_DIM, jnp.bfloat16, P, 8)  # 4 heads per group < P


def test_compiled_hlo_has_2g_all_to_alls_with_equal_bytes(window_programs):
    totals = set()
    for g in GROUPS:
        expected = alltoall_bytes(HEADS, SEQ, HEAD_DIM, jnp.bfloat16, P, g)
        per_op = sorted([expected.per_group_in, expected.per_group_out] * g)
        lowered_ops = hlo_all_to_alls(window_programs[g].lowered.as_text(dialect="hlo"))
        compiled_ops = hlo_all_to_alls(window_programs[g].compiled.as_text())
        for ops in (lowered_ops, compiled_ops):  # neither merged nor split by the compiler
            assert len(ops) == 2 * g, [o.name for o in ops]
            assert sorted(o.bytes for o in ops) == per_op
        totals.add(sum(o.bytes for o in compiled_ops))
    assert totals == {alltoall_bytes(HEADS, SEQ, HEAD_DIM, jnp.bfloat16, P, 1).total}

    # The plain chain: the same bytes in 4 launches (q, k, v separately, then the output).
    ops = hlo_all_to_alls(window_programs["ungrouped"].lowered.as_text(dialect="hlo"))
    assert len(ops) == 4 and sum(o.bytes for o in ops) == totals.pop()


def test_hlo_parser_forms():
    text = """
  %a2a-start = ((bf16[3,4,30,16]{3,2,1,0}), bf16[3,4,30,16]{3,2,1,0}, u32[]) all-to-all-start(%p), dimensions={1}
  %a2a-done = bf16[3,4,30,16]{3,2,1,0} all-to-all-done(%a2a-start)
  ROOT %all_to_all.1 = (f32[2,30,16]{2,1,0}, f32[2,30,16]{2,1,0}) all-to-all(%x, %y), replica_groups={{0,1}}
  %gte = f32[2,30,16] get-tuple-element(%all_to_all.1), index=0
"""
    ops = hlo_all_to_alls(text)
    assert [o.kind for o in ops] == ["all-to-all-start", "all-to-all"]
    assert [o.bytes for o in ops] == [3 * 4 * 30 * 16 * 2, 2 * 2 * 30 * 16 * 4]
    assert [o.elements for o in ops] == [3 * 4 * 30 * 16, 2 * 2 * 30 * 16]


def test_invalid_arguments_rejected(mesh, qkv):
    with pytest.raises(ValueError, match="multiple of the axis size"):
        ulysses_attention(*qkv, mesh=mesh, groups=8)
    with pytest.raises(ValueError, match="mask must be"):
        ulysses_attention(*qkv, mesh=mesh, mask=jnp.ones((SEQ, SEQ), jnp.float32))
    with pytest.raises(ValueError, match="covers"):
        ulysses_attention(*qkv, mesh=mesh, mask=FrameWindow(FRAMES + 1, TOKENS, WINDOW))


def test_serialize_roundtrip(window_programs, qkv):
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    program = window_programs[2]
    payload, in_tree, out_tree = serialize(program.compiled)
    loaded = deserialize_and_load(payload, in_tree, out_tree)
    np.testing.assert_array_equal(_bits(loaded(*qkv)), _bits(program.out))


def _collectives(fn, *args) -> list[str]:
    text = str(jax.make_jaxpr(fn)(*args))
    return [name for name in ("all_to_all", "concatenate", "bitcast_convert_type") for _ in range(text.count(name))]


def test_a_tpu_build_moves_q_k_v_as_they_are_with_one_group(mesh, qkv):
    """On TPU, G = 1 sends q, k and v by three bf16 all-to-alls (no packing copy, no bitcasts);
    the CPU path packs them into one u16 operand. Same data, moved differently."""
    from kernels.target import kernel_target

    q, k, v = (t.astype(jnp.bfloat16) for t in qkv)

    def traced(platform: str) -> list[str]:
        fn = lambda a, b, c: ulysses_attention(a, b, c, mesh=mesh, groups=1)  # noqa: E731 - a fresh trace each
        with kernel_target(platform):
            return _collectives(fn, q, k, v)

    cpu, tpu = traced("cpu"), traced("tpu")
    assert tpu.count("all_to_all") == 4 and "bitcast_convert_type" not in tpu
    assert cpu.count("all_to_all") == 2 and "bitcast_convert_type" in cpu
