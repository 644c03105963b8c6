"""The serving pod: an ASGI app (starlette on uvicorn) over the runtime loader.

``start_pod`` verifies, loads and warms a build (ready only with 0 compiles); ``create_app``
is the HTTP surface (``/render`` streams fragmented MP4; ``/livez``, ``/readyz``, ``/healthz``,
``/metrics``; the Open Inference Protocol's ``/v2`` health and metadata; ``/openapi.json``);
``run_server`` runs it with SIGTERM draining and, with ``follow``, the channel followed in the
background. Errors are JSON ``{"error": code, "message": ...}`` (``CODES``).

Beside the pod, ``render_to_files`` (``avatar-release render``) loads a build as a pod would and
streams it into an MP4 (and PNG frames) on disk, one chunk held at a time.
"""

from ._app import AppConfig, create_app
from ._errors import CODES, ServeError
from ._files import (
    RENDER_MAX_AUDIO_SECONDS,
    RequestAudio,
    render_build_to_files,
    render_to_files,
    request_audio,
    request_image,
    request_values_from_text,
)
from ._fmp4 import MOVFLAGS, FragmentEncoder
from ._lifecycle import ServerConfig, run_server
from ._metrics import Metrics
from ._pod import Pod, start_pod, warm_up
from ._request import Limits, RenderRequest, request_model

__all__ = [
    "AppConfig",
    "CODES",
    "FragmentEncoder",
    "Limits",
    "MOVFLAGS",
    "Metrics",
    "Pod",
    "RENDER_MAX_AUDIO_SECONDS",
    "RenderRequest",
    "RequestAudio",
    "ServeError",
    "ServerConfig",
    "create_app",
    "render_build_to_files",
    "render_to_files",
    "request_audio",
    "request_image",
    "request_values_from_text",
    "request_model",
    "run_server",
    "start_pod",
    "warm_up",
]
