"""Shared tiny-pipeline fixtures: built once per session, since an eager chunk costs ~2 s on 2 cores.

torch (the ``[compile]`` extra) is imported only by the fixtures that need it, so the config
tests run without it; the modules that import torch skip themselves through ``tests.tools.module``.
"""

import numpy as np
import pytest

from model.config import get_config
from model.noise import chunk_noise
from tests.tools import module

SEED = 1234


@pytest.fixture(scope="session")
def tiny():
    return get_config("tiny")


@pytest.fixture(scope="session")
def tiny_pipeline(tiny):
    module("torch")
    from model.weights import init_pipeline

    return init_pipeline(tiny, SEED)


@pytest.fixture(scope="session")
def tiny_image(tiny):
    """A smooth picture (gradients + a disc), so 'looks like the photo' is measurable."""
    y, x = np.mgrid[0 : tiny.height, 0 : tiny.width]
    disc = ((y - tiny.height / 2) ** 2 + (x - tiny.width / 2) ** 2) < (tiny.height / 3) ** 2
    img = np.stack([x * 255 / tiny.width, y * 255 / tiny.height, 200 * disc + 30], axis=-1)
    return img.astype(np.uint8)  # (H, W, 3)


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    """A deterministic waveform in [-1, 1] with a changing pitch and loudness."""
    t = np.arange(n) / 16000.0
    rng = np.random.default_rng(seed)
    wave = (
        0.4 * np.sin(2 * np.pi * (150 + 80 * np.sin(2 * np.pi * 3 * t)) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t))
    )
    return np.clip(wave + 0.02 * rng.standard_normal(n), -1, 1).astype(np.float32)


@pytest.fixture(scope="session")
def seed():
    return SEED


@pytest.fixture(scope="session")
def make_speech():
    return speech_like


@pytest.fixture(scope="session")
def tiny_chunk_inputs(tiny, tiny_image):
    """(image, audio, prev_latent, noise) of chunk 0 as numpy arrays."""
    audio = speech_like(tiny.chunk_samples())
    prev = np.zeros((tiny.latent_channels, *tiny.dit_grid), np.float32)
    return tiny_image, audio, prev, chunk_noise(tiny, SEED, 0)


@pytest.fixture(scope="session")
def tiny_eager_stages(tiny_pipeline, tiny_chunk_inputs):
    """Eager outputs of each stage for chunk 0: dict stage -> tuple of numpy arrays."""
    torch = module("torch")
    image, audio, prev, noise = (torch.from_numpy(a) for a in tiny_chunk_inputs)
    with torch.no_grad():
        latents, last = tiny_pipeline.dit(image, audio, prev, noise)
        sr = tiny_pipeline.sr(latents, image)
        frames = tiny_pipeline.vae(sr, image)
    return {
        "dit": (latents.numpy(), last.numpy()),
        "sr": (sr.numpy(),),
        "vae": (frames.numpy(),),
    }
