"""The pod's OpenAPI 3.1 document (``GET /openapi.json``), built from what the pod enforces.

A hand-written description of ``/render`` would drift from the parser the first time a field or
a bound changed. So the document is a function of the build served and the app's `Limits`, made
from the same objects the request path uses: the JSON body's schema is the build's request model's
own (``request_model``, from the inputs the build's program declares: the model ``parse_request``
validates with: names, types, bounds, ``additionalProperties: false``),
with the build-derived bound on ``seconds`` that ``decode_inputs`` checks; the multipart body is
the file parts ``FORM_FILES`` plus the model's fields that carry no media (``MEDIA_FIELDS``); the
error answers are ``CODES`` (code and status). Only what no object holds is written here: which
codes each route can answer, the streamed answer's headers. tests/unit/test_serving_oip.py
checks those against the running app. Nothing is built at import.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from .. import __version__
from ..media import ACCEPTED_AUDIO, ACCEPTED_IMAGES
from ..runtime import LoadedBuild
from ._delivered import CONTENT_TYPES
from ._errors import CODES
from ._oip import max_seconds
from ._request import FORM_FILES, MEDIA_FIELDS, REQUEST_ID, Limits, request_model

__all__ = ["openapi_document", "RENDER_ERRORS", "RETRY_AFTER", "VIDEO_HEADERS"]

# What POST /render can answer besides its video (the parser's, the admission's, the render's, the
# protocol's per-address cap) and which of those come with Retry-After (``_app``).
RENDER_ERRORS = (
    "invalid_json",
    "invalid_request",
    "invalid_image",
    "invalid_audio",
    "duration_too_long",
    "body_timeout",
    "body_too_large",
    "unsupported_media_type",
    "queue_full",
    "too_many_connections",
    "render_failed",
    "internal",
    "queue_timeout",
    "draining",
    "render_timeout",
)
RETRY_AFTER = ("queue_full", "queue_timeout", "draining")
# The streamed answer's headers (``_video``), beside Content-Type: video/mp4.
VIDEO_HEADERS: dict[str, tuple[str, str]] = {
    "X-Request-Id": (
        "string",
        "the request's X-Request-Id when it matches the pattern, else one the pod made; the pod's log line carries it",
    ),
    "X-Build-Id": ("string", "the build that rendered this video (a build swap never changes a video half-way)"),
    "X-Frames": ("integer", "frames the whole video has"),
    "X-Compiles": ("integer", "XLA compiles the build has seen while serving (0 on a healthy pod)"),
    "Cache-Control": ("string", "no-store"),
}
_MEDIA = {"image": ACCEPTED_IMAGES, "audio": ACCEPTED_AUDIO}  # by FORM_FILES name
_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=name)}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(codes: Iterable[str], retry: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Responses by status, each naming its codes (an ``enum`` on ``error``): a client branches on them."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(CODES[code], []).append(code)
    retrying = set(retry)
    out: dict[str, dict[str, Any]] = {}
    for status, cs in sorted(by_status.items()):
        schema = {"allOf": [_ref("Error"), {"properties": {"error": {"enum": cs}}}]}
        out[str(status)] = answer = _json(", ".join(cs), schema)
        if with_retry := [c for c in cs if c in retrying]:
            answer["headers"] = {
                "Retry-After": {
                    "description": f"seconds; sent with {', '.join(with_retry)}",
                    "schema": {"type": "integer"},
                }
            }
    return out


def _files(build: LoadedBuild) -> tuple[str, ...]:
    """The multipart file parts this build takes: those of FORM_FILES whose kind it declares an input of."""
    return tuple(name for name in FORM_FILES if build.manifest.program.input_of(name) is not None)


def _what(build: LoadedBuild) -> str:
    """What ``/render`` makes, in words, from the build's declaration."""
    p = build.manifest.program
    if p.talking_head:
        return "a talking-head video"
    kinds = {"image": "a picture", "audio": "audio", "text": "text", "tensor": "tensors"}
    given = [kinds[i.kind] for i in p.request_inputs() if i.kind in kinds]
    made = {"video": "a video", "audio": "audio (WAV)", "tensors": "tensors (npz)"}[p.delivery().kind]
    return f"{made} from {' + '.join(dict.fromkeys(given)) or 'its length alone'}"


