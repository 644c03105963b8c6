"""A LoadedBuild over the checked-in tiny manifest whose stages are numpy functions, not compiled XLA.

For what surrounds the executables (the audio feed, the chunk loop, the encoder, memory over a
long track) without a compile: ``runtime.stream`` drives it exactly as it drives a real build.
Each chunk's frames are a gray level that follows the loudness of that chunk's audio frame by
frame, so a test can tell which samples reached which frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"


def _dit(params, image, audio, prev_latent, noise):
    frames = np.asarray(noise).shape[0]
    level = np.abs(np.asarray(audio)).reshape(frames, -1).mean(axis=1)  # (F,) loudness per frame
    latents = np.broadcast_to(level[:, None, None, None], np.asarray(noise).shape).astype(np.float32)
    return latents, latents[-1].copy()


def _sr(params, latents, image):
    return (np.repeat(np.repeat(np.asarray(latents), 2, axis=2), 2, axis=3),)


def _vae(params, sr_latents, image):
    level = np.asarray(sr_latents)[:, 0, 0, 0]  # (F,)
    gray = np.clip(np.round(level * 255), 0, 255).astype(np.uint8)
    h, w, _ = np.asarray(image).shape
    return (np.broadcast_to(gray[:, None, None, None], (gray.size, h, w, 3)).copy(),)


def standin_build():
    from avatar_release.runtime import LoadedBuild, LoadTimings
    from avatar_release.runtime._load import LoadedStage
    from tests.helpers import cpu_manifest

    manifest = cpu_manifest()
    fns = {"dit": _dit, "sr": _sr, "vae": _vae}
    stages = {
        (e.stage, e.bucket): LoadedStage(e, fns[e.stage], [None] * len(e.inputs), {}) for e in manifest.executables
    }
    return LoadedBuild(
        resolved=None, manifest=manifest, registry="stand-in", mesh=None, stages=stages, timings=LoadTimings()
    )
