"""Streaming: drive a loaded build chunk by chunk, each chunk timed against its deadline.

Host-side work is numpy only: audio slicing, noise from the build's recorded recipe, and
device_put of the inputs with the shardings the executables were compiled for. Nothing on
this path traces or compiles; the guard proves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .._dtypes import np_dtype
from ..errors import InputError, RecompileError
from ..records import Manifest
from ._load import LoadedBuild

__all__ = ["Chunk", "StreamReport", "plan_chunks", "chunk_noise", "stream", "render"]


@dataclass
class Chunk:
    index: int
    bucket: str
    frames: np.ndarray  # (n, H, W, 3) uint8, trimmed to the audio
    first_frame: int
    seconds: float  # render time of this chunk
    deadline: float  # its playback duration: frames / fps
    compiles: int  # compile events seen while rendering it (0 when healthy)

    @property
    def missed(self) -> bool:
        return self.seconds > self.deadline


@dataclass
class StreamReport:
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def frames(self) -> int:
        return sum(c.frames.shape[0] for c in self.chunks)

    @property
    def misses(self) -> int:
        return sum(c.missed for c in self.chunks)

    def to_json(self) -> dict:
        return {
            "chunks": len(self.chunks),
            "frames": self.frames,
            "deadline_misses": self.misses,
            "per_chunk": [
                {"index": c.index, "bucket": c.bucket, "frames": int(c.frames.shape[0]),
                 "seconds": round(c.seconds, 4), "deadline": round(c.deadline, 4),
                 "missed": c.missed, "compiles": c.compiles}
                for c in self.chunks
            ],
        }


def plan_chunks(manifest: Manifest, n_frames: int) -> list[tuple[str, int, int]]:
    """Cover ``n_frames`` with buckets: (bucket, frames it renders, frames it delivers).

    Each chunk uses the largest bucket that fits the frames left; a tail shorter than the
    smallest bucket is rendered at that bucket, padded with silence, and trimmed.
    """
    buckets = sorted(manifest.buckets, key=lambda b: -b.frames)
    plan, left = [], n_frames
    while left > 0:
        fit = [b for b in buckets if b.frames <= left]
        b = fit[0] if fit else buckets[-1]
        plan.append((b.name, b.frames, min(b.frames, left)))
        left -= b.frames
    return plan


SEEDED_NOISE = "numpy-pcg64-standard-normal/v1"
ENTROPY_NOISE = "os-entropy-standard-normal/v1"


def chunk_noise(seed: int, chunk_index: int, shape: tuple[int, ...], recipe: str = SEEDED_NOISE) -> np.ndarray:
    """The chunk's noise by the recipe the manifest records.

    ``numpy-pcg64-standard-normal/v1``: PCG64 seeded with (request seed, chunk index).
    ``os-entropy-standard-normal/v1``: fresh OS entropy; the seed is ignored.
    """
    if recipe == SEEDED_NOISE:
        rng = np.random.default_rng([seed, chunk_index])
    elif recipe == ENTROPY_NOISE:
        rng = np.random.default_rng()
    else:
        raise InputError(f"unknown noise recipe {recipe!r}; this runtime knows {SEEDED_NOISE}, {ENTROPY_NOISE}")
    return rng.standard_normal(shape, dtype=np.float32)


def _check_inputs(build: LoadedBuild, image: np.ndarray, audio: np.ndarray) -> None:
    p = build.manifest.program
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != (p.height, p.width, 3):
        got = f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
        raise InputError(
            f"image: expected uint8 ({p.height}, {p.width}, 3) for build {build.build_id}, got {got}"
        )
    if not isinstance(audio, np.ndarray) or audio.ndim != 1 or audio.size == 0:
        raise InputError(f"audio: expected a non-empty mono float32 waveform at {p.sample_rate} Hz, "
                         f"got shape {getattr(audio, 'shape', None)}")


def stream(build: LoadedBuild, image: np.ndarray, audio: np.ndarray, *, seed: int = 0) -> Iterator[Chunk]:
    """Yield chunks of uint8 frames as each completes."""
    import jax

    _check_inputs(build, image, audio)
    m, prog = build.manifest, build.manifest.program
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    n_frames = -(-audio.shape[0] // prog.samples_per_frame)
    plan = plan_chunks(m, n_frames)
    guard = build.guard.start()
    try:
        image_dev = None
        state: dict[str, object] = {}
        first = 0
        for index, (bucket, frames, deliver) in enumerate(plan):
            t0 = time.perf_counter()
            before = guard.count
            env: dict[str, object] = dict(state)
            lo = first * prog.samples_per_frame
            chunk_audio = np.zeros(frames * prog.samples_per_frame, np.float32)
            piece = audio[lo : lo + chunk_audio.shape[0]]
            chunk_audio[: piece.shape[0]] = piece
            for stage in prog.stages:
                ls = build.stages[(stage, bucket)]
                args = []
                for spec, sharding in zip(ls.entry.inputs, ls.input_shardings):
                    if spec.name == prog.image_input:
                        if image_dev is None:
                            image_dev = jax.device_put(image, sharding)
                        value = image_dev
                    elif spec.name == prog.audio_input:
                        value = jax.device_put(chunk_audio, sharding)
                    elif spec.name == prog.noise_input:
                        value = jax.device_put(chunk_noise(seed, index, tuple(spec.shape), prog.noise_recipe), sharding)
                    elif spec.name in env:
                        value = env[spec.name]
                    elif spec.name in prog.carry:  # first chunk: the carried state starts at zeros
                        value = jax.device_put(np.zeros(spec.shape, np_dtype(spec.dtype)), sharding)
                    else:
                        raise InputError(f"build {build.build_id}: stage {stage} input {spec.name!r} has no source")
                    args.append(value)
                shapes = ", ".join(f"{s.name}{tuple(s.shape)}:{s.dtype}" for s in ls.entry.inputs)
                guard.context = f"stage {stage}/{bucket} (inputs {shapes})"
                stage_before = guard.count
                outs = ls.executable(ls.params, *args)
                for spec, value in zip(ls.entry.outputs, outs):
                    env[spec.name] = value
                if guard.strict and guard.count > stage_before:
                    raise RecompileError(
                        f"zero-compile guard: XLA compiled while serving stage {stage}/{bucket} "
                        f"of build {build.build_id} (inputs {shapes}); a loaded build must never compile",
                        guard.events[stage_before:],
                    )
            frames_u8 = np.asarray(env[prog.deliver])[:deliver]
            state = {k: env[v] for k, v in prog.carry.items()}
            guard.context = "between stage calls"
            seconds = time.perf_counter() - t0
            if guard.strict and guard.count > before:
                raise RecompileError(
                    f"zero-compile guard: XLA compiled while serving chunk {index} of build {build.build_id}",
                    guard.events[before:],
                )
            yield Chunk(index, bucket, frames_u8, first, seconds, deliver / prog.fps, guard.count - before)
            first += frames
    finally:
        guard.context = "outside any stage call"
        guard.stop()


def render(build: LoadedBuild, image: np.ndarray, audio: np.ndarray, *, seed: int = 0,
           on_chunk: Callable[[Chunk], None] | None = None) -> tuple[np.ndarray, StreamReport]:
    """Render the whole request; ``on_chunk`` sees each chunk as it completes (CLI progress)."""
    report = StreamReport()
    for chunk in stream(build, image, audio, seed=seed):
        report.chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(chunk)
    frames = np.concatenate([c.frames for c in report.chunks], axis=0)
    return frames, report
