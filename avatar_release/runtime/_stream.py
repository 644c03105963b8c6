"""Streaming: drive a loaded build chunk by chunk, each chunk timed against its deadline.

Host-side work is numpy only: the audio feed (``_feed``: pieces of a track in, one chunk's
samples out), noise from the build's recorded recipe, and device_put of the inputs with the
shardings the executables were compiled for. Nothing on this path traces or compiles; the
guard proves it. The audio may be one array or an iterable of pieces (a decoder's output):
:func:`stream` then holds one chunk of samples and one chunk of frames at a time.
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .._dtypes import np_dtype
from ..errors import InputError, RecompileError
from ._feed import feed_chunks, plan_chunks
from ._guard import CompileGuard
from ._load import LoadedBuild, LoadedStage

__all__ = ["Chunk", "ChunkTiming", "StreamReport", "plan_chunks", "chunk_noise", "stream", "render"]


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


@dataclass(frozen=True, slots=True)
class ChunkTiming:
    """A chunk without its frames: what a report keeps (about 100 bytes, so the report of a long
    render stays small while its frames go to the encoder and are dropped)."""

    index: int
    bucket: str
    n_frames: int
    first_frame: int
    seconds: float
    deadline: float
    compiles: int

    @property
    def missed(self) -> bool:
        return self.seconds > self.deadline

    @classmethod
    def of(cls, c: Chunk) -> "ChunkTiming":
        return cls(c.index, c.bucket, int(c.frames.shape[0]), c.first_frame, c.seconds, c.deadline, c.compiles)


@dataclass
class StreamReport:
    chunks: list[ChunkTiming] = field(default_factory=list)

    def add(self, chunk: Chunk) -> ChunkTiming:
        """Keep ``chunk``'s timing (not its frames)."""
        timing = ChunkTiming.of(chunk)
        self.chunks.append(timing)
        return timing

    @property
    def frames(self) -> int:
        return sum(c.n_frames for c in self.chunks)

    @property
    def misses(self) -> int:
        return sum(c.missed for c in self.chunks)

    def to_json(self) -> dict:
        return {
            "chunks": len(self.chunks),
            "frames": self.frames,
            "deadline_misses": self.misses,
            "per_chunk": [
                {"index": c.index, "bucket": c.bucket, "frames": c.n_frames,
                 "seconds": round(c.seconds, 4), "deadline": round(c.deadline, 4),
                 "missed": c.missed, "compiles": c.compiles}
                for c in self.chunks
            ],
        }


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


def _check_image(build: LoadedBuild, image: np.ndarray) -> None:
    p = build.manifest.program
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != (p.height, p.width, 3):
        got = f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
        raise InputError(
            f"image: expected uint8 ({p.height}, {p.width}, 3) for build {build.build_id}, got {got}"
        )


def _check_audio(build: LoadedBuild, audio: object) -> None:
    """An array is checked whole, here; the pieces of an iterable as the feed reads them."""
    p = build.manifest.program
    if isinstance(audio, np.ndarray):
        if audio.ndim != 1 or audio.size == 0:
            raise InputError(f"audio: expected a non-empty mono float32 waveform at {p.sample_rate} Hz, "
                             f"got shape {audio.shape}")
    elif not isinstance(audio, Iterable):
        raise InputError(f"audio: expected a mono float32 waveform at {p.sample_rate} Hz (an array, or an "
                         f"iterable of 1-D pieces), got {type(audio).__name__}")


class _Sources:
    """Where each stage input comes from: the picture (placed once), the chunk's audio and noise,
    an earlier stage's output, or the carried state (zeros on the first chunk)."""

    def __init__(self, build: LoadedBuild, image: np.ndarray, seed: int):
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
        import jax

        self.jax, self.build, self.image, self.seed = jax, build, image, seed
        self.image_dev: Any = None

    def args(self, stage: str, ls: LoadedStage, env: dict[str, object], index: int, chunk_audio: np.ndarray) -> list[object]:
        prog, put = self.build.manifest.program, self.jax.device_put
        args: list[object] = []
        for spec, sharding in zip(ls.entry.inputs, ls.input_shardings):
            if spec.name == prog.image_input:
                if self.image_dev is None:
                    self.image_dev = put(self.image, sharding)
                value = self.image_dev
            elif spec.name == prog.audio_input:
                value = put(chunk_audio, sharding)
            elif spec.name == prog.noise_input:
                value = put(chunk_noise(self.seed, index, tuple(spec.shape), prog.noise_recipe), sharding)
            elif spec.name in env:
                value = env[spec.name]
            elif spec.name in prog.carry:  # first chunk: the carried state starts at zeros
                value = put(np.zeros(spec.shape, np_dtype(spec.dtype)), sharding)
            else:
                raise InputError(f"build {self.build.build_id}: stage {stage} input {spec.name!r} has no source")
            args.append(value)
        return args


