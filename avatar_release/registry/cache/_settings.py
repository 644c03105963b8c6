"""Where the node cache lives, how large it may grow and how many pulls run at once: the pod
commands' ``--cache-dir`` / ``--cache-size`` / ``--pull-concurrency``, which set (for the process
and every one it starts) the environment variables read here."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from ..._paths import APP
from ...errors import InputError
from .._protocol import Registry
from ..oci import OciRegistry
from ._cached import CachedRegistry
from ._node import NodeCache

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_SIZE_ENV",
    "PULL_CONCURRENCY_ENV",
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_CONCURRENCY",
    "default_cache_dir",
    "parse_size",
    "node_cache",
    "with_node_cache",
]

CACHE_DIR_ENV = "AVATAR_RELEASE_CACHE_DIR"
CACHE_SIZE_ENV = "AVATAR_RELEASE_CACHE_SIZE"
PULL_CONCURRENCY_ENV = "AVATAR_RELEASE_PULL_CONCURRENCY"
DEFAULT_CACHE_SIZE = 50 << 30  # room for two builds of a production model (a channel swap keeps both)
DEFAULT_CONCURRENCY = 8  # side-by-side blob pulls; requests keeps 10 connections per host

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "ti": 1 << 40,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def default_cache_dir() -> Path:
    """The user's cache directory for avatar-release blobs (Linux: ``$XDG_CACHE_HOME/avatar-release/blobs``,
    else ``~/.cache/avatar-release/blobs``)."""
    return platformdirs.user_cache_path(APP, appauthor=False) / "blobs"


def parse_size(text: str, *, where: str = CACHE_SIZE_ENV) -> int:
    """``50GiB``, ``500M``, ``1e9``-free plain bytes ``1073741824`` -> bytes; InputError otherwise."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise InputError(
            f"{where}: {text!r} is not a size; expected a positive number of bytes with an optional "
            "unit, e.g. 50GiB, 500MiB or 20G"
        )
    return int(float(m.group(1)) * _UNITS[unit])


def _concurrency(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 64:
        raise InputError(f"{PULL_CONCURRENCY_ENV}: {text!r} is not a number of pulls from 1 to 64; e.g. 8")
    return int(text)


def node_cache(environ: Mapping[str, str] | None = None) -> NodeCache | None:
    """The node cache the environment names (``AVATAR_RELEASE_CACHE_DIR``), or None: no cache."""
    env = os.environ if environ is None else environ
    root = env.get(CACHE_DIR_ENV, "").strip()
    if not root:
        return None
    size = parse_size(env[CACHE_SIZE_ENV]) if env.get(CACHE_SIZE_ENV, "").strip() else DEFAULT_CACHE_SIZE
    pulls = (
        _concurrency(env[PULL_CONCURRENCY_ENV]) if env.get(PULL_CONCURRENCY_ENV, "").strip() else DEFAULT_CONCURRENCY
    )
    return NodeCache(Path(root).expanduser(), max_bytes=size, concurrency=pulls)


def with_node_cache(registry: Registry, environ: Mapping[str, str] | None = None) -> Registry:
    """``registry`` with its blobs read through the node cache, when it is a remote store (OCI,
    Artifact Registry) and a cache is configured; otherwise ``registry`` itself (a directory store
    is already on this node's disk)."""
    if not isinstance(registry, OciRegistry):
        return registry
    cache = node_cache(environ)
    return CachedRegistry(registry, cache) if cache is not None else registry
