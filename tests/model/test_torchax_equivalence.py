"""The tiny pipeline in eager torch vs. the same module, unmodified, through torchax + jax.jit (XLA CPU).

Each stage is compiled from abstract shapes alone (stage_inputs), exactly as the release compile
does, then fed the eager outputs of the stage before it; a whole chunk is also run as the chain of
the three compiled stages.

Tolerances, and why they are not zero: every matmul and conv runs in bf16. Torch CPU (oneDNN) and
XLA CPU accumulate those products in different orders and round intermediate results at
different points, so the two backends disagree by bf16 reassociation noise. Measured on tiny over
three seeds (max |diff| / max |eager|, mean |diff| / mean |eager|):
    DiT latents     <= 0.41 %, 0.26 %     (4 Euler steps x 2 blocks)
    SR latents      <= 0.69 %, 0.40 %     (chained after the jitted DiT)
    frames (uint8)  max 2 levels, mean 0.18 level, ~18 % of values off by >= 1 level
The bounds below are ~3-5x the measurements: loose enough for the noise, far below what a real
divergence (a wrong mask, a dropped condition, another seed) produces, which is O(100 %) and tens
of levels. Within one backend, results are bit-identical run to run (asserted too).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tools import module

torchax = module("torchax")  # the [compile] extra (torch + torchax)

from model.pipeline import STAGES, stage_inputs, stage_module, stage_outputs  # noqa: E402

pytestmark = pytest.mark.slow

LATENT_MAX_REL = {"dit": 0.02, "sr": 0.03}  # max |diff| / max |eager|
LATENT_MEAN_REL = {"dit": 0.01, "sr": 0.015}  # mean |diff| / mean |eager|
PIXEL_MAX_LEVELS = 4
PIXEL_MEAN_LEVELS = 0.5
PIXEL_FRACTION_OFF = 0.4


@pytest.fixture(scope="module")
def compiled(tiny, tiny_pipeline):
    """stage -> (params, compiled executable), built from the abstract signature only."""
    out = {}
    for stage in STAGES:
        params, fn = torchax.extract_jax(stage_module(tiny_pipeline, stage))
        abstract = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for _, shape, dtype in stage_inputs(tiny)[stage]]
        exe = jax.jit(lambda p, *args, fn=fn: fn(p, args)).lower(params, *abstract).compile()
        out[stage] = (params, exe)
    return out


def _run(compiled, stage, *args):
    params, exe = compiled[stage]
    result = exe(params, *args)
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _assert_latents_close(stage, got, want):
    got, want = np.asarray(got), np.asarray(want)
    diff = np.abs(got - want)
    max_rel, mean_rel = diff.max() / np.abs(want).max(), diff.mean() / np.abs(want).mean()
    assert max_rel <= LATENT_MAX_REL[stage], f"{stage}: max rel diff {max_rel:.4f}"
    assert mean_rel <= LATENT_MEAN_REL[stage], f"{stage}: mean rel diff {mean_rel:.4f}"


def _assert_frames_close(got, want):
    diff = np.abs(np.asarray(got).astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= PIXEL_MAX_LEVELS, f"max pixel diff {diff.max()}"
    assert diff.mean() <= PIXEL_MEAN_LEVELS, f"mean pixel diff {diff.mean():.3f}"
    assert (diff > 0).mean() <= PIXEL_FRACTION_OFF, f"fraction of values off {(diff > 0).mean():.3f}"


def test_compiled_signatures_match_stage_outputs(tiny, compiled):
    for stage in STAGES:
        avals = jax.tree_util.tree_leaves(compiled[stage][1].out_info)
        want = [(shape, dtype) for _, shape, dtype in stage_outputs(tiny)[stage]]
        assert [(tuple(a.shape), a.dtype.name) for a in avals] == want, stage


def test_each_stage_matches_eager(compiled, tiny_chunk_inputs, tiny_eager_stages):
    image = tiny_chunk_inputs[0]
    latents, last = _run(compiled, "dit", *tiny_chunk_inputs)
    _assert_latents_close("dit", latents, tiny_eager_stages["dit"][0])
    _assert_latents_close("dit", last, tiny_eager_stages["dit"][1])
    (sr,) = _run(compiled, "sr", tiny_eager_stages["dit"][0], image)
    _assert_latents_close("sr", sr, tiny_eager_stages["sr"][0])
    (frames,) = _run(compiled, "vae", tiny_eager_stages["sr"][0], image)
    assert frames.dtype == jnp.uint8
    _assert_frames_close(frames, tiny_eager_stages["vae"][0])


def test_whole_chunk_matches_eager_and_is_deterministic(compiled, tiny_chunk_inputs, tiny_eager_stages):
    image = tiny_chunk_inputs[0]

    def chunk():
        latents, last = _run(compiled, "dit", *tiny_chunk_inputs)
        (sr,) = _run(compiled, "sr", latents, image)
        (frames,) = _run(compiled, "vae", sr, image)
        return np.asarray(frames), np.asarray(last), np.asarray(sr)

    frames, last, sr = chunk()
    _assert_latents_close("dit", last, tiny_eager_stages["dit"][1])
    _assert_latents_close("sr", sr, tiny_eager_stages["sr"][0])
    _assert_frames_close(frames, tiny_eager_stages["vae"][0])
    again = chunk()
    assert np.array_equal(again[0], frames) and np.array_equal(again[1], last)  # bit-identical twin
