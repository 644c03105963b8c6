"""The zero-compile guard on its own, in milliseconds: no build, no registry.

A small ``jax.jit`` function is compiled once, then called under the guard: with the shape it
was compiled for nothing compiles (the guard stays at 0); with a new shape XLA compiles and the
guard records it, naming the function and what was running. In the style of equinox's
tests/test_jit.py::test_num_traces. The last test drives ``runtime.stream`` over stand-in
stages (jitted functions in place of deserialized executables) to check that strict mode turns
such a compile into RecompileError naming the stage and its input shapes.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avatar_release.errors import RecompileError
from avatar_release.runtime import CompileGuard
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def fn():
    """A jitted function compiled once for float32[8]; inputs are made outside any guard.

    A new Python function each time: JAX caches compiles by function, across jit wrappers.
    """

    def scale_and_shift(x):
        return 2.0 * x + 1.0

    f = jax.jit(scale_and_shift)
    x8 = jax.device_put(np.ones(8, np.float32))
    f(x8).block_until_ready()
    return f, x8, jax.device_put(np.ones(16, np.float32))


def test_the_compiled_shape_compiles_nothing(fn):
    f, x8, _ = fn
    with CompileGuard() as guard:
        guard.context = "scale_and_shift(x: float32[8])"
        for _ in range(3):
            f(x8).block_until_ready()
    assert guard.count == 0 and guard.events == [] and guard.seconds == 0.0


def test_a_new_shape_compiles_and_the_guard_names_what(fn):
    f, _, x16 = fn
    with CompileGuard() as guard:
        guard.context = "scale_and_shift(x: float32[16])"
        f(x16).block_until_ready()
        f(x16).block_until_ready()  # compiled now: once only
    assert guard.count == 1 and guard.seconds > 0
    (event,) = guard.events
    assert event["during"] == "scale_and_shift(x: float32[16])"
    assert "scale_and_shift" in event["fun_name"]


def test_only_a_started_guard_counts(fn):
    f, _, x16 = fn
    guard, other = CompileGuard(), CompileGuard().start()
    try:
        f(x16).block_until_ready()  # `guard` not started: not its business
        assert guard.count == 0 and other.count == 1
        with guard:
            f(jax.device_put(np.ones(32, np.float32))).block_until_ready()
        f(jax.device_put(np.ones(64, np.float32))).block_until_ready()  # `guard` stopped again
    finally:
        other.stop()
    assert guard.count == 1 and other.count == 3


def _stand_in_build(serve_shape_of_sr: bool):
    """A LoadedBuild over the checked-in tiny manifest whose stages are warmed jax.jit functions.

    Each stand-in returns zeros of its stage's declared outputs. The sr stand-in is warmed with
    the declared input shapes when ``serve_shape_of_sr``, else with half the frames (as if it were
    compiled for another bucket), so serving it compiles.
    """
    from avatar_release.runtime import LoadedBuild, LoadTimings
    from avatar_release.runtime._load import LoadedStage

    manifest = cpu_manifest()
    stages = {}
    for entry in manifest.executables:
        outs = [(tuple(s.shape), s.dtype) for s in entry.outputs]

        def run(params, *args, _outs=outs):
            return tuple(jnp.zeros(shape, dtype) for shape, dtype in _outs)

        exe = jax.jit(run)
        shapes = [tuple(s.shape) for s in entry.inputs]
        if entry.stage == "sr" and not serve_shape_of_sr:
            shapes = [(s[0] // 2, *s[1:]) if spec.name == "latents" else s for s, spec in zip(shapes, entry.inputs)]
        warm = [jax.device_put(np.zeros(s, spec.dtype)) for s, spec in zip(shapes, entry.inputs)]
        exe({}, *warm)
        stages[(entry.stage, entry.bucket)] = LoadedStage(entry, exe, [None] * len(entry.inputs), {})
    return LoadedBuild(
        resolved=None, manifest=manifest, registry="stand-in", mesh=None, stages=stages, timings=LoadTimings()
    )


def test_strict_stream_raises_recompile_error_naming_the_stage_that_compiled():
    from avatar_release.runtime import render

    image, audio = np.zeros((48, 80, 3), np.uint8), np.zeros(2 * 5120, np.float32)  # two f8 chunks
    frames, report = render(_stand_in_build(serve_shape_of_sr=True), image, audio)
    assert frames.shape == (16, 48, 80, 3) and [c.compiles for c in report.chunks] == [0, 0]

    with pytest.raises(RecompileError, match=r"serving stage sr/f8 .*latents\(8, 8, 6, 10\)") as info:
        render(_stand_in_build(serve_shape_of_sr=False), image, audio)
    assert info.value.events and all(e["during"].startswith("stage sr/f8") for e in info.value.events)
    assert any("run" in e["fun_name"] for e in info.value.events)


def test_a_stage_that_tunes_convolutions_on_its_first_run_counts_as_a_compile():
    """XLA:GPU left cuDNN algorithms to the first run (a deviceless compile): JAX reports no event for
    that choice, so the stream counts the stage's first run as one compile, and strict mode refuses it."""
    from avatar_release.runtime import render
    from avatar_release.runtime._guard import tuned_at_first_run

    assert tuned_at_first_run((DATA / "gpu-h100-dot-softmax-conv.hlo.txt").read_text()) == 1
    image, audio = np.zeros((48, 80, 3), np.uint8), np.zeros(2 * 5120, np.float32)  # two f8 chunks
    build = _stand_in_build(serve_shape_of_sr=True)
    build.stages[("vae", "f8")].tuned_at_first_run = 3
    build.guard.strict = False
    _, report = render(build, image, audio)
    assert [c.compiles for c in report.chunks] == [1, 0]  # the first run only
    (event,) = build.guard.events
    assert event["during"].startswith("stage vae/f8") and "3 cuDNN convolution(s)" in event["autotune_at_first_run"]

    build = _stand_in_build(serve_shape_of_sr=True)
    build.stages[("vae", "f8")].tuned_at_first_run = 3
    with pytest.raises(RecompileError, match=r"serving stage vae/f8") as info:
        render(build, image, audio)
    assert "choose their algorithm on this first run" in info.value.events[0]["autotune_at_first_run"]
