"""A scanned block stack gathers each layer's weights inside the loop (FSDP), except those a
module marks stationary, and its per-run cost counts the loop as many times as it turns."""

from __future__ import annotations

import re

import pytest

from avatar_release.compile import compile_build
from avatar_release.compile._loopcost import _COND_BODY, _WHILE, _Module, run_cost
from avatar_release.registry import MemoryRegistry

pytestmark = pytest.mark.slow  # compiles tiny twice


def _loop_bodies(hlo: str) -> list[list[str]]:
    module = _Module(hlo)
    bodies = []
    for line in module.body(module.entry):
        m = _WHILE.match(line)
        if m and _COND_BODY.search(m.group(1)):
            bodies.append(module.body(_COND_BODY.search(m.group(1)).group(2)))
    return bodies


def _dims(line: str) -> list[int]:
    shape = re.search(r"=\s*\(?\w+\[([\d,]*)\]", line).group(1)
    return [int(x) for x in shape.split(",") if x]


def test_a_scanned_stack_gathers_each_layers_weights_inside_its_loop_and_is_costed_per_run(build_cache):
    reg = MemoryRegistry()
    scanned = compile_build(
        "tiny", "cpu-8", registry=reg, overrides={"scan_layers": "true"}, move_dev=False, keep_compiled=True
    )
    hlo = scanned.compiled["dit/f8"].as_text()
    bodies = _loop_bodies(hlo)
    assert len(bodies) == 4  # one scan per sampler step
    d, tokens = 64, 8 * 60  # tiny's DiT width; tokens of an 8-frame chunk
    for body in bodies:  # each layer's weights arrive whole inside the loop...
        gathered = [_dims(ln) for ln in body if re.search(r"\sall-gather(-start)?\(", ln)]
        for weight in ([3 * d, d], [4 * d, d], [d, 4 * d]):  # qkv, fc1, fc2
            assert any(g[-2:] == weight for g in gathered), (weight, gathered)
        # The per-frame adaLN modulation is "stationary": its weight stays split, its output moves.
        assert not any(g[-2:] == [6 * d, d] for g in gathered), gathered
        # ...and the activations stay sharded by frame: nothing the size of the chunk's tokens is
        # gathered (left to itself the partitioner gathered them and split the weights instead).
        assert not any(tokens in g for g in gathered), gathered
    dit = scanned.manifest.executable("dit", "f8")
    run = run_cost(hlo)
    assert sorted(t for _, t in run.loops) == [2, 2, 2, 2]  # tiny: 2 blocks x 4 steps
    assert dit.cost["flops per run"] == pytest.approx(run.flops)
    assert dit.cost["flops per run"] > dit.cost["flops"]  # XLA's own figure counts each body once

    # The lever still serves: zero compiles, close to the unscanned default (another fusion and
    # reduction order, so not bit-exact: scan_layers is a tier-2 lever).
    from avatar_release.gates.metrics import psnr
    from avatar_release.media import sample_audio, sample_image
    from avatar_release.runtime import load, render

    base = build_cache.compile("tiny", "cpu-8", registry=reg, move_dev=False)
    image, audio = sample_image(48, 80), sample_audio(0.64)
    a, _ = render(load(base.build_id, reg), image, audio)
    build = load(scanned.build_id, reg)
    b, report = render(build, image, audio)
    assert build.guard.count == 0 and all(c.compiles == 0 for c in report.chunks)
    assert a.shape == b.shape and min(psnr(x, y) for x, y in zip(a, b)) > 40
