"""Registries: one protocol, several stores. ``open_registry`` picks one from a URI."""

from __future__ import annotations

import os

from ..errors import InputError
from ..records import Manifest, parse_record
from ._discover import RegistryChoice, config_files, find_registry, load_config
from ._gar import GarRegistry
from ._local import LocalRegistry
from ._memory import MemoryRegistry
from ._protocol import CHANNELS, BuildRef, Collectable, NodeBlobs, Registry, Resolved, check_name
from .cache import CachedRegistry, NodeCache, Prefetching, with_node_cache
from .oci import OciRegistry

__all__ = [
    "Registry",
    "Collectable",
    "NodeBlobs",
    "Resolved",
    "BuildRef",
    "LocalRegistry",
    "MemoryRegistry",
    "OciRegistry",
    "GarRegistry",
    "CHANNELS",
    "check_name",
    "open_registry",
    "default_registry_uri",
    "DEFAULT_REGISTRY",
    "read_manifest",
    "find_registry",
    "RegistryChoice",
    "config_files",
    "load_config",
    "CachedRegistry",
    "NodeCache",
    "Prefetching",
    "with_node_cache",
]

DEFAULT_REGISTRY = ".avatar-release"


def default_registry_uri(explicit: str | None = None) -> str:
    return explicit or os.environ.get("AVATAR_RELEASE_REGISTRY") or DEFAULT_REGISTRY


def open_registry(uri: str | None = None, *, create: bool = True) -> Registry:
    """``PATH`` or ``file://PATH`` -> local directory; ``memory://NAME`` -> in-memory fake;
    ``oci://HOST[:PORT]/REPO`` (``oci+http://``, ``oci+https://``) -> an OCI registry;
    ``gar://projects/P/locations/L/repositories/R`` -> Google Artifact Registry.

    Remote registries are contacted on first use, not here; ``create`` does not apply to them.
    """
    uri = default_registry_uri(uri)
    if uri.startswith(("oci://", "oci+http://", "oci+https://")):
        return OciRegistry(uri)
    if uri.startswith("gar://"):
        return GarRegistry(uri)
    if uri.startswith("memory://"):
        return MemoryRegistry(uri.removeprefix("memory://") or "memory")
    if uri.startswith("file://"):
        return LocalRegistry(uri.removeprefix("file://"), create=create)
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise InputError(
            f"registry {uri!r}: unsupported scheme {scheme!r}; supported: a directory path, file://PATH, memory://NAME, "
            "oci://HOST[:PORT]/REPO, gar://projects/P/locations/L/repositories/R"
        )
    return LocalRegistry(uri, create=create)


def read_manifest(registry: Registry, ref: str) -> tuple[Resolved, Manifest]:
    """Resolve ``ref`` once and parse the manifest it names: (Resolved, Manifest)."""
    resolved = registry.resolve(ref)
    data = registry.get_manifest_bytes(resolved.digest)
    return resolved, parse_record(Manifest, data, where=f"manifest {resolved.digest}")
