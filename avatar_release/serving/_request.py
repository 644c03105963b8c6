"""The render request: read bounded, typed by a pydantic model, media decoded with header checks.

Two encodings of one request:

* ``application/json``: ``{"seconds": 1.0, "seed": 0, "fit": "cover", "image_b64": "...",
  "audio_b64": "..."}`` (all optional; the old keys ``image_png_b64``/``audio_wav_b64`` too).
  NaN and Infinity are refused at parse time, wrong types by the model (``"1"`` is not a number).
* ``multipart/form-data``: files ``image`` and ``audio``, text fields ``seconds``, ``seed``, ``fit``.

Those are a talking head's fields (``RenderRequest``). The fields of a build's request follow the
inputs its program declares (:func:`request_model`): ``image_b64``/``fit`` only with an image
input, ``audio_b64`` only with an audio input, ``seed`` only with a noise input, one field per text
input (a string) and per tensor input (nested JSON arrays), named as the input; ``seconds`` always
(the length when no audio drives the request).

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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from starlette.requests import Request

from .._dtypes import np_dtype
from ..errors import InputError
from ..media import load_audio_bytes, load_image_bytes, sample_audio, sample_image
from ..records import ChunkProgram, RequestInputRecord
from ..runtime import LoadedBuild
from ._errors import ServeError

if TYPE_CHECKING:
    from starlette.types import Message

__all__ = [
    "Limits",
    "RenderRequest",
    "RenderInputs",
    "FORM_FILES",
    "MEDIA_FIELDS",
    "REQUEST_ID",
    "read_body",
    "parse_request",
    "decode_inputs",
    "request_model",
]

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
        "cover",
        description="how a picture of another shape meets the build's size: cropped (cover), padded "
        "(contain) or stretched (exact)",
    )
    image_b64: str | None = Field(
        None,
        description="the reference picture, base64; the sample picture when absent",
        json_schema_extra={"contentEncoding": "base64"},
    )
    audio_b64: str | None = Field(
        None,
        description="the speech track, base64; sample audio of `seconds` when absent",
        json_schema_extra={"contentEncoding": "base64"},
    )
    # older keys, read as image_b64 / audio_b64
    image_png_b64: str | None = Field(
        None, description="older name of image_b64", json_schema_extra={"contentEncoding": "base64", "deprecated": True}
    )
    audio_wav_b64: str | None = Field(
        None, description="older name of audio_b64", json_schema_extra={"contentEncoding": "base64", "deprecated": True}
    )


def _is_talking_head(p: ChunkProgram) -> bool:
    return (
        p.talking_head
        and p.input_of("noise") is not None
        and not any(i.kind in ("text", "tensor") for i in p.request_inputs())
    )


_last_model: tuple[ChunkProgram, type[BaseModel]] | None = None  # the served program's, made once


def request_model(program: ChunkProgram) -> type[BaseModel]:
    """The JSON body's model for a build's declared inputs: ``RenderRequest`` itself for a talking
    head (photo, audio and noise in, video out), else a model with only the fields it declares.
    The pod asks on every request: the model is made once per program, not per request."""
    global _last_model
    last = _last_model
    if last is not None and last[0] is program:
        return last[1]
    model = _declared_model(program)
    _last_model = (program, model)
    return model


def _declared_model(program: ChunkProgram) -> type[BaseModel]:
    if _is_talking_head(program):
        return RenderRequest
    base = RenderRequest.model_fields
    fields: dict[str, Any] = {
        "seconds": (
            float,
            Field(
                1.0,
                gt=0,
                description="length of the request (seconds x "
                f"{program.fps} fps frames)"
                + ("; the audio's length when audio is sent" if program.input_of("audio") else ""),
            ),
        )
    }
    if program.input_of("noise") is not None:
        fields["seed"] = (int, base["seed"])
    if (image := program.input_of("image")) is not None:
        absent = "the sample picture" if image.required else "zeros (a black picture)"
        fields["fit"] = (Literal["cover", "contain", "exact"], base["fit"])
        for key, what in (
            (
                "image_b64",
                f"the image input {image.name!r} ({image.shape[0]} x {image.shape[1]}), base64; {absent} when absent",
            ),
            ("image_png_b64", "older name of image_b64"),
        ):
            fields[key] = (str | None, Field(None, description=what, json_schema_extra=base[key].json_schema_extra))
    if (audio := program.input_of("audio")) is not None:
        absent = "sample audio of `seconds`" if audio.required else "silence of `seconds`"
        for key, what in (
            (
                "audio_b64",
                f"the audio input {audio.name!r} (mono at {audio.sample_rate} Hz), base64; {absent} when absent",
            ),
            ("audio_wav_b64", "older name of audio_b64"),
        ):
            fields[key] = (str | None, Field(None, description=what, json_schema_extra=base[key].json_schema_extra))
    for i in program.request_inputs():
        need = "required" if i.required else "optional: zeros when absent"
        if i.kind == "text":
            fields[i.name] = (
                str | None,
                Field(None, description=f"the text input {i.name!r}: at most {i.shape[0]} bytes of UTF-8 ({need})"),
            )
        elif i.kind == "tensor":
            fields[i.name] = (
                list[Any] | None,
                Field(
                    None,
                    description=f"the tensor input {i.name!r}: {i.dtype} {list(i.shape)} as nested arrays ({need})",
                ),
            )
    return create_model("RenderRequest", __config__=RenderRequest.model_config, **fields)


@dataclass
class RenderInputs:
    image: np.ndarray | None  # (H, W, 3) uint8 at the build's size; None: the build has no image input
    audio: np.ndarray | None  # (samples,) float32 at the build's rate; None: no audio drives the request
    seed: int
    image_source: str  # "sample", "request", or "none"
    audio_source: str
    frames: int = 0  # the request's length in frames
    values: dict[str, np.ndarray] | None = None  # text and tensor inputs by name (None: none)


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
                raise ServeError(
                    "body_too_large", f"body past {limits.max_body} bytes; this pod takes at most {limits.max_body}"
                )
            parts.append(piece)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(read(), limits.body_timeout)
    except TimeoutError:
        raise ServeError("body_timeout", f"the body did not arrive within {limits.body_timeout:g} s") from None


def _no_constants(name: str) -> NoReturn:
    raise ServeError("invalid_json", f"{name} is not a number this pod accepts; send a finite number")


def _model(doc: dict[str, Any], *, strict: bool, model: type[BaseModel] = RenderRequest) -> Any:
    try:
        return model.model_validate(doc, strict=strict)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise ServeError("invalid_request", f"{field}: {first['msg']} ({len(exc.errors())} problem(s))") from None


async def parse_request(
    content_type: str, body: bytes, limits: Limits, model: type[BaseModel] = RenderRequest
) -> tuple[Any, bytes | None, bytes | None]:
    """(fields, image bytes, audio bytes) from a JSON or multipart body; ``model``: the build's
    (:func:`request_model`)."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        return await _parse_multipart(content_type, body, limits, model)
    # JSON only when the request says JSON (or says nothing): a form or text body is not parsed as JSON.
    if ctype not in ("application/json", "") and not (ctype.startswith("application/") and ctype.endswith("+json")):
        raise ServeError(
            "unsupported_media_type", f"content type {ctype!r}; send application/json or multipart/form-data"
        )
    try:
        doc = json.loads(body or b"{}", parse_constant=_no_constants)
    except ServeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ServeError(
            "invalid_json", f"body is not JSON ({type(exc).__name__} at {getattr(exc, 'pos', '?')})"
        ) from None
    if not isinstance(doc, dict):
        raise ServeError("invalid_request", f"body must be a JSON object, got {type(doc).__name__}")
    req = _model(doc, strict=True, model=model)
    image = _b64(_either(req, "image_b64", "image_png_b64"), "image")
    audio = _b64(_either(req, "audio_b64", "audio_wav_b64"), "audio")
    return req, image, audio


