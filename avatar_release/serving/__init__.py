"""The serving pod: an ASGI app (starlette on uvicorn) over the runtime loader.

``start_pod`` verifies, loads and warms a build (ready only with 0 compiles); ``create_app``
is the HTTP surface (``/render`` streams fragmented MP4; ``/livez``, ``/readyz``, ``/healthz``,
``/metrics``); ``run_server`` runs it with SIGTERM draining and, with ``follow``, the channel
followed in the background. Errors are JSON ``{"error": code, "message": ...}`` (``CODES``).
"""

from ._app import AppConfig, create_app
from ._errors import CODES, ServeError
from ._fmp4 import MOVFLAGS, FragmentEncoder
from ._lifecycle import ServerConfig, run_server
from ._metrics import Metrics
from ._pod import Pod, start_pod, warm_up
from ._request import Limits, RenderRequest

__all__ = [
    "AppConfig",
    "CODES",
    "FragmentEncoder",
    "Limits",
    "MOVFLAGS",
    "Metrics",
    "Pod",
    "RenderRequest",
    "ServeError",
    "ServerConfig",
    "create_app",
    "run_server",
    "start_pod",
    "warm_up",
]
