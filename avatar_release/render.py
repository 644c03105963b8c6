"""``avatar-release render``: load a build as a serving pod would, stream it, write files.

Reports the cold start piece by piece (imports, resolve, verify, decompress, deserialize,
first chunk), every chunk against its playback deadline, and how the inputs were read (the
picture's fit rule and crop box, the speech track's format, rate and sample digest).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


from .media import DEFAULT_FIT
from .registry import open_registry

__all__ = ["render_to_files", "request_inputs"]


def request_inputs(program, *, image_path=None, audio_path=None, seconds=1.0, pipeline=None, fit=DEFAULT_FIT):
    """The reference image and audio for a render (files, or the deterministic samples), and a
    record of how each was read: the image's fit rule and crop box, the audio's source and digest."""
    from .media import load_audio, load_image
    from .samples import sample_audio, sample_image

    if image_path:
        loaded = load_image(image_path, height=program.height, width=program.width, fit=fit, pipeline=pipeline)
        image, image_record = loaded.pixels, {"path": str(image_path), "fit": loaded.fit.to_json()}
    else:
        image = sample_image(program.height, program.width)
        image_record = {"path": None, "sample": "sample_image variant 0", "size": [program.width, program.height]}
    if audio_path:
        decoded = load_audio(audio_path, sample_rate=program.sample_rate)
        audio, audio_record = decoded.samples, decoded.source.to_json()
    else:
        audio = sample_audio(seconds, sample_rate=program.sample_rate)
        audio_record = {"path": None, "sample": "sample_audio variant 0", "seconds": seconds,
                        "sample_rate": program.sample_rate}
    return image, audio, {"image": image_record, "audio": audio_record}


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
    prepare: Callable,
    t_process: float,
    trust=None,
    fit: str = DEFAULT_FIT,
    progress: Callable[[str], None] = lambda m: None,
) -> dict:
    from .media import write_mp4, write_png

    t_cli = time.perf_counter()
    registry = open_registry(registry_uri, create=False)
    resolved, manifest = prepare(registry, ref)  # sets the device count before JAX starts
    t_inputs = time.perf_counter()
    image, audio, inputs = request_inputs(manifest.program, image_path=image_path, audio_path=audio_path,
                                          seconds=seconds, pipeline=manifest.pipeline, fit=fit)
    inputs["decode_seconds"] = round(time.perf_counter() - t_inputs, 4)
    t_imp = time.perf_counter()
    import jax  # noqa: F401 - timed: part of the cold start

    from .runtime import load, render

    imports = (t_cli - t_process) + (time.perf_counter() - t_imp)
    # With a trust key the loader resolves the channel itself and checks its signed statement.
    progress(f"loading {manifest.build_id} from {registry.uri}")
    build = load(ref if trust is not None else resolved.digest, registry, strict=True, trust=trust)
    progress(f"loaded in {time.perf_counter() - t_imp:.1f}s; rendering {audio.shape[0] / manifest.program.sample_rate:.1f}s "
             "of audio")

    def say(c) -> None:
        progress(f"chunk {c.index}: {c.frames.shape[0]} frames ({c.bucket}) in {c.seconds:.2f}s, "
                 f"deadline {c.deadline:.2f}s{' MISSED' if c.missed else ''}, {c.compiles} compile(s)")

    frames, report = render(build, image, audio, seed=seed, on_chunk=say)
    progress(f"writing {out_path}")
    prog = manifest.program
    mp4 = write_mp4(out_path, frames, fps=prog.fps, audio=audio, sample_rate=prog.sample_rate)
    if frames_dir:
        d = Path(frames_dir)
        d.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(frames):
            write_png(d / f"frame_{i:05d}.png", f)
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
    return {
        "build_id": build.build_id,
        "digest": build.digest,
        "out": str(Path(out_path).absolute()),
        "frames_dir": str(Path(frames_dir).absolute()) if frames_dir else None,
        **report.to_json(),
        "compiles": build.guard.count,
        "cold_start": cold,
        "video": {"bytes": mp4.bytes, "seconds": mp4.seconds},
        "inputs": inputs,
    }
