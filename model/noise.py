"""The sampler's starting noise for each chunk (torch-free: the runtime loader calls it too).

Noise is an input of the compiled DiT, not drawn inside it, so one (seed, chunk) always feeds the
same numbers to every build on every backend: a bit-exact gate compares programs, not RNGs.
"""

from __future__ import annotations

import numpy as np

from model.config import PipelineConfig


def chunk_noise(config: PipelineConfig, seed: int, chunk_index: int, frames: int | None = None) -> np.ndarray:
    """Standard normal noise (frames, C, h, w) float32, a pure function of (seed, chunk_index).

    Seeding with the pair (not seed + chunk_index) keeps streams of neighbouring seeds disjoint.
    """
    if seed < 0 or chunk_index < 0:
        raise ValueError(f"seed and chunk_index must be >= 0, got seed={seed}, chunk_index={chunk_index}")
    frames = config.frames_per_chunk if frames is None else frames
    h, w = config.dit_grid
    rng = np.random.default_rng([seed, chunk_index])
    return rng.standard_normal((frames, config.latent_channels, h, w), dtype=np.float32)
