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

from typing import Any, get_args

from .. import __version__
from ..media import ACCEPTED_AUDIO, ACCEPTED_IMAGES
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
        raise ServeError("not_found", f"no model {name[:100]!r} here; this pod serves {build.manifest.pipeline!r} "
                                      f"(build {build.build_id})")
    return build


def max_seconds(build: LoadedBuild, limits: Limits) -> float:
    """The longest video one request gets from this build (``decode_inputs`` refuses past it)."""
    fps = build.manifest.program.fps
    return limits.max_frames(fps) / fps


def _default(field: str) -> Any:
    return RenderRequest.model_fields[field].default


def _inputs(build: LoadedBuild, limits: Limits) -> list[dict[str, Any]]:
    p = build.manifest.program
    fits = list(get_args(RenderRequest.model_fields["fit"].annotation))
    return [
        {"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {
            "accepts": ACCEPTED_IMAGES, "optional": True, "absent": "the sample picture",
            "decoded": {"name": p.image_input, "datatype": "UINT8", "shape": [p.height, p.width, 3]},
            "fit": fits, "fit_default": _default("fit"), "max_pixels": limits.max_image_pixels}},
        {"name": "audio", "datatype": "BYTES", "shape": [1], "parameters": {
            "accepts": ACCEPTED_AUDIO, "optional": True, "absent": "sample audio of `seconds`",
            "decoded": {"name": p.audio_input, "datatype": "FP32", "shape": [-1], "sample_rate": p.sample_rate,
                        "samples_per_frame": p.samples_per_frame},
            "max_seconds": max_seconds(build, limits)}},
        {"name": "seed", "datatype": "INT64", "shape": [1], "parameters": {
            "optional": True, "default": _default("seed"), "noise_input": p.noise_input,
            "noise_recipe": p.noise_recipe}},
        {"name": "seconds", "datatype": "FP64", "shape": [1], "parameters": {
            "optional": True, "default": _default("seconds"), "max": max_seconds(build, limits),
            "used": "only when no audio is sent"}},
    ]


def _outputs(build: LoadedBuild) -> list[dict[str, Any]]:
    p = build.manifest.program
    return [{"name": "video", "datatype": "BYTES", "shape": [1], "parameters": {
        "content_type": "video/mp4", "route": "POST /render", "streamed": "fragmented MP4 (H.264 + AAC), chunked",
        "frames": {"name": p.deliver, "datatype": "UINT8", "shape": [-1, p.height, p.width, 3], "fps": p.fps},
        "audio_sample_rate": p.sample_rate}}]


def model_metadata(pod: Pod, build: LoadedBuild, limits: Limits) -> dict[str, Any]:
    """``GET /v2/models/{name}``: OIP's fields, then ours (which build exactly, where from, its shapes)."""
    m = build.manifest
    return {"name": m.pipeline, "versions": [build.build_id], "platform": f"avatar-release/{m.platform.backend}",
            "inputs": _inputs(build, limits), "outputs": _outputs(build),
            "build_id": build.build_id, "digest": build.digest, "channel": pod.channel, "target": m.target,
            "fps": m.program.fps, "buckets": {b.name: b.frames for b in m.buckets}}


def model_ready(pod: Pod, build: LoadedBuild) -> tuple[int, dict[str, Any]]:
    """``GET /v2/models/{name}/ready``: the status of ``/readyz``, in OIP's body."""
    status, _ = readiness(pod)
    return status, {"name": build.manifest.pipeline, "versions": [build.build_id], "ready": status == 200}
