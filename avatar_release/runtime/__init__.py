"""The serving-pod runtime: load a build, verify it, and stream chunks with zero compiles.

``verify_build`` (``avatar-release verify``) checks a build as the loader would, running nothing.

Imports neither torch nor torchax, nor anything from ``avatar_release.compile``.
"""

from ._assemble import assemble
from ._blobs import BlobCheck, build_blobs, decompress
from ._feed import ChunkAudio, feed_chunks, feed_frames
from ._guard import COMPILE_EVENT, CompileGuard
from ._load import LoadedBuild, LoadTimings, check_environment, devices_for, load
from ._pace import Pace, PaceTally, pace_of
from ._stream import Chunk, ChunkTiming, StreamReport, chunk_noise, plan_chunks, render, request_values, stream
from ._trusted import TrustConfig, check_trusted, resolve_channel, revocation_keys
from ._verify import check_blobs, verify_build

__all__ = [
    "load",
    "assemble",
    "LoadedBuild",
    "LoadTimings",
    "TrustConfig",
    "resolve_channel",
    "check_environment",
    "devices_for",
    "check_trusted",
    "revocation_keys",
    "BlobCheck",
    "build_blobs",
    "check_blobs",
    "decompress",
    "stream",
    "render",
    "Chunk",
    "ChunkTiming",
    "StreamReport",
    "plan_chunks",
    "feed_chunks",
    "feed_frames",
    "request_values",
    "ChunkAudio",
    "chunk_noise",
    "CompileGuard",
    "COMPILE_EVENT",
    "verify_build",
    "Pace",
    "pace_of",
    "PaceTally",
]
