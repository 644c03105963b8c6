"""model.shapes: the numbers behind docs/concepts/production-shapes.md, checked against the models
themselves and held to the write-up's constraints."""

from __future__ import annotations

import pytest

from model.config import CONFIG_NAMES, get_config
from model.shapes import _live_pairs, param_counts, report_for_pipeline, shape_report

GIB = 2**30
PEAK, BW = 918e12, 1640e9  # tpu-v6e-8, per chip


@pytest.mark.extra("compile")  # torch, for the meta device
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_parameter_counts_are_exactly_what_the_modules_create(name):
    import torch

    from model.pipeline import AvatarPipeline

    with torch.device("meta"):
        p = AvatarPipeline(get_config(name))
    actual = {stage: sum(t.numel() for t in getattr(p, stage).parameters()) for stage in ("dit", "sr", "vae")}
    assert param_counts(get_config(name)) == actual


def test_live_pairs_counted_by_hand():
    """9 frames, window 1: the reference sees itself; frames 1 and 8 see 2 frames plus the
    reference (frame 1's lower neighbour is the reference); frames 2..7 see 3 plus the reference."""
    assert _live_pairs(9, 1) == 1 + 3 + 6 * 4 + 3
    assert _live_pairs(3, 0) == 1 + 2 * 2  # no window: each video frame sees itself and the reference


def test_flops_follow_the_shapes_by_hand_on_tiny():
    """tiny, 8 frames: the transformer blocks' matmuls and attention, counted by hand."""
    c = get_config("tiny")
    dit, sr, vae = shape_report(c, 8, PEAK, BW).stages
    s, d = 8 * 60, 64  # DiT tokens, width
    block = 2 * s * d * (3 * d + d + 8 * d) + 2 * 8 * d * 6 * d  # qkv, proj, MLP; per-frame adaLN
    assert dit.attention_flops == 4 * s * s * d * 2 * 4  # dense: 2 blocks x 4 steps
    assert dit.flops > 4 * 2 * block + dit.attention_flops  # + embeddings and the conditioning
    assert dit.flops < 1.05 * (4 * 2 * block + dit.attention_flops)
    live = _live_pairs(9, 1)
    assert sr.attention_flops == 4 * live * 240 * 240 * 64 * 2  # only the live frame pairs
    assert sr.tokens == 9 * 240 and vae.attention_flops == 0
    assert dit.weight_bytes_per_chip > 4 * 2 * param_counts(c)["dit"] * 0.99  # every weight, every step


@pytest.mark.parametrize("pipeline", ["avatar-720p", "avatar-1080p"])
def test_production_shapes_keep_the_write_ups_constraints_and_can_meet_the_deadline(pipeline):
    """The claims of docs/concepts/production-shapes.md, per shape bucket at the v6e-8's published peaks."""
    for r in report_for_pipeline(pipeline, "tpu-v6e-8"):
        assert sum(r.params.values()) > 18e9  # "more than 18B parameters"
        assert r.transformer_bf16_bytes > 36e9  # "more than 36 GB of bf16 weights"
        assert r.transformer_bf16_bytes > 32 * GIB  # replicated, the weights alone overflow a chip: FSDP
        assert r.sr_tokens >= 20_000 and r.sr_window >= 1  # tens of thousands of tokens, nearby frames
        assert r.deadline_seconds == pytest.approx(r.frames / 25)
        for s in r.stages:  # no stage's floor alone comes near the deadline
            assert s.floor_seconds < 0.5 * r.deadline_seconds, (r.frames, s.stage, s.floor_seconds)
        # Every stage at its floor leaves 40% of the deadline for kernels below peak.
        assert r.floor_seconds <= 0.6 * r.deadline_seconds, (r.frames, r.floor_seconds)


def test_gathers_bring_in_the_other_chips_shards_once_per_pass():
    c = get_config("tiny")
    dit, sr, _ = shape_report(c, 8, PEAK, BW).stages
    assert dit.gather_bytes_per_chip == pytest.approx(dit.weight_bytes_per_chip * 7 / 8)
    assert dit.gather_seconds == pytest.approx(dit.gather_bytes_per_chip / 400e9)
    assert dit.passes == c.dit.steps and sr.passes == 1  # the DiT gathers its weights once per step


def test_720p_meets_its_deadline_even_counting_the_weight_gathers():
    """docs/concepts/production-shapes.md section 5; 1080p in 8-frame chunks does not (section 6)."""
    (r,) = report_for_pipeline("avatar-720p")
    assert r.floor_with_gathers_seconds <= 0.6 * r.deadline_seconds