def _either(req: Any, key: str, older: str) -> str | None:
    value = getattr(req, key, None)
    return value if value is not None else getattr(req, older, None)


def _b64(text: str | None, what: str) -> bytes | None:
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ServeError(f"invalid_{what}", f"{what}_b64 is not valid base64") from None


async def _parse_multipart(
    content_type: str, body: bytes, limits: Limits, model: type[BaseModel] = RenderRequest
) -> tuple[Any, bytes | None, bytes | None]:
    sent = False

    async def replay() -> Message:  # the body was already read (bounded); hand it to the form parser once
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", content_type.encode("latin-1"))]}
    try:
        form = await Request(scope, replay).form(
            max_files=2, max_fields=limits.max_form_parts, max_part_size=limits.max_body
        )
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
        elif model.model_fields.get(key) is not None and "list" in str(model.model_fields[key].annotation):
            try:  # a tensor input: its nested arrays as JSON text
                doc[key] = json.loads(value, parse_constant=_no_constants)
            except ValueError:
                raise ServeError("invalid_request", f"{key}: not JSON arrays") from None
        else:
            doc[key] = value
    req = _model(doc, strict=False, model=model)  # numbers came as text; NaN/Infinity still refused by the model
    if any(getattr(req, key, None) for key in MEDIA_FIELDS):
        raise ServeError("invalid_request", "multipart requests send the media as files 'image' and 'audio'")
    return req, files.get("image"), files.get("audio")


