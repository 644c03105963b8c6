"""Config arithmetic and constraints. Production configs are checked as numbers only."""

import subprocess
import sys
from pathlib import Path

import pytest

from model.config import CONFIG_NAMES, PipelineConfig, get_config
from model.errors import ConfigError


def test_known_configs():
    assert set(CONFIG_NAMES) == {"tiny", "small", "avatar-720p", "avatar-1080p"}
    with pytest.raises(ConfigError, match=r"unknown pipeline config 'huge'; known: tiny, small"):
        get_config("huge")


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_sr_tokens_are_16_aligned_but_not_128_aligned(name):
    c = get_config(name)
    assert c.sr_tokens_per_frame % 16 == 0
    assert c.sr_tokens_per_frame % 128 != 0  # the misalignment the frame-aligned kernel removes
    assert c.dit_sequence() % 8 == 0 and c.sr_sequence() % 8 == 0
    assert c.dit.heads % 8 == 0 and c.sr.heads % 8 == 0
    assert c.samples_per_frame * c.fps == c.sample_rate


def test_tiny_geometry():
    c = get_config("tiny")
    assert c.samples_per_frame == 640
    assert c.sr_grid == (12, 20) and c.sr_tokens_per_frame == 240
    assert c.dit_grid == (6, 10) and c.dit_tokens_per_frame == 60
    assert c.dit_sequence() == 480 and c.sr_sequence() == 9 * 240
    assert c.decoded_size == (48, 80)
    assert c.chunk_samples() == 8 * 640 and c.chunk_samples(3) == 3 * 640


@pytest.mark.parametrize(
    "name, sr_grid, decoded, sr_tokens, dit_tokens",
    [
        ("small", (24, 40), (96, 160), 960, 240),
        ("avatar-720p", (92, 160), (736, 1280), 3680, 920),
        ("avatar-1080p", (136, 240), (1088, 1920), 8160, 510),  # the SR upsamples the DiT 4x
    ],
)
def test_larger_geometry(name, sr_grid, decoded, sr_tokens, dit_tokens):
    c = get_config(name)
    assert (c.sr_grid, c.decoded_size) == (sr_grid, decoded)
    assert (c.sr_tokens_per_frame, c.dit_tokens_per_frame) == (sr_tokens, dit_tokens)
    # The VAE output covers the video and is cropped by less than one patch-aligned step.
    assert 0 <= decoded[0] - c.height < c.vae_scale * 4 and 0 <= decoded[1] - c.width < c.vae_scale * 4


@pytest.mark.extra("compile")  # torch, for the meta device
def test_production_configs_are_production_sized():
    """About 18.5B parameters, counted on the meta device (no weights allocated)."""
    import torch

    from model.pipeline import AvatarPipeline

    for name in ("avatar-720p", "avatar-1080p"):
        with torch.device("meta"):
            p = AvatarPipeline(get_config(name))
        n = sum(t.numel() for t in p.parameters())
        assert 18e9 < n < 25e9, (name, n)
        assert all(t.is_meta for t in p.parameters())


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"sr.heads": 12}, r"sr.heads \(12\) must be a multiple of 8"),
        ({"dit.heads": 4}, r"dit.heads \(4\) must be a multiple of 8"),
        ({"width": 88}, r"SR tokens per frame \(264\) must be a multiple of 16"),  # 12 x 22 cells
        ({"width": 128}, r"SR tokens per frame \(384\) must not be a multiple of 128"),
        ({"fps": 24}, r"fps \(24\) must divide sample_rate \(16000\)"),
        ({"vae_scale": 8}, r"vae.channels needs log2\(vae_scale\) \+ 1 = 4 entries"),
        ({"residual_dtype": "float16"}, r"residual_dtype must be one of"),
        ({"sr.wndow": 2}, r"bad override"),
    ],
)
def test_violations_raise_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        get_config("tiny").replace(**overrides)
    assert isinstance(info.value, ValueError)
    assert "config 'tiny'" in str(info.value)


def test_dit_sequence_must_split_over_the_mesh():
    # 3 frames x 60 DiT tokens = 180 tokens: not a multiple of 8.
    with pytest.raises(ConfigError, match=r"DiT sequence 3 frames x 60 tokens = 180 must be a multiple of 8"):
        get_config("tiny").replace(frames_per_chunk=3)


def test_replace_and_round_trip():
    c = get_config("tiny").replace(**{"sr.window": 2, "residual_dtype": "bfloat16"})
    assert c.sr.window == 2 and c.residual_dtype == "bfloat16" and c.dit == get_config("tiny").dit
    assert PipelineConfig.from_dict(c.to_dict()) == c
    assert get_config("tiny").sr.window == 1  # configs are frozen values


def test_config_module_imports_no_torch():
    code = "import model, model.config, model.noise, model.chunks, model.errors, sys; print('torch' in sys.modules)"
    repo = Path(__file__).resolve().parents[2]  # python -c puts the cwd on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert out.stdout.strip() == "False"