def _run_stage(build: LoadedBuild, guard: CompileGuard, sources: _Sources, stage: str, bucket: str,
               env: dict[str, object], index: int, chunk_audio: np.ndarray) -> None:
    """One stage call of a chunk, its outputs into ``env``; a compile during it is refused (strict)."""
    ls = build.stages[(stage, bucket)]
    args = sources.args(stage, ls, env, index, chunk_audio)
    shapes = ", ".join(f"{s.name}{tuple(s.shape)}:{s.dtype}" for s in ls.entry.inputs)
    guard.context = f"stage {stage}/{bucket} (inputs {shapes})"
    stage_before = guard.count
    if ls.tuned_at_first_run and not ls.ran:  # XLA chooses code in this run: a compile JAX does not report
        guard.record_first_run_tuning(ls.tuned_at_first_run)
    ls.ran = True
    outs = ls.executable(ls.params, *args)
    for spec, value in zip(ls.entry.outputs, outs):
        env[spec.name] = value
    if guard.strict and guard.count > stage_before:
        raise RecompileError(
            f"zero-compile guard: XLA compiled while serving stage {stage}/{bucket} "
            f"of build {build.build_id} (inputs {shapes}); a loaded build must never compile",
            guard.events[stage_before:],
        )


def stream(build: LoadedBuild, image: np.ndarray, audio: np.ndarray | Iterable[np.ndarray], *,
           seed: int = 0) -> Iterator[Chunk]:
    """Yield chunks of uint8 frames as each completes.

    ``audio``: mono float samples at the build's rate, one array or an iterable of 1-D pieces of
    any size, read as the chunks need them (so a decoder's refusal surfaces from here).
    """
    _check_image(build, image)
    _check_audio(build, audio)
    prog = build.manifest.program
    sources = _Sources(build, image, seed)
    chunks = feed_chunks(build.manifest, audio)
    guard = build.guard.start()
    try:
        state: dict[str, object] = {}
        while True:
            guard.context = "reading audio"
            fed = next(chunks, None)  # the decoder's time is not the chunk's render time
            if fed is None:
                break
            t0 = time.perf_counter()
            before = guard.count
            env: dict[str, object] = dict(state)
            for stage in prog.stages:
                _run_stage(build, guard, sources, stage, fed.bucket, env, fed.index, fed.audio)
            frames_u8 = np.asarray(env[prog.deliver])[:fed.deliver]
            state = {k: env[v] for k, v in prog.carry.items()}
            guard.context = "between stage calls"
            seconds = time.perf_counter() - t0
            if guard.strict and guard.count > before:
                raise RecompileError(
                    f"zero-compile guard: XLA compiled while serving chunk {fed.index} of build {build.build_id}",
                    guard.events[before:],
                )
            yield Chunk(fed.index, fed.bucket, frames_u8, fed.first_frame, seconds, fed.deliver / prog.fps,
                        guard.count - before)
    finally:
        guard.context = "outside any stage call"
        guard.stop()


def render(build: LoadedBuild, image: np.ndarray, audio: np.ndarray | Iterable[np.ndarray], *, seed: int = 0,
           on_chunk: Callable[[Chunk], None] | None = None) -> tuple[np.ndarray, StreamReport]:
    """Render a whole request into one array of frames (gates, tests); ``on_chunk`` sees each chunk
    as it completes. A long render goes to a file chunk by chunk instead
    (``avatar_release.serving.render_to_files``)."""
    report, frames = StreamReport(), []
    for chunk in stream(build, image, audio, seed=seed):
        report.add(chunk)
        frames.append(chunk.frames)
        if on_chunk is not None:
            on_chunk(chunk)
    return np.concatenate(frames, axis=0), report