def _empty_body(build: LoadedBuild) -> str:
    p = build.manifest.program
    if p.talking_head:
        return "an empty body renders the sample picture and audio (the sample face)"
    samples = {"image": "the sample picture", "audio": "sample audio of `seconds`"}
    parts = [samples[i.kind] for i in p.request_inputs() if i.kind in samples and i.required]
    parts += [
        f"zeros for {i.name}"
        for i in p.request_inputs()
        if i.kind in ("image", "audio", "text", "tensor") and not i.required
    ]
    need = [i.name for i in p.request_inputs() if i.kind in ("text", "tensor") and i.required]
    return (
        "an empty body renders "
        + (", ".join(parts) or "`seconds` of video")
        + (f"; {', '.join(need)} must be sent" if need else "")
    )


def _request_schemas(build: LoadedBuild, limits: Limits) -> dict[str, dict[str, Any]]:
    """The JSON body (the model's schema, with the build's bound) and the multipart body."""
    # a deep copy: pydantic may hand back objects it keeps (json_schema_extra)
    body = copy.deepcopy(request_model(build.manifest.program).model_json_schema(ref_template=_REF))
    defs = body.pop("$defs", {})
    props = body["properties"]
    longest = max_seconds(build, limits)
    props["seconds"]["maximum"] = longest
    props["seconds"]["description"] += f"; at most {longest:g} s (400 duration_too_long past it)"
    for field in MEDIA_FIELDS:
        kind = "image" if field.startswith("image") else "audio"
        if field in props:
            props[field]["description"] += f" ({_MEDIA[kind]})"
    form_props: dict[str, Any] = {
        name: {
            "type": "string",
            "contentMediaType": "application/octet-stream",
            "description": f"the {name} file ({_MEDIA[name]}); "
            + props[f"{name}_b64"]["description"].split("; ")[-1].split(" (")[0],
        }
        for name in _files(build)
    }
    form_props.update({k: v for k, v in props.items() if k not in MEDIA_FIELDS})
    form = {
        "type": "object",
        "properties": form_props,
        "additionalProperties": False,
        "description": f"files {', '.join(_files(build)) or '(none)'} and text fields; at most "
        f"{limits.max_form_parts} parts",
    }
    return {**defs, "RenderRequest": body, "RenderForm": form}


def _answer_schemas() -> dict[str, dict[str, Any]]:
    """The error body and the probes' answers."""
    string = {"type": "string"}
    return {
        "Error": {
            "type": "object",
            "required": ["error", "message"],
            "additionalProperties": False,
            "properties": {"error": {"enum": list(CODES)}, "message": string},
        },
        "Live": {"type": "object", "required": ["live"], "properties": {"live": {"const": True}}},
        "Ready": {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}},
        "Readyz": {
            "type": "object",
            "required": ["ready", "build_id", "digest"],
            "properties": {"ready": {"const": True}, "build_id": string, "digest": string},
        },
        "Health": {"type": "object", "description": "build, compiles, timings, queue and channel-follow state"},
    }


def _oip_schemas() -> dict[str, dict[str, Any]]:
    """The Open Inference Protocol's metadata answers (``_oip``), ours added to the model's."""
    string, integer = {"type": "string"}, {"type": "integer"}
    tensor = {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": string,
            "datatype": string,
            "shape": {"type": "array", "items": integer},
            "parameters": {"type": "object"},
        },
    }
    versions = {"type": "array", "items": string, "minItems": 1, "maxItems": 1}
    model_props = {
        "name": string,
        "versions": versions,
        "platform": string,
        "inputs": {"type": "array", "items": _ref("MetadataTensor")},
        "outputs": {"type": "array", "items": _ref("MetadataTensor")},
        "build_id": string,
        "digest": string,
        "channel": string,
        "target": string,
        "fps": integer,
        "buckets": {"type": "object", "additionalProperties": integer},
    }
    return {
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {"name": string, "version": string, "extensions": {"type": "array", "items": string}},
        },
        "MetadataTensor": tensor,
        "ModelMetadata": {
            "type": "object",
            "required": list(model_props),
            "properties": model_props,
        },  # every field required
        "ModelReady": {
            "type": "object",
            "required": ["name", "versions", "ready"],
            "properties": {"name": string, "versions": versions, "ready": {"type": "boolean"}},
        },
    }


def _schemas(build: LoadedBuild, limits: Limits) -> dict[str, dict[str, Any]]:
    return {**_request_schemas(build, limits), **_answer_schemas(), **_oip_schemas()}


