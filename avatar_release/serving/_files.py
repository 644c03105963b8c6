"""``avatar-release render``: load a build as a serving pod would, stream it, write files.

Reports the cold start piece by piece (imports, resolve, verify, decompress, deserialize,
first chunk), every chunk against its playback deadline, and how the inputs were read (the
picture's fit rule and crop box, the speech track's format, rate and sample digest).

Memory does not grow with the speech track: the track is decoded a second at a time
(``media.stream_audio``), cut into chunks as they are rendered (``runtime.stream``), and each
chunk's frames go to the encoder (and the PNG folder) and are dropped, while its samples go to
the video's audio track on disk (``media.Mp4Writer``). What is kept per chunk is its timing. The
track's length is read from its header only to refuse, before anything loads, a file past
``--max-audio-seconds``; decoding refuses it exactly if the header understated it.
"""

from __future__ import annotations

import math
import time
import wave
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from .. import _atomic
from ..errors import InputError
from ..media import (
    DEFAULT_FIT,
    Mp4File,
    Mp4Writer,
    load_image,
    sample_audio_pieces,
    sample_count,
    sample_image,
    stream_audio,
    write_png,
)
from ..records import ChunkProgram, Manifest
from ..registry import CachedRegistry, Registry, Resolved, open_registry, with_node_cache
from ..runtime import Chunk, LoadedBuild, Pace, PaceTally, StreamReport, TrustConfig, load, pace_of, stream
from ._delivered import pcm16

__all__ = [
    "RENDER_MAX_AUDIO_SECONDS",
    "RequestAudio",
    "render_build_to_files",
    "render_to_files",
    "request_audio",
    "request_image",
    "request_values_from_text",
]

# Streamed, a track's length costs render time and disk (the output, and 115 MB of scratch
# samples per hour at 16 kHz beside it), not memory: the bound is how long one render may run.
RENDER_MAX_AUDIO_SECONDS = 4 * 3600.0


def request_image(
    program: ChunkProgram, image_path: str | None = None, *, pipeline: str | None = None, fit: str = DEFAULT_FIT
) -> tuple[np.ndarray | None, dict]:
    """The picture of the build's image input (a file fitted by ``fit``, or the deterministic sample
    when the input is required: the sample face of a talking head) and how it was read; None for a
    build without an image input, or an optional one not given (the runtime feeds zeros)."""
    declared = program.input_of("image")
    if declared is None:
        if image_path:
            raise InputError(f"--image {image_path}: this build declares no image input; leave --image out")
        return None, {"path": None, "declared": False}
    h, w = declared.shape[0], declared.shape[1]
    if image_path:
        loaded = load_image(image_path, height=h, width=w, fit=fit, pipeline=pipeline)
        return loaded.pixels, {"path": str(image_path), "fit": loaded.fit.to_json()}
    if not declared.required:
        return None, {"path": None, "absent": "zeros (the input is optional)", "size": [w, h]}
    return sample_image(h, w), {"path": None, "sample": "sample_image variant 0", "size": [w, h]}