def decode_inputs(
    build: LoadedBuild, req: Any, image: bytes | None, audio: bytes | None, limits: Limits
) -> RenderInputs:
    """Pixels, samples and the other declared inputs at the build's size and rate, within the
    build-derived bounds (blocking). A required picture or track left out is the sample (the
    sample face, for a talking head); an optional one left out is fed zeros by the runtime."""
    p = build.manifest.program
    max_frames = limits.max_frames(p.fps)
    max_seconds = max_frames / p.fps
    img, snd = p.input_of("image"), p.input_of("audio")
    for sent, spec, kind in ((image, img, "image"), (audio, snd, "audio")):
        if sent is not None and spec is None:
            raise ServeError(f"invalid_{kind}", f"build {build.build_id} declares no {kind} input; send none")
    pixels = _request_pixels(build, req, image, img, limits)
    if audio is None and req.seconds > max_seconds:
        raise ServeError(
            "duration_too_long",
            f"seconds {req.seconds:g}; build {build.build_id} serves at most "
            f"{max_seconds:g} s ({max_frames} frames at {p.fps} fps) per request",
        )
    samples = _request_samples(build, req, audio, snd, max_seconds)
    frames = (
        -(-samples.shape[0] // p.samples_per_frame)
        if samples is not None
        else max(1, math.ceil(req.seconds * p.fps - 1e-9))
    )
    values = _values(build, req)
    return RenderInputs(
        None if pixels is None else np.ascontiguousarray(pixels),
        None if samples is None else np.ascontiguousarray(samples, dtype=np.float32),
        getattr(req, "seed", 0),
        "none" if img is None else "sample" if image is None else "request",
        "none" if snd is None else "sample" if audio is None else "request",
        frames,
        values,
    )


def _request_pixels(
    build: LoadedBuild, req: Any, image: bytes | None, img: RequestInputRecord | None, limits: Limits
) -> np.ndarray | None:
    """The image input's pixels: the picture sent (fitted, bounded), the sample for a required input
    left out, None when the build has no image input or an optional one was left out."""
    if img is not None and image is None and img.required:
        return sample_image(img.shape[0], img.shape[1])
    if img is None or image is None:
        return None
    try:
        return load_image_bytes(
            image,
            height=img.shape[0],
            width=img.shape[1],
            fit=getattr(req, "fit", "cover"),
            where="request image",
            pipeline=build.manifest.pipeline,
            max_pixels=limits.max_image_pixels,
        ).pixels
    except InputError as exc:
        raise ServeError("invalid_image", str(exc)) from None


def _request_samples(
    build: LoadedBuild, req: Any, audio: bytes | None, snd: RequestInputRecord | None, max_seconds: float
) -> np.ndarray | None:
    """The audio input's samples: the track sent (decoded, within ``max_seconds``), the sample of
    ``req.seconds`` for a required input left out, None otherwise."""
    if snd is not None and audio is None and snd.required:
        return sample_audio(req.seconds, sample_rate=snd.sample_rate)
    if snd is None or audio is None:
        return None
    try:
        samples = load_audio_bytes(
            audio, sample_rate=snd.sample_rate, where="request audio", max_seconds=max_seconds
        ).samples
    except InputError as exc:
        if "longer than the bound" in str(exc):
            raise ServeError(
                "duration_too_long",
                f"request audio is longer than {max_seconds:g} s, the most build {build.build_id} serves per request",
            ) from None
        raise ServeError("invalid_audio", str(exc)) from None
    if samples.size == 0:
        raise ServeError("invalid_audio", "request audio decodes to no samples")
    return samples


def _values(build: LoadedBuild, req: Any) -> dict[str, np.ndarray]:
    """The text and tensor inputs the request sent, checked against the declaration (400 otherwise)."""
    out: dict[str, np.ndarray] = {}
    for i in build.manifest.program.request_inputs():
        if i.kind not in ("text", "tensor"):
            continue
        value = getattr(req, i.name, None)
        if value is None:
            if i.required:
                raise ServeError(
                    "invalid_request",
                    f"{i.name}: build {build.build_id} requires its {i.kind} input "
                    f"{i.name!r} ({i.dtype} {list(i.shape)}); none sent",
                )
            continue
        if i.kind == "text":
            data = value.encode("utf-8")
            if len(data) > i.shape[0]:
                raise ServeError(
                    "invalid_request",
                    f"{i.name}: {len(data)} bytes of UTF-8; build {build.build_id} takes at most {i.shape[0]}",
                )
            arr = np.zeros(i.shape[0], np.uint8)
            arr[: len(data)] = np.frombuffer(data, np.uint8)
        else:
            try:
                arr = np.asarray(value, dtype=np_dtype(i.dtype))
            except (TypeError, ValueError, OverflowError):
                raise ServeError("invalid_request", f"{i.name}: not an array of {i.dtype} numbers") from None
            if arr.shape != tuple(i.shape):
                raise ServeError(
                    "invalid_request",
                    f"{i.name}: shape {list(arr.shape)}; build {build.build_id} takes {i.dtype} {list(i.shape)}",
                )
        out[i.name] = arr
    return out
