"""Cutting an audio track into whole chunks (torch-free: the runtime loader streams with it).

A track of n samples drives ceil(n / samples_per_frame) frames: a partial last frame still gets a
picture. The last chunk is padded with silence to a whole chunk (one compiled shape serves every
chunk) and the frames past the end are trimmed after rendering.
"""

from __future__ import annotations

import numpy as np

from model.config import PipelineConfig


def num_frames(config: PipelineConfig, n_samples: int) -> int:
    """Frames delivered for an audio track of n_samples samples."""
    return -(-n_samples // config.samples_per_frame)


def num_chunks(config: PipelineConfig, n_samples: int) -> int:
    """Chunks rendered for an audio track of n_samples samples."""
    return -(-num_frames(config, n_samples) // config.frames_per_chunk)


def audio_chunks(config: PipelineConfig, audio: np.ndarray) -> np.ndarray:
    """(n_chunks, chunk_samples) float32: the track, zero-padded to whole chunks."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio must be a mono waveform of shape (n,), got shape {audio.shape}")
    n = num_chunks(config, audio.shape[0])
    padded = np.zeros(n * config.chunk_samples(), dtype=np.float32)
    padded[: audio.shape[0]] = audio
    return padded.reshape(n, config.chunk_samples())
