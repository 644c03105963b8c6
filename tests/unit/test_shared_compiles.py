"""A program identical across buckets is found before compiling and compiled once (compile/_share.py):
what makes two lowered stages one compile, and what keeps them apart."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from avatar_release.compile._share import shared_compiles
from avatar_release.compile._stage import StagePlan, compile_stage, lower_stage, shared_stage
from avatar_release.records import ArraySpec


def _encode(params, args):  # reads only the photo: the same program in every bucket
    (image,) = args
    return jnp.tanh(image.astype(jnp.float32).mean() * params["w"])


def _motion(params, args):  # its input's shape is the bucket's
    (x,) = args
    return x * params["w"][0]


def _plan(stage: str, bucket: str, fn, x_shape: list[int], out_shape: list[int], dtype: str = "float32") -> StagePlan:
    return StagePlan(
        stage=stage,
        bucket=bucket,
        jax_func=fn,
        params=[ArraySpec(name=f"{stage}.w", shape=[4], dtype="float32", sharding=[None])],
        param_keys=["w"],
        inputs=[ArraySpec(name="x", shape=x_shape, dtype=dtype, sharding=[None] * len(x_shape))],
        outputs=[ArraySpec(name="y", shape=out_shape, dtype="float32", sharding=[None] * len(out_shape))],
    )


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("fsdp",))


@pytest.fixture(scope="module")
def lowered(mesh):
    plans = [
        _plan("encode", "f8", _encode, [2, 2, 3], [4], "uint8"),
        _plan("encode", "f4", _encode, [2, 2, 3], [4], "uint8"),
        _plan("motion", "f8", _motion, [8], [8]),
        _plan("motion", "f4", _motion, [4], [4]),
    ]
    return [lower_stage(p, mesh) for p in plans]


def test_the_same_program_in_two_buckets_is_one_compile(lowered):
    groups = shared_compiles(lowered, lambda ls: {"xla_backend_optimization_level": 2})
    assert groups.compiles == (0, 2, 3) and dict(groups.shares) == {1: 0}


def test_other_compiler_options_keep_them_apart_and_a_dump_path_does_not(lowered):
    def options(level_of_f4: int):
        return lambda ls: {
            "xla_backend_optimization_level": level_of_f4 if ls.plan.bucket == "f4" else 2,
            "xla_gpu_dump_autotune_results_to": f"/tmp/{ls.plan.stage}-{ls.plan.bucket}.textproto",
        }

    assert dict(shared_compiles(lowered, options(2)).shares) == {1: 0}
    assert dict(shared_compiles(lowered, options(1)).shares) == {}


def test_a_shared_stage_runs_the_same_executable_under_its_own_slot(lowered):
    first = compile_stage(lowered[0], {})
    other = shared_stage(lowered[1], first)
    assert other.payload is first.payload and other.compiled is first.compiled
    assert other.plan.bucket == "f4" and other.evidence.hlo_digest == first.evidence.hlo_digest
    assert other.evidence.compile_seconds == 0.0 and other.evidence.trace_seconds == round(lowered[1].trace_seconds, 4)
