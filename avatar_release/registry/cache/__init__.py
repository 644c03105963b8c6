"""The node cache: each blob of a remote registry pulled once per node, verified on entry, kept
in a bounded directory that pods on the node share, and read back mapped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from ._cached import CachedRegistry
from ._node import BlobLike, CacheStats, NodeCache
from ._settings import (
    CACHE_DIR_ENV,
    CACHE_SIZE_ENV,
    DEFAULT_CACHE_SIZE,
    DEFAULT_CONCURRENCY,
    PULL_CONCURRENCY_ENV,
    default_cache_dir,
    node_cache,
    parse_size,
    with_node_cache,
)

__all__ = [
    "CachedRegistry",
    "NodeCache",
    "CacheStats",
    "BlobLike",
    "Prefetching",
    "CACHE_DIR_ENV",
    "CACHE_SIZE_ENV",
    "PULL_CONCURRENCY_ENV",
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_CONCURRENCY",
    "default_cache_dir",
    "node_cache",
    "parse_size",
    "with_node_cache",
]


@runtime_checkable
class Prefetching(Protocol):
    """A store that can pull a build's blobs side by side before they are read (the node cache)."""

    def prefetch(self, blobs: Iterable[BlobLike]) -> CacheStats: ...
