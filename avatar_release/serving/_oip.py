"""The pod in the Open Inference Protocol's (KServe v2) terms: server and model metadata.

OIP clients, gateways and model catalogues find out what a server holds with ``GET /v2`` and
``GET /v2/models/{name}``; answering them lets a fleet tool list our pods beside other model
servers without knowing our own ``/healthz``. The model is the manifest's pipeline (the name a
client asks for stays the same across promotions); its one version is the build served now, which
changes when a followed channel swaps builds, so every answer reads ``pod.build`` afresh.

The pod does not take OIP inference (``POST /v2/models/{name}/infer``): a render is a streamed MP4,
not a tensor. ``inputs`` and ``outputs`` therefore describe ``POST /render`` as it is: what a
client sends (encoded picture and audio bytes, a seed, a length), what the build's ChunkProgram
turns them into (its input names, shapes and rates), and the one ``video/mp4`` that comes back.
The health routes are ``_probes.probe``'s (one readiness rule for every name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from .. import __version__
from ..media import ACCEPTED_AUDIO, ACCEPTED_IMAGES
from ..records import RequestInputRecord
from ..runtime import LoadedBuild
from ._errors import ServeError
from ._pod import Pod
from ._probes import readiness
from ._request import Limits, RenderRequest

__all__ = ["SERVER_NAME", "server_metadata", "model_metadata", "model_ready", "check_model"]

SERVER_NAME = "avatar-release"


def server_metadata() -> dict[str, Any]:
    """``GET /v2``: no OIP extensions (no infer, no repository, no shared memory)."""
    return {"name": SERVER_NAME, "version": __version__, "extensions": []}


def check_model(pod: Pod, name: str) -> LoadedBuild:
    """The build served when ``name`` is its pipeline; else ``not_found`` (404), naming what is served."""
    build = pod.build
    if name != build.manifest.pipeline:
        raise ServeError(
            "not_found",
            f"no model {name[:100]!r} here; this pod serves {build.manifest.pipeline!r} (build {build.build_id})",
        )
    return build


def max_seconds(build: LoadedBuild, limits: Limits) -> float:
    """The longest video one request gets from this build (``decode_inputs`` refuses past it)."""
    fps = build.manifest.program.fps
    return limits.max_frames(fps) / fps


def _default(field: str) -> Any:
    return RenderRequest.model_fields[field].default


def _image_input(i: RequestInputRecord, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """The picture, sent as encoded bytes and decoded (and fitted) to the declared input's shape."""
    return {
        "name": "image",
        "datatype": "BYTES",
        "shape": [1],
        "parameters": {
            "accepts": ACCEPTED_IMAGES,
            "optional": True,
            "absent": "the sample picture" if i.required else "zeros (a black picture)",
            "decoded": {"name": i.name, "datatype": "UINT8", "shape": list(i.shape)},
            "fit": list(get_args(RenderRequest.model_fields["fit"].annotation)),
            "fit_default": _default("fit"),
            "max_pixels": limits.max_image_pixels,
        },
    }


