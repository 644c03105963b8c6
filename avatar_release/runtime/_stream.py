"""Streaming: drive a loaded build chunk by chunk, each chunk timed against its deadline.

Host-side work is numpy only: the request's inputs as the build's program declares them (picture,
text, tensors: checked once, placed once), the audio feed (``_feed``: pieces of a track in, one
chunk's samples out; a build without audio is fed a number of frames), noise from the build's
recorded recipe, frame times, and device_put of the inputs with the shardings the executables
were compiled for. Nothing on this path traces or compiles; the
guard proves it. The audio may be one array or an iterable of pieces (a decoder's output):
:func:`stream` then holds one chunk of samples and one chunk of frames at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._dtypes import np_dtype
from ..errors import InputError, RecompileError
from ._feed import ChunkAudio, feed_chunks, feed_frames, plan_chunks
from ._guard import CompileGuard
from ._load import LoadedBuild, LoadedStage

__all__ = ["Chunk", "ChunkTiming", "StreamReport", "plan_chunks", "chunk_noise", "request_values", "stream", "render"]


@dataclass
class Chunk:
    index: int
    bucket: str
    # What the chunk delivers, trimmed to the request: video (n, H, W, 3) uint8, audio
    # (n * samples_per_frame,) float32, or the first delivered tensor (whole; all in ``outputs``).
    frames: np.ndarray
    first_frame: int
    seconds: float  # render time of this chunk
    deadline: float  # its playback duration: frames / fps
    compiles: int  # compile events seen while rendering it (0 when healthy)
    n_frames: int = -1  # frames delivered (-1: ``frames.shape[0]``, a video's)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # every delivered output, by name

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
    def of(cls, c: Chunk) -> ChunkTiming:
        n = c.n_frames if c.n_frames >= 0 else int(c.frames.shape[0])
        return cls(c.index, c.bucket, n, c.first_frame, c.seconds, c.deadline, c.compiles)


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
                {
                    "index": c.index,
                    "bucket": c.bucket,
                    "frames": c.n_frames,
                    "seconds": round(c.seconds, 4),
                    "deadline": round(c.deadline, 4),
                    "missed": c.missed,
                    "compiles": c.compiles,
                }
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


def _text_bytes(value: object, size: int, where: str) -> np.ndarray:
    data = (
        value.encode("utf-8")
        if isinstance(value, str)
        else bytes(value)
        if isinstance(value, (bytes, bytearray))
        else None
    )
    if data is None:
        raise InputError(f"{where}: expected a str (UTF-8 text), got {type(value).__name__}")
    if len(data) > size:
        raise InputError(f"{where}: {len(data)} bytes of UTF-8; the build takes at most {size}; shorten the text")
    out = np.zeros(size, np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


def request_values(
    build: LoadedBuild, image: np.ndarray | None = None, values: Mapping[str, object] | None = None
) -> dict[str, np.ndarray]:
    """The request's whole-request inputs (image, text, tensor) by input name, checked against the
    build's declaration: a required one missing, a shape or dtype other than declared, or a value
    for no declared input is an InputError naming the input, expected and got. An optional input
    left out is zeros of its shape."""
    prog, given = build.manifest.program, dict(values or {})
    declared = {i.name: i for i in prog.request_inputs()}
    unknown = sorted(n for n in given if n not in declared or declared[n].kind in ("audio", "noise", "time"))
    if unknown:
        takes = [f"{i.name} ({i.kind})" for i in declared.values() if i.kind not in ("audio", "noise", "time")]
        raise InputError(
            f"build {build.build_id} declares no input {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(takes) or 'no image, text or tensor input'}"
        )
    if image is not None and prog.input_of("image") is None:
        raise InputError(f"image: build {build.build_id} declares no image input; send none")
    out: dict[str, np.ndarray] = {}
    for i in declared.values():
        if i.kind in ("audio", "noise", "time"):
            continue
        value = image if i.kind == "image" and i.name not in given else given.get(i.name)
        where = f"{i.kind} input {i.name!r}" if i.kind != "image" else "image"
        if value is None:
            if i.required:
                raise InputError(
                    f"{where}: build {build.build_id} requires it ({tuple(i.shape)} {i.dtype}); none given"
                )
            out[i.name] = np.zeros(i.shape, np_dtype(i.dtype))
        elif i.kind == "text":
            out[i.name] = _text_bytes(value, i.shape[0], where)
        else:
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            if arr.shape != tuple(i.shape) or arr.dtype != np_dtype(i.dtype):
                got = f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}"
                raise InputError(f"{where}: expected {i.dtype} {tuple(i.shape)} for build {build.build_id}, got {got}")
            out[i.name] = arr
    return out


def _check_audio(build: LoadedBuild, audio: object) -> None:
    """An array is checked whole, here; the pieces of an iterable as the feed reads them."""
    p = build.manifest.program
    if p.input_of("audio") is None:
        raise InputError(
            f"audio: build {build.build_id} declares no audio input; send the number of frames (seconds) instead"
        )
    if isinstance(audio, np.ndarray):
        if audio.ndim != 1 or audio.size == 0:
            raise InputError(
                f"audio: expected a non-empty mono float32 waveform at {p.sample_rate} Hz, got shape {audio.shape}"
            )
    elif not isinstance(audio, Iterable):
        raise InputError(
            f"audio: expected a mono float32 waveform at {p.sample_rate} Hz (an array, or an "
            f"iterable of 1-D pieces), got {type(audio).__name__}"
        )


class _Sources:
    """Where each stage input comes from: the request's whole-request inputs (placed once), the
    chunk's audio and noise, an earlier stage's output, or the carried state (zeros on the first chunk)."""

    def __init__(self, build: LoadedBuild, values: dict[str, np.ndarray], seed: int):
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
        import jax

        self.jax, self.build, self.values, self.seed = jax, build, values, seed
        self.placed: dict[str, Any] = {}
        prog = build.manifest.program
        audio, noise, times = prog.input_of("audio"), prog.input_of("noise"), prog.input_of("time")
        self.audio_name = audio.name if audio else None
        self.noise_name = noise.name if noise else None
        self.time_name = times.name if times else None

    def args(self, stage: str, ls: LoadedStage, env: dict[str, object], fed: ChunkAudio) -> list[object]:
        prog, put = self.build.manifest.program, self.jax.device_put
        args: list[object] = []
        for spec, sharding in zip(ls.entry.inputs, ls.input_shardings):
            if spec.name in self.values:
                if spec.name not in self.placed:
                    self.placed[spec.name] = put(self.values[spec.name], sharding)
                value = self.placed[spec.name]
            elif spec.name == self.audio_name:
                chunk_audio = fed.audio if fed.audio.size else np.zeros(tuple(spec.shape), np.float32)  # silence
                value = put(chunk_audio, sharding)
            elif spec.name == self.noise_name:
                value = put(chunk_noise(self.seed, fed.index, tuple(spec.shape), prog.noise_recipe), sharding)
            elif spec.name == self.time_name:  # each frame's time from the request's start
                value = put(((fed.first_frame + np.arange(fed.frames)) / prog.fps).astype(np.float32), sharding)
            elif spec.name in env:
                value = env[spec.name]
            elif spec.name in prog.carry:  # first chunk: the carried state starts at zeros
                value = put(np.zeros(spec.shape, np_dtype(spec.dtype)), sharding)
            else:
                raise InputError(f"build {self.build.build_id}: stage {stage} input {spec.name!r} has no source")
            args.append(value)
        return args


def _run_stage(
    build: LoadedBuild,
    guard: CompileGuard,
    sources: _Sources,
    stage: str,
    bucket: str,
    env: dict[str, object],
    fed: ChunkAudio,
) -> None:
    """One stage call of a chunk, its outputs into ``env``; a compile during it is refused (strict)."""
    ls = build.stages[(stage, bucket)]
    args = sources.args(stage, ls, env, fed)
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


def _delivered(build: LoadedBuild, env: dict[str, object], fed: ChunkAudio) -> dict[str, np.ndarray]:
    """The chunk's delivered outputs, trimmed to the request: video to its frames, audio to its samples."""
    prog = build.manifest.program
    d = prog.delivery()
    out = {name: np.asarray(env[name]) for name in d.outputs}
    if d.kind == "video":
        out = {name: a[: fed.deliver] for name, a in out.items()}
    elif d.kind == "audio":
        out = {name: a[: fed.deliver * d.samples_per_frame] for name, a in out.items()}
    return out


