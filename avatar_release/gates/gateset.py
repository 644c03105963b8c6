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

The requests follow the inputs the build's program declares (build manifest v8): image variants
only where it has an image input, audio variants only where it has an audio input (a build
without audio renders the frames above, driven by no track), every text input the sample text
``SAMPLE_TEXT`` and every tensor input :func:`sample_tensor`; noise comes from the seed. For a
talking head (image and audio in, video out, no text or tensor input) the digest is the one above,
unchanged; for any other declaration it also covers the declared inputs and delivery. Whatever
the build delivers (video, audio, tensors) is rendered from the same requests; the gates compare
video frame by frame and audio or tensors chunk by chunk (``metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._digest import StreamDigest, canonical_json
from .._dtypes import np_dtype
from ..errors import SpecError
from ..media import DEFAULT_FIT, FIT_RESAMPLE, fit_image, sample_audio, sample_image
from ..records import (
    ChunkProgram,
    GateRequestRecord,
    GateRequestsRecord,
    GateSetRecord,
    Manifest,
    RequestInputRecord,
)
from ..runtime import plan_chunks

__all__ = [
    "GATE_SET_NAME",
    "GATE_SET_VERSION",
    "SAMPLE_TEXT",
    "GateInputs",
    "declared_requests",
    "gate_set",
    "gate_request_inputs",
    "sample_tensor",
]

GATE_SET_NAME = "avatar-default"
GATE_SET_VERSION = 3
_IMAGES = (0, 1)
_AUDIO = (0, 1)
_SEED = 0
_MIN_CHUNKS = 3
# The rule a render applies by default: the gate set's pictures take the same road to the pipeline.
_FIT = DEFAULT_FIT
SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class GateInputs:
    """One gate request's inputs, as the runtime's ``render`` takes them."""

    image: np.ndarray | None  # None: the build has no image input
    audio: np.ndarray | None  # None: no audio input; ``frames`` drives the request
    frames: int
    values: dict[str, np.ndarray] = field(default_factory=dict)  # text and tensor inputs by name


def sample_tensor(spec: RequestInputRecord) -> np.ndarray:
    """A tensor input's gate value: PCG64 seeded with the input's name bytes, standard normal
    (float dtypes) or integers 0..9, in the declared shape and dtype."""
    rng = np.random.default_rng(list(spec.name.encode("utf-8")) or [0])
    dtype = np_dtype(spec.dtype)
    if np.issubdtype(dtype, np.floating) or spec.dtype == "bfloat16":
        return rng.standard_normal(tuple(spec.shape), dtype=np.float32).astype(dtype)
    return rng.integers(0, 10, tuple(spec.shape)).astype(dtype)


def _text(spec: RequestInputRecord) -> np.ndarray:
    data = SAMPLE_TEXT.encode("utf-8")[: spec.shape[0]]
    out = np.zeros(spec.shape[0], np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


def _talking_head(p: ChunkProgram) -> bool:
    """The declaration every build had before v8: its gate set keeps the digest it had."""
    return p.talking_head and not any(i.kind in ("text", "tensor") for i in p.request_inputs())


def _frames_per_request(manifest: Manifest) -> int:
    sizes = sorted({b.frames for b in manifest.buckets}, reverse=True)
    # Largest bucket (MIN_CHUNKS - 1) times, then each smaller bucket once: the greedy planner
    # then uses every bucket, and there are at least MIN_CHUNKS chunks.
    return sizes[0] * (_MIN_CHUNKS - 1) + sum(sizes[1:]) + (sizes[0] if len(sizes) == 1 else 0)


def gate_request_inputs(manifest: Manifest, req: GateRequestRecord) -> GateInputs:
    """The inputs of one request: the picture and exactly ``req.frames`` frames of audio where the
    build declares them, its text and tensor inputs' sample values."""
    p = manifest.program
    image = audio = None
    img = p.input_of("image")
    if img is not None:
        h, w = img.shape[0], img.shape[1]
        image, _ = fit_image(sample_image(h, w, req.image_variant), height=h, width=w, rule=_FIT)
    if p.input_of("audio") is not None:
        track = sample_audio(req.frames / p.fps, sample_rate=p.sample_rate, variant=req.audio_variant)
        n = req.frames * p.samples_per_frame
        if track.shape[0] < n:
            track = np.pad(track, (0, n - track.shape[0]))
        audio = np.ascontiguousarray(track[:n], dtype=np.float32)
    values = {
        i.name: (_text(i) if i.kind == "text" else sample_tensor(i))
        for i in p.request_inputs()
        if i.kind in ("text", "tensor")
    }
    return GateInputs(image, audio, req.frames, values)


def declared_requests(manifest: Manifest) -> GateRequestsRecord:
    """The requests a build's gates render: what it recorded (manifest v4), else the defaults."""
    if manifest.gate_requests is not None:
        return manifest.gate_requests
    return GateRequestsRecord(images=list(_IMAGES), audio=list(_AUDIO), seed=_SEED)


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
    declared = declared_requests(manifest)
    images, audio, seed = declared.images, declared.audio, declared.seed
    p = manifest.program
    has_image, has_audio = p.input_of("image") is not None, p.input_of("audio") is not None
    names = {
        (True, True): "image{i}-audio{a}",
        (True, False): "image{i}",
        (False, True): "audio{a}",
        (False, False): "request",
    }
    requests = [
        GateRequestRecord(
            name=names[has_image, has_audio].format(i=i, a=a),
            image_variant=i,
            audio_variant=a,
            seed=seed,
            frames=frames,
            buckets=[b for b, _, _ in plan],
        )
        for i in (images if has_image else (0,))
        for a in (audio if has_audio else (0,))
    ]
    spec = {
        "name": GATE_SET_NAME,
        "version": GATE_SET_VERSION,
        "program": [p.height, p.width, p.fps, p.sample_rate],
        "fit": {"rule": _FIT, "resample": FIT_RESAMPLE},
        "requests": [r.model_dump(mode="json") for r in requests],
    }
    if not _talking_head(p):  # what the requests feed is part of what they are
        spec["inputs"] = [i.model_dump(mode="json") for i in p.request_inputs()]
        spec["delivers"] = p.delivery().model_dump(mode="json")
    h = StreamDigest(canonical_json(spec))
    for r in requests:
        given = gate_request_inputs(manifest, r)
        for part in (given.image, given.audio, *given.values.values()):
            if part is not None:
                h.update(part.tobytes())
    return GateSetRecord(name=GATE_SET_NAME, version=GATE_SET_VERSION, digest=h.digest, requests=requests)
