"""The render request: read bounded, typed by a pydantic model, media decoded with header checks.

Two encodings of one request:

* ``application/json``: ``{"seconds": 1.0, "seed": 0, "fit": "cover", "image_b64": "...",
  "audio_b64": "..."}`` (all optional; the old keys ``image_png_b64``/``audio_wav_b64`` too).
  NaN and Infinity are refused at parse time, wrong types by the model (``"1"`` is not a number).
* ``multipart/form-data``: files ``image`` and ``audio``, text fields ``seconds``, ``seed``, ``fit``.

The duration bound comes from the build (:meth:`Limits.max_frames`): seconds requested or audio
sent past it is a 400 before anything renders; a picture's pixel count is read from its header
before decoding (``avatar_release.media``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import re
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from ..errors import InputError
from ..media import load_audio_bytes, load_image_bytes, sample_audio, sample_image
from ..runtime import LoadedBuild
from ._errors import ServeError

if TYPE_CHECKING:
    from starlette.types import Message

__all__ = ["Limits", "RenderRequest", "RenderInputs", "FORM_FILES", "MEDIA_FIELDS", "REQUEST_ID", "read_body",
           "parse_request", "decode_inputs"]

# The multipart body's file parts; a JSON body sends the same media base64 in MEDIA_FIELDS, which a
# multipart body may not use. The OpenAPI document (``_openapi``) reads both from here.
FORM_FILES = ("image", "audio")
MEDIA_FIELDS = ("image_b64", "audio_b64", "image_png_b64", "audio_wav_b64")
# A client's X-Request-Id is kept (echoed, logged) when it matches; otherwise the pod makes one.
REQUEST_ID = re.compile(r"^[\w.-]{1,64}$")


@dataclass(frozen=True)
class Limits:
    max_body: int = 32 * 1024 * 1024  # bytes; a 60 s WAV at 48 kHz stereo is ~11 MB, base64 adds a third
    max_seconds: float = 60.0  # longest video one request may ask for
    max_image_pixels: int = 16_000_000  # a 4K picture fits; a PNG declaring 10^10 pixels does not
    body_timeout: float = 30.0  # whole body must arrive within this (a slow sender holds no worker)
    max_form_parts: int = 8

    def max_frames(self, fps: int) -> int:
        """The bound in the build's frames (what the pod actually renders)."""
        return max(1, int(math.floor(self.max_seconds * fps)))


class RenderRequest(BaseModel):
    """Typed fields; strict: a string is not a number, an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    seconds: float = Field(1.0, gt=0, description="length of the sample audio when no audio is sent")
    seed: int = Field(0, ge=0, lt=2**63, description="noise seed (builds with the seeded recipe)")
    fit: Literal["cover", "contain", "exact"] = Field(
        "cover", description="how a picture of another shape meets the build's size: cropped (cover), padded "
                             "(contain) or stretched (exact)")
    image_b64: str | None = Field(None, description="the reference picture, base64; the sample picture when absent",
                                  json_schema_extra={"contentEncoding": "base64"})
    audio_b64: str | None = Field(None, description="the speech track, base64; sample audio of `seconds` when absent",
                                  json_schema_extra={"contentEncoding": "base64"})
    # older keys, read as image_b64 / audio_b64
    image_png_b64: str | None = Field(None, description="older name of image_b64",
                                      json_schema_extra={"contentEncoding": "base64", "deprecated": True})
    audio_wav_b64: str | None = Field(None, description="older name of audio_b64",
                                      json_schema_extra={"contentEncoding": "base64", "deprecated": True})


@dataclass
class RenderInputs:
    image: np.ndarray  # (H, W, 3) uint8 at the build's size
    audio: np.ndarray  # (samples,) float32 at the build's rate
    seed: int
    image_source: str  # "sample" or "request"
    audio_source: str


async def read_body(receive_stream: AsyncIterable[bytes], content_length: str | None, limits: Limits) -> bytes:
    """The whole body, refused with 413 past ``max_body`` (declared or counted) and 408 past the timeout."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise ServeError("invalid_request", "Content-Length is not a number") from None
        if declared > limits.max_body:
            raise ServeError("body_too_large", f"body of {declared} bytes; this pod takes at most {limits.max_body}")

    async def read() -> bytes:
        parts: list[bytes] = []
        n = 0
        async for piece in receive_stream:
            n += len(piece)
            if n > limits.max_body:
                raise ServeError("body_too_large", f"body past {limits.max_body} bytes; this pod takes at most "
                                                   f"{limits.max_body}")
            parts.append(piece)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(read(), limits.body_timeout)
    except asyncio.TimeoutError:
        raise ServeError("body_timeout", f"the body did not arrive within {limits.body_timeout:g} s") from None


def _no_constants(name: str) -> NoReturn:
    raise ServeError("invalid_json", f"{name} is not a number this pod accepts; send a finite number")