def request_values_from_text(program: ChunkProgram, given: dict[str, object]) -> dict[str, object]:
    """``--input NAME=VALUE`` by the build's declaration: a text input's VALUE is the text, a tensor
    input's a ``.npy`` file (read without pickles); a name the build does not declare is refused."""
    declared = {i.name: i for i in program.request_inputs() if i.kind in ("text", "tensor")}
    out: dict[str, object] = {}
    for name, value in given.items():
        spec = declared.get(name)
        if spec is None:
            raise InputError(
                f"--input {name}=...: this build declares no text or tensor input {name!r} (it has "
                f"{', '.join(declared) or 'none'})"
            )
        if spec.kind == "tensor" and isinstance(value, str):
            try:
                out[name] = np.load(value, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise InputError(f"--input {name}={value}: not a readable .npy array ({exc})") from None
        else:
            out[name] = value
    return out


@dataclass
class RequestAudio:
    """The speech of one render: ``pieces`` to iterate once (a decoder's seconds, or one sample
    array), ``seconds`` known before decoding (a header's, or the sample's), and :meth:`record`
    once the pieces have been read: what the track was and the digest of its samples."""

    pieces: Iterable[np.ndarray]
    seconds: float | None
    _record: Callable[[], dict]

    def record(self) -> dict:
        return self._record()


def request_audio(
    program: ChunkProgram,
    audio_path: str | None = None,
    *,
    seconds: float = 1.0,
    max_seconds: float = RENDER_MAX_AUDIO_SECONDS,
) -> RequestAudio | None:
    """A speech file, streamed and bounded (a file past ``max_seconds`` by its header is refused
    here), or the deterministic sample of ``seconds`` for a required audio input; None for a build
    without an audio input, or an optional one not given (then ``seconds`` sets the length)."""
    declared = program.input_of("audio")
    if declared is None or (not declared.required and not audio_path):
        if audio_path:
            raise InputError(
                f"--audio {audio_path}: this build declares no audio input; leave --audio out "
                "(--seconds sets the length)"
            )
        return None
    if audio_path:
        decoder = stream_audio(
            audio_path,
            sample_rate=program.sample_rate,
            max_seconds=max_seconds,
            longer_fix="render it whole with a larger --max-audio-seconds",
        )
        header = decoder.check_header()

        def record() -> dict:
            if decoder.source is None:  # pragma: no cover - read() completes a pass or raises
                raise RuntimeError("the speech track was not read to its end")
            return decoder.source.to_json()

        return RequestAudio(decoder, header.seconds, record)
    # Made piece by piece as the chunks read it: a long --seconds holds one piece at a time.
    pieces = sample_audio_pieces(seconds, sample_rate=program.sample_rate)  # checks seconds
    return RequestAudio(
        pieces,
        sample_count(seconds, program.sample_rate) / program.sample_rate,
        lambda: {
            "path": None,
            "sample": "sample_audio variant 0",
            "seconds": seconds,
            "sample_rate": program.sample_rate,
        },
    )


def render_build_to_files(
    build: LoadedBuild,
    image: np.ndarray | None,
    audio: Iterable[np.ndarray] | None,
    *,
    out_path: str,
    frames_dir: str | None = None,
    seed: int = 0,
    on_chunk: Callable[[Chunk], None] | None = None,
    frames: int | None = None,
    values: dict[str, object] | None = None,
) -> tuple[StreamReport, Mp4File]:
    """Render ``build`` chunk by chunk into an MP4 (and PNG frames): (StreamReport, Mp4File).

    Holds one chunk of samples and one chunk of frames at a time; ``out_path`` appears only
    when the whole video is written (a refusal or failure half way leaves it as it was). A build
    that delivers audio writes a 16-bit mono WAV at its delivered rate instead (streamed the same
    way), one that delivers tensors an ``.npz`` of every chunk's (``<output>/<chunk index>``, held
    until the end).
    """
    prog = build.manifest.program
    if prog.delivery().kind != "video":
        return _render_other(
            build, image, audio, out_path=out_path, seed=seed, on_chunk=on_chunk, frames=frames, values=values
        )
    frames_to = Path(frames_dir) if frames_dir else None
    if frames_to is not None:
        frames_to.mkdir(parents=True, exist_ok=True)
    report = StreamReport()
    with Mp4Writer(out_path, fps=prog.fps, sample_rate=prog.sample_rate if audio is not None else None) as mp4:

        def to_track(pieces: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
            for piece in pieces:  # the samples the chunks render, onto the audio track as they pass
                mp4.add_audio(piece)
                yield piece

        for chunk in stream(
            build, image, None if audio is None else to_track(audio), seed=seed, frames=frames, values=values
        ):
            mp4.add_frames(chunk.frames)
            if frames_to is not None:
                for i, frame in enumerate(chunk.frames):
                    write_png(frames_to / f"frame_{chunk.first_frame + i:05d}.png", frame)
            report.add(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
            del chunk
        video = mp4.finish()
    return report, video


def _render_other(
    build: LoadedBuild,
    image: np.ndarray | None,
    audio: Iterable[np.ndarray] | None,
    *,
    out_path: str,
    seed: int,
    on_chunk: Callable[[Chunk], None] | None,
    frames: int | None,
    values: dict[str, object] | None,
) -> tuple[StreamReport, Mp4File]:
    """An audio (WAV) or tensors (npz) delivery, written atomically: what ``render`` writes for a
    build whose chunks deliver no video."""
    d = build.manifest.program.delivery()
    report, samples = StreamReport(), 0
    kept: dict[str, np.ndarray] = {}
    with _atomic.atomic_path(out_path) as tmp:
        wav = wave.open(str(tmp), "wb") if d.kind == "audio" else None
        try:
            if wav is not None:
                wav.setnchannels(1)
                wav.setsampwidth(2)
                wav.setframerate(d.sample_rate)
            for chunk in stream(build, image, audio, seed=seed, frames=frames, values=values):
                if wav is not None:
                    wav.writeframes(pcm16(chunk.frames))  # the bytes serve's WAV sends
                    samples += int(chunk.frames.shape[0])
                else:
                    kept.update({f"{name}/{chunk.index}": a for name, a in chunk.outputs.items()})
                report.add(chunk)
                if on_chunk is not None:
                    on_chunk(chunk)
                del chunk
        finally:
            if wav is not None:
                wav.close()
        if wav is None:
            with open(tmp, "wb") as fh:
                np.savez(fh, **cast("dict[str, Any]", kept))  # by name; numpy's stubs mistype **kwds
    seconds = samples / d.sample_rate if d.kind == "audio" else report.frames / build.manifest.program.fps
    return report, Mp4File(Path(out_path), report.frames, seconds, Path(out_path).stat().st_size)


def render_to_files(
    *,
    ref: str,
    registry_uri: str | None,
    image_path: str | None,
    audio_path: str | None,
    seconds: float,
    seed: int,
    out_path: str,
    frames_dir: str | None,
    prepare: Callable[[Registry, str], tuple[Resolved, Manifest]],
    t_process: float,
    trust: TrustConfig | None = None,
    fit: str = DEFAULT_FIT,
    max_audio_seconds: float = RENDER_MAX_AUDIO_SECONDS,
    progress: Callable[[str], None] = lambda m: None,
    values: dict[str, object] | None = None,
) -> dict:
    t_cli = time.perf_counter()
    registry = with_node_cache(open_registry(registry_uri, create=False))
    resolved, manifest = prepare(registry, ref)  # sets the device count before JAX starts
    prog = manifest.program
    t_inputs = time.perf_counter()
    image, image_record = request_image(prog, image_path, pipeline=manifest.pipeline, fit=fit)
    values = request_values_from_text(prog, values or {})
    audio = request_audio(prog, audio_path, seconds=seconds, max_seconds=max_audio_seconds)
    decode_seconds = time.perf_counter() - t_inputs  # the picture, and the track's header
    t_imp = time.perf_counter()
    import jax  # noqa: F401 - heavy, and timed: JAX starts here, after prepare() set the device count

    imports = (t_cli - t_process) + (time.perf_counter() - t_imp)
    # With a trust key the loader resolves the channel itself and checks its signed statement.
    progress(f"loading {manifest.build_id} from {registry.uri}")
    build = load(ref if trust is not None else resolved.digest, registry, strict=True, trust=trust)
    frames = None if audio is not None else max(1, math.ceil(seconds * prog.fps - 1e-9))
    length = _length(audio, frames, prog.fps)
    progress(f"loaded in {time.perf_counter() - t_imp:.1f}s; rendering {length} to {out_path}")
    pace = pace_of(manifest)
    report, mp4 = render_build_to_files(
        build,
        image,
        None if audio is None else audio.pieces,
        out_path=out_path,
        frames_dir=frames_dir,
        seed=seed,
        on_chunk=_chunk_progress(pace, progress),
        frames=frames,
        values=values,
    )
    return {
        "build_id": build.build_id,
        "digest": build.digest,
        "out": str(Path(out_path).absolute()),
        "frames_dir": str(Path(frames_dir).absolute()) if frames_dir else None,
        **report.to_json(),
        **_run_record(build, registry, pace, report, imports),
        # what was written: the video, or the delivered audio (WAV) or tensors (npz)
        prog.delivery().kind: {"bytes": mp4.bytes, "seconds": mp4.seconds},
        "inputs": _inputs_record(image_record, audio, frames, values, decode_seconds),
    }


def _chunk_progress(pace: Pace, progress: Callable[[str], None]) -> Callable[[Chunk], None]:
    """The ``on_chunk`` of a render: each chunk's progress line, timed against its playback deadline."""

    def say(c: Chunk) -> None:
        progress(
            pace.chunk_line(
                c.index,
                frames=int(c.frames.shape[0]),
                bucket=c.bucket,
                seconds=c.seconds,
                deadline=c.deadline,
                compiles=c.compiles,
            )
        )

    return say


def _run_record(
    build: LoadedBuild, registry: Registry, pace: Pace, report: StreamReport, imports: float
) -> dict[str, Any]:
    """How the load and the render went (the render summary's pace, compiles, node cache and cold start)."""
    tally = PaceTally.of(report.chunks)
    return {
        "deadline_misses": pace.misses(tally),  # as /healthz and /metrics count them
        "pace": {**pace.to_json(tally), "summary": pace.summary(tally)},
        "compiles": build.guard.count,
        # --cache-dir: what the node cache did for this load (hits, blobs pulled from the registry)
        "node_cache": registry.cache.stats.to_json() if isinstance(registry, CachedRegistry) else None,
        "cold_start": _cold_start(build, imports, report),
    }


def _length(audio: RequestAudio | None, frames: int | None, fps: int) -> str:
    """The request's length, as the progress line says it."""
    if audio is None:
        return f"{(frames or 0) / fps:.1f}s ({frames} frames)"
    return f"{audio.seconds:.1f}s of audio" if audio.seconds is not None else "the audio (length not in its header)"


def _inputs_record(
    image_record: dict,
    audio: RequestAudio | None,
    frames: int | None,
    values: dict[str, object] | None,
    decode_seconds: float,
) -> dict[str, Any]:
    """How the inputs were read (the render summary's ``inputs``)."""
    return {
        "image": image_record,
        "audio": audio.record() if audio is not None else {"path": None, "frames": frames},
        **({"values": sorted(values)} if values else {}),
        "decode_seconds": round(decode_seconds, 4),
    }


def _cold_start(build: LoadedBuild, imports: float, report: StreamReport) -> dict[str, float]:
    """Seconds from process start to the first chunk, step by step (the render report's ``cold_start``)."""
    t = build.timings
    cold = {
        "imports": round(imports, 4),
        "resolve": round(t.resolve, 4),
        "fetch": round(t.fetch, 4),
        "verify": round(t.verify, 4),
        "decompress": round(t.decompress, 4),
        "deserialize": round(t.deserialize, 4),
        "weights": round(t.weights, 4),
        "signature": round(t.signature, 4),
        "first_chunk": round(report.chunks[0].seconds, 4),
    }
    cold["total"] = round(sum(cold.values()), 4)
    return cold