def _audio_input(i: RequestInputRecord, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """The audio, sent as encoded bytes and decoded to mono float samples at the declared rate."""
    return {
        "name": "audio",
        "datatype": "BYTES",
        "shape": [1],
        "parameters": {
            "accepts": ACCEPTED_AUDIO,
            "optional": True,
            "absent": "sample audio of `seconds`" if i.required else "silence of `seconds`",
            "decoded": {
                "name": i.name,
                "datatype": "FP32",
                "shape": [-1],
                "sample_rate": i.sample_rate,
                "samples_per_frame": i.samples_per_frame,
            },
            "max_seconds": max_seconds(build, limits),
        },
    }


def _noise_input(i: RequestInputRecord, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """The seed the noise input is drawn from (by the program's recipe)."""
    return {
        "name": "seed",
        "datatype": "INT64",
        "shape": [1],
        "parameters": {
            "optional": True,
            "default": _default("seed"),
            "noise_input": i.name,
            "noise_recipe": build.manifest.program.noise_recipe,
        },
    }


def _text_input(i: RequestInputRecord, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """A UTF-8 string, fed as bytes padded to the declared length."""
    return {
        "name": i.name,
        "datatype": "BYTES",
        "shape": [1],
        "parameters": {
            "optional": not i.required,
            "encoding": "utf-8",
            "max_bytes": i.shape[0],
            "decoded": {"name": i.name, "datatype": "UINT8", "shape": list(i.shape)},
        },
    }


def _tensor_input(i: RequestInputRecord, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """A raw tensor of the declared shape and dtype, sent as nested JSON arrays."""
    return {
        "name": i.name,
        "datatype": _OIP_TYPES.get(i.dtype, i.dtype.upper()),
        "shape": list(i.shape),
        "parameters": {"optional": not i.required, "json": "nested arrays"},
    }


# What a client sends for each kind of declared input (kinds not here, e.g. time, the pod makes itself).
_INPUT_KINDS: dict[str, Callable[[RequestInputRecord, LoadedBuild, Limits], dict[str, Any]]] = {
    "image": _image_input,
    "audio": _audio_input,
    "noise": _noise_input,
    "text": _text_input,
    "tensor": _tensor_input,
}


def _inputs(build: LoadedBuild, limits: Limits) -> list[dict[str, Any]]:
    """What ``/render`` takes, from the inputs the build's program declares."""
    p = build.manifest.program
    out = [_INPUT_KINDS[i.kind](i, build, limits) for i in p.request_inputs() if i.kind in _INPUT_KINDS]
    out.append(
        {
            "name": "seconds",
            "datatype": "FP64",
            "shape": [1],
            "parameters": {
                "optional": True,
                "default": _default("seconds"),
                "max": max_seconds(build, limits),
                "used": "only when no audio is sent" if p.input_of("audio") is not None else "the request's length",
            },
        }
    )
    return out


# numpy dtype -> the Open Inference Protocol's tensor datatype
_OIP_TYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}


def _outputs(build: LoadedBuild) -> list[dict[str, Any]]:
    p = build.manifest.program
    d = p.delivery()
    if d.kind == "audio":
        return [
            {
                "name": "audio",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {
                    "content_type": "audio/wav",
                    "route": "POST /render",
                    "streamed": "16-bit mono PCM WAV, chunked",
                    "samples": {"name": d.outputs[0], "datatype": "FP32", "shape": [-1]},
                    "audio_sample_rate": d.sample_rate,
                    "samples_per_frame": d.samples_per_frame,
                    "fps": p.fps,
                },
            }
        ]
    if d.kind == "tensors":
        return [
            {
                "name": "tensors",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {
                    "content_type": "application/x-npz",
                    "route": "POST /render",
                    "streamed": "one .npz after the last chunk, arrays named <output>/<chunk index>",
                    "outputs": list(d.outputs),
                    "fps": p.fps,
                },
            }
        ]
    sound = "H.264 + AAC" if p.input_of("audio") is not None else "H.264, no audio track"
    return [
        {
            "name": "video",
            "datatype": "BYTES",
            "shape": [1],
            "parameters": {
                "content_type": "video/mp4",
                "route": "POST /render",
                "streamed": f"fragmented MP4 ({sound}), chunked",
                "frames": {"name": p.deliver, "datatype": "UINT8", "shape": [-1, p.height, p.width, 3], "fps": p.fps},
                "audio_sample_rate": p.sample_rate,
            },
        }
    ]


def model_metadata(pod: Pod, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """``GET /v2/models/{name}``: OIP's fields, then ours (which build exactly, where from, its shapes)."""
    m = build.manifest
    return {
        "name": m.pipeline,
        "versions": [build.build_id],
        "platform": f"avatar-release/{m.platform.backend}",
        "inputs": _inputs(build, limits),
        "outputs": _outputs(build),
        "build_id": build.build_id,
        "digest": build.digest,
        "channel": pod.channel,
        "target": m.target,
        "fps": m.program.fps,
        "buckets": {b.name: b.frames for b in m.buckets},
    }


def model_ready(pod: Pod, build: LoadedBuild) -> tuple[int, dict[str, Any]]:
    """``GET /v2/models/{name}/ready``: the status of ``/readyz``, in OIP's body."""
    status, _ = readiness(pod)
    return status, {"name": build.manifest.pipeline, "versions": [build.build_id], "ready": status == 200}