def _fed_chunks(
    build: LoadedBuild, audio: np.ndarray | Iterable[np.ndarray] | None, frames: int | None
) -> Iterator[ChunkAudio]:
    """The request's chunks: fed by its audio (checked first; required where the build's audio input
    is), else ``frames`` long without audio."""
    declared = build.manifest.program.input_of("audio")
    if audio is None and declared is not None and declared.required:
        raise InputError(
            f"audio: build {build.build_id} requires its audio input {declared.name!r} (mono float32 "
            f"at {declared.sample_rate} Hz); none given"
        )
    if audio is not None:
        _check_audio(build, audio)
        return feed_chunks(build.manifest, audio)
    if frames is None:
        raise InputError(f"build {build.build_id}: no audio drives this request; give the number of frames")
    return feed_frames(build.manifest, frames)


def stream(
    build: LoadedBuild,
    image: np.ndarray | None = None,
    audio: np.ndarray | Iterable[np.ndarray] | None = None,
    *,
    seed: int = 0,
    frames: int | None = None,
    values: Mapping[str, object] | None = None,
) -> Iterator[Chunk]:
    """Yield each chunk's delivered output (uint8 frames of a video) as it completes.

    The request's inputs, as the build's program declares them: ``image`` (uint8 H x W x 3, for a
    build with an image input), ``audio`` (mono float samples at the build's rate, one array or an
    iterable of 1-D pieces of any size, read as the chunks need them, so a decoder's refusal
    surfaces from here), ``values`` (text and tensor inputs by name; an image by name too) and
    ``seed`` (the noise's). ``frames``: the request's length when no audio drives it.
    """
    prog = build.manifest.program
    given = request_values(build, image, values)
    chunks = _fed_chunks(build, audio, frames)
    sources = _Sources(build, given, seed)
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
                _run_stage(build, guard, sources, stage, fed.bucket, env, fed)
            outputs = _delivered(build, env, fed)
            state = {k: env[v] for k, v in prog.carry.items()}
            guard.context = "between stage calls"
            seconds = time.perf_counter() - t0
            if guard.strict and guard.count > before:
                raise RecompileError(
                    f"zero-compile guard: XLA compiled while serving chunk {fed.index} of build {build.build_id}",
                    guard.events[before:],
                )
            yield Chunk(
                fed.index,
                fed.bucket,
                next(iter(outputs.values())),
                fed.first_frame,
                seconds,
                fed.deliver / prog.fps,
                guard.count - before,
                fed.deliver,
                outputs,
            )
    finally:
        guard.context = "outside any stage call"
        guard.stop()


def render(
    build: LoadedBuild,
    image: np.ndarray | None = None,
    audio: np.ndarray | Iterable[np.ndarray] | None = None,
    *,
    seed: int = 0,
    on_chunk: Callable[[Chunk], None] | None = None,
    frames: int | None = None,
    values: Mapping[str, object] | None = None,
) -> tuple[np.ndarray, StreamReport]:
    """Render a whole request into one array of frames (gates, tests); ``on_chunk`` sees each chunk
    as it completes. A long render goes to a file chunk by chunk instead
    (``avatar_release.serving.render_to_files``)."""
    report, parts = StreamReport(), []
    for chunk in stream(build, image, audio, seed=seed, frames=frames, values=values):
        report.add(chunk)
        parts.append(chunk.frames)
        if on_chunk is not None:
            on_chunk(chunk)
    return np.concatenate(parts, axis=0), report
