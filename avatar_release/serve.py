"""Kept for imports of the old module: the serving pod now lives in :mod:`avatar_release.serving`
(an ASGI app on uvicorn that streams fragmented MP4). ``start_pod`` is the same call."""

from .serving import Pod as ServingPod
from .serving import start_pod

__all__ = ["ServingPod", "start_pod"]
