"""The gate set: fixed, versioned, deterministic inputs every gate renders.

Version 1: two reference images (sample variants 0 and 1) x two audio clips (variants 0 and 1),
seed 0 (from build manifest v4 on: the pairs and the seed the pipeline declares, these by default). Each request is long enough for at least three chunks and, for a build with several
buckets, lays out its frames so that every bucket renders at least once (largest twice, then
each smaller one). The digest covers the layout, the fit rule by which the pictures reach the
pipeline's resolution, and the bytes of every input, so a change to the sample generators or
to the fit changes the gate set's identity and old results stop comparing.

Versions:
  1 (2026-11-29): the layout above; digest over layout and input bytes.
  2 (2026-12-01): pictures pass through the render's fit rule (``cover``, Pillow LANCZOS); they
    are drawn at the pipeline's size, so the pixels are v1's, and the digest now names the rule.
  3 (2026-12-01): the fit's resampler is ``pillow-bicubic-rgb8+reduce-gap-3+jpeg-dct-scale`` (was
    ``pillow-lanczos-rgb8``): the pixels are still v1's (nothing is resampled at the pipeline's
    size), the digest names the new resampler, so results gated under v2 stop comparing.
"""

from __future__ import annotations

import numpy as np

from .._digest import StreamDigest, canonical_json
from ..errors import SpecError
from ..media import DEFAULT_FIT, FIT_RESAMPLE, fit_image, sample_audio, sample_image
from ..records import GateRequestRecord, GateSetRecord, Manifest
from ..runtime import plan_chunks

__all__ = ["GATE_SET_NAME", "GATE_SET_VERSION", "gate_set", "gate_request_inputs"]

GATE_SET_NAME = "avatar-default"
GATE_SET_VERSION = 3
_IMAGES = (0, 1)
_AUDIO = (0, 1)
_SEED = 0
_MIN_CHUNKS = 3
# The rule a render applies by default: the gate set's pictures take the same road to the pipeline.
_FIT = DEFAULT_FIT


def _frames_per_request(manifest: Manifest) -> int:
    sizes = sorted({b.frames for b in manifest.buckets}, reverse=True)
    # Largest bucket (MIN_CHUNKS - 1) times, then each smaller bucket once: the greedy planner
    # then uses every bucket, and there are at least MIN_CHUNKS chunks.
    return sizes[0] * (_MIN_CHUNKS - 1) + sum(sizes[1:]) + (sizes[0] if len(sizes) == 1 else 0)


def gate_request_inputs(manifest: Manifest, req: GateRequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """The (image, audio) of one request: exactly ``req.frames`` frames of audio."""
    p = manifest.program
    image, _ = fit_image(sample_image(p.height, p.width, req.image_variant), height=p.height, width=p.width,
                         rule=_FIT)
    audio = sample_audio(req.frames / p.fps, sample_rate=p.sample_rate, variant=req.audio_variant)
    n = req.frames * p.samples_per_frame
    if audio.shape[0] < n:
        audio = np.pad(audio, (0, n - audio.shape[0]))
    return image, np.ascontiguousarray(audio[:n], dtype=np.float32)


def gate_set(manifest: Manifest) -> GateSetRecord:
    """The gate set for this build's program and buckets."""
    frames = _frames_per_request(manifest)
    plan = plan_chunks(manifest, frames)
    used = {bucket for bucket, _, _ in plan}
    missing = sorted({b.name for b in manifest.buckets} - used)
    if missing or len(plan) < _MIN_CHUNKS:
        raise SpecError(
            f"gate set {GATE_SET_NAME} v{GATE_SET_VERSION}: {frames} frames per request plan as "
            f"{[b for b, _, _ in plan]}; buckets {missing} would never be exercised. "
            "Choose bucket sizes where each smaller bucket is used for the tail."
        )
    # The pipeline's declared requests (manifest v4), else the defaults: the pairs stay in one order.
    declared = manifest.gate_requests
    images, audio, seed = ((declared.images, declared.audio, declared.seed) if declared is not None
                           else (_IMAGES, _AUDIO, _SEED))
    requests = [
        GateRequestRecord(name=f"image{i}-audio{a}", image_variant=i, audio_variant=a, seed=seed,
                          frames=frames, buckets=[b for b, _, _ in plan])
        for i in images for a in audio
    ]
    p = manifest.program
    h = StreamDigest(canonical_json({"name": GATE_SET_NAME, "version": GATE_SET_VERSION,
                                     "program": [p.height, p.width, p.fps, p.sample_rate],
                                     "fit": {"rule": _FIT, "resample": FIT_RESAMPLE},
                                     "requests": [r.model_dump(mode="json") for r in requests]}))
    for r in requests:
        image, samples = gate_request_inputs(manifest, r)
        h.update(image.tobytes())
        h.update(samples.tobytes())
    return GateSetRecord(name=GATE_SET_NAME, version=GATE_SET_VERSION,
                         digest=h.digest, requests=requests)