def _answer(build: LoadedBuild) -> tuple[str, str]:
    """(content type, description) of what /render answers, by the build's declared delivery."""
    d = build.manifest.program.delivery()
    if d.kind == "audio":
        return CONTENT_TYPES["audio"], (
            f"16-bit mono PCM WAV at {d.sample_rate} Hz ({d.samples_per_frame} samples "
            "per frame), header first, then each chunk's samples as it completes"
        )
    if d.kind == "tensors":
        return CONTENT_TYPES["tensors"], (
            f"an .npz (numpy.load) of every chunk's {', '.join(d.outputs)}, named "
            "<output>/<chunk index>, sent whole after the last chunk"
        )
    return CONTENT_TYPES["video"], "fragmented MP4 (H.264 + AAC), sent chunked as chunks complete"


def _render(build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    media, what = _answer(build)
    video = {
        "description": f"{what}; an error after the first bytes cuts the body short (the pod's log says why)",
        "headers": {
            name: {"description": text, "schema": {"type": kind}} for name, (kind, text) in VIDEO_HEADERS.items()
        },
        "content": {media: {"schema": {"type": "string", "contentMediaType": media}}},
    }
    return {
        "operationId": "render",
        "summary": f"render {_what(build)} with build {build.build_id}",
        "parameters": [
            {
                "name": "X-Request-Id",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": REQUEST_ID.pattern},
            }
        ],
        "requestBody": {
            "required": False,
            "description": f"at most {limits.max_body} bytes (413 past it), arriving within {limits.body_timeout:g} "
            f"s (408); {_empty_body(build)}",
            "content": {
                "application/json": {"schema": _ref("RenderRequest")},
                "multipart/form-data": {
                    "schema": _ref("RenderForm"),
                    "encoding": {name: {"contentType": "application/octet-stream"} for name in _files(build)},
                },
            },
        },
        "responses": {"200": video, **_errors(RENDER_ERRORS, RETRY_AFTER)},
    }


def _get(op: str, summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"get": {"operationId": op, "summary": summary, "responses": responses, **more}}


def _oip_paths(pipeline: str) -> dict[str, Any]:
    """The Open Inference Protocol's routes (``_oip``, ``_probes``)."""
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "the pipeline served",
        "example": pipeline,
    }
    not_found = _errors(["not_found"])
    return {
        "/v2": _get(
            "serverMetadata",
            "Open Inference Protocol server metadata",
            {"200": _json("server", _ref("ServerMetadata"))},
        ),
        "/v2/health/live": _get("serverLive", "OIP liveness (as /livez)", {"200": _json("live", _ref("Live"))}),
        "/v2/health/ready": _get(
            "serverReady",
            "OIP readiness (as /readyz)",
            {
                "200": _json("ready", _ref("Ready")),
                "503": _json("not ready: draining, or compiled while serving", _ref("Ready")),
            },
        ),
        "/v2/models/{name}": _get(
            "modelMetadata",
            "OIP model metadata: the build served and what /render takes",
            {"200": _json("model", _ref("ModelMetadata")), **not_found},
            parameters=[name],
        ),
        "/v2/models/{name}/ready": _get(
            "modelReady",
            "OIP model readiness (as /readyz)",
            {"200": _json("ready", _ref("ModelReady")), "503": _json("not ready", _ref("ModelReady")), **not_found},
            parameters=[name],
        ),
    }


def openapi_document(build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """The document for the build served now and the app's limits (both shape ``/render``)."""
    m = build.manifest
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "avatar-release pod",
            "version": __version__,
            "description": f"Serves build {build.build_id} of pipeline {m.pipeline} (target {m.target}). "
            "Every answer that is not a video is JSON {error, message}; any route answers "
            "405 method_not_allowed to another method, an unknown path 404 not_found.",
        },
        "x-build": {"build_id": build.build_id, "digest": build.digest, "pipeline": m.pipeline, "target": m.target},
        "paths": {
            "/render": {"post": _render(build, limits)},
            "/livez": _get("livez", "200 while the process serves HTTP", {"200": _json("live", _ref("Live"))}),
            "/readyz": _get(
                "readyz",
                "200 once verified, loaded and warm with 0 compiles, and not draining",
                {"200": _json("ready", _ref("Readyz")), **_errors(["draining", "not_ready"])},
            ),
            "/healthz": _get("healthz", "the detailed state", {"200": _json("state", _ref("Health"))}),
            "/metrics": _get(
                "metrics",
                "Prometheus metrics (avatar_serve_*)",
                {
                    "200": {
                        "description": "Prometheus text exposition",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            ),
            "/openapi.json": _get("openapi", "this document", {"200": _json("OpenAPI 3.1", {"type": "object"})}),
            **_oip_paths(m.pipeline),
        },
        "components": {"schemas": _schemas(build, limits)},
    }
