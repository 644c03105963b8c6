"""The serving-pod runtime: load a build, verify it, and stream chunks with zero compiles.

Imports neither torch nor torchax, nor anything from ``avatar_release.compile``.
"""

from ._blobs import BlobCheck, build_blobs, check_blobs, fetch_verified
from ._guard import COMPILE_EVENT, CompileGuard
from ._load import LoadedBuild, LoadTimings, TrustConfig, check_environment, load
from ._stream import Chunk, StreamReport, chunk_noise, plan_chunks, render, stream

__all__ = [
    "load",
    "LoadedBuild",
    "LoadTimings",
    "TrustConfig",
    "check_environment",
    "BlobCheck",
    "build_blobs",
    "check_blobs",
    "fetch_verified",
    "stream",
    "render",
    "Chunk",
    "StreamReport",
    "plan_chunks",
    "chunk_noise",
    "CompileGuard",
    "COMPILE_EVENT",
]