def _model(doc: dict[str, Any], *, strict: bool) -> RenderRequest:
    try:
        return RenderRequest.model_validate(doc, strict=strict)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise ServeError("invalid_request", f"{field}: {first['msg']} ({len(exc.errors())} problem(s))") from None


async def parse_request(content_type: str, body: bytes, limits: Limits) -> tuple[RenderRequest, bytes | None, bytes | None]:
    """(fields, image bytes, audio bytes) from a JSON or multipart body."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        return await _parse_multipart(content_type, body, limits)
    # JSON only when the request says JSON (or says nothing): a form or text body is not parsed as JSON.
    if ctype not in ("application/json", "") and not (ctype.startswith("application/") and ctype.endswith("+json")):
        raise ServeError("unsupported_media_type", f"content type {ctype!r}; send application/json or "
                                                   "multipart/form-data")
    try:
        doc = json.loads(body or b"{}", parse_constant=_no_constants)
    except ServeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ServeError("invalid_json", f"body is not JSON ({type(exc).__name__} at {getattr(exc, 'pos', '?')})") from None
    if not isinstance(doc, dict):
        raise ServeError("invalid_request", f"body must be a JSON object, got {type(doc).__name__}")
    req = _model(doc, strict=True)
    image = _b64(req.image_b64 if req.image_b64 is not None else req.image_png_b64, "image")
    audio = _b64(req.audio_b64 if req.audio_b64 is not None else req.audio_wav_b64, "audio")
    return req, image, audio


def _b64(text: str | None, what: str) -> bytes | None:
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ServeError(f"invalid_{what}", f"{what}_b64 is not valid base64") from None


async def _parse_multipart(content_type: str, body: bytes, limits: Limits
                           ) -> tuple[RenderRequest, bytes | None, bytes | None]:
    sent = False

    async def replay() -> Message:  # the body was already read (bounded); hand it to the form parser once
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", content_type.encode("latin-1"))]}
    try:
        form = await Request(scope, replay).form(max_files=2, max_fields=limits.max_form_parts,
                                                 max_part_size=limits.max_body)
    except Exception as exc:  # the parser's own errors (bad boundary, too many parts)
        raise ServeError("invalid_request", f"multipart body not readable: {getattr(exc, 'detail', exc)}") from None
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for key, value in form.multi_items():
        if hasattr(value, "read"):
            if key not in FORM_FILES:
                raise ServeError("invalid_request", f"file field {key!r}; this pod takes files 'image' and 'audio'")
            files[key] = await value.read()
        else:
            fields[key] = value
    doc: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "seconds":
            try:
                doc[key] = float(value)
            except ValueError:
                raise ServeError("invalid_request", f"seconds: {value[:40]!r} is not a number") from None
        elif key == "seed":
            try:
                doc[key] = int(value)
            except ValueError:
                raise ServeError("invalid_request", f"seed: {value[:40]!r} is not an integer") from None
        else:
            doc[key] = value
    req = _model(doc, strict=False)  # numbers came as text; NaN/Infinity still refused by the model
    if any(getattr(req, key) for key in MEDIA_FIELDS):
        raise ServeError("invalid_request", "multipart requests send the media as files 'image' and 'audio'")
    return req, files.get("image"), files.get("audio")


def decode_inputs(build: LoadedBuild, req: RenderRequest, image: bytes | None, audio: bytes | None,
                  limits: Limits) -> RenderInputs:
    """Pixels and samples at the build's size and rate, within the build-derived bounds (blocking)."""
    p = build.manifest.program
    max_frames = limits.max_frames(p.fps)
    max_seconds = max_frames / p.fps
    if image is None:
        pixels = sample_image(p.height, p.width)
    else:
        try:
            pixels = load_image_bytes(image, height=p.height, width=p.width, fit=req.fit, where="request image",
                                      pipeline=build.manifest.pipeline, max_pixels=limits.max_image_pixels).pixels
        except InputError as exc:
            raise ServeError("invalid_image", str(exc)) from None
    if audio is None:
        if req.seconds > max_seconds:
            raise ServeError("duration_too_long", f"seconds {req.seconds:g}; build {build.build_id} serves at most "
                                                  f"{max_seconds:g} s ({max_frames} frames at {p.fps} fps) per request")
        samples = sample_audio(req.seconds, sample_rate=p.sample_rate)
    else:
        try:
            samples = load_audio_bytes(audio, sample_rate=p.sample_rate, where="request audio",
                                       max_seconds=max_seconds).samples
        except InputError as exc:
            if "longer than the bound" in str(exc):
                raise ServeError("duration_too_long", f"request audio is longer than {max_seconds:g} s, the most "
                                                      f"build {build.build_id} serves per request") from None
            raise ServeError("invalid_audio", str(exc)) from None
    if samples.size == 0:
        raise ServeError("invalid_audio", "request audio decodes to no samples")
    return RenderInputs(np.ascontiguousarray(pixels), np.ascontiguousarray(samples, dtype=np.float32), req.seed,
                        "sample" if image is None else "request", "sample" if audio is None else "request")
