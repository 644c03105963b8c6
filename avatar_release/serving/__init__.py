"""The serving pod: an ASGI app (starlette on uvicorn) over the runtime loader.

``start_pod`` verifies, loads and warms a build (ready only with 0 compiles); ``create_app``
is the HTTP surface (``/render`` streams fragmented MP4; ``/livez``, ``/readyz``, ``/healthz``,
``/metrics``; the Open Inference Protocol's ``/v2`` health and metadata; ``/openapi.json``);
``run_server`` runs it with SIGTERM draining and, with ``follow``, the channel followed in the
background. Errors are JSON ``{"error": code, "message": ...}`` (``CODES``).

Beside the pod, ``render_to_files`` (``avatar-release render``) loads a build as a pod would and
streams it into an MP4 (and PNG frames) on disk, one chunk held at a time.

Each name is imported from its module on first use (``__getattr__``), so ``start_pod`` does not
bring the HTTP stack (starlette, uvicorn, the app) with it: ``serve`` imports that on a thread
while the build loads (``start_pod(beside=...)``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# each public name and the module that defines it
_HOME = {
    "AppConfig": "_app",
    "create_app": "_app",
    "CODES": "_errors",
    "ServeError": "_errors",
    "RENDER_MAX_AUDIO_SECONDS": "_files",
    "RequestAudio": "_files",
    "render_build_to_files": "_files",
    "render_to_files": "_files",
    "request_audio": "_files",
    "request_image": "_files",
    "request_values_from_text": "_files",
    "MOVFLAGS": "_fmp4",
    "FragmentEncoder": "_fmp4",
    "ServerConfig": "_lifecycle",
    "run_server": "_lifecycle",
    "Metrics": "_metrics",
    "Pod": "_pod",
    "start_pod": "_pod",
    "warm_up": "_pod",
    "Limits": "_request",
    "RenderRequest": "_request",
    "request_model": "_request",
}

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


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
