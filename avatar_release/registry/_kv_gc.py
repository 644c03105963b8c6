"""Garbage collection's view of a key/value store (the Collectable protocol of :mod:`._protocol`).

Public methods, so ``ops.gc`` reaches nothing private, over the primitives the store supplies
(:class:`._kv.KVRegistry` lists them): listing, age, size, delete, and the store-wide lock.
"""

from __future__ import annotations

import abc
import contextlib

from .._digest import hex_of
from ._protocol import check_name

__all__ = ["KVCollection"]


class KVCollection(abc.ABC):
    """What gc needs, written once over the key/value primitives."""

    @abc.abstractmethod
    def _list(self, prefix: str) -> list[str]:
        """Keys directly under ``prefix``."""

    @abc.abstractmethod
    def _list_dirs(self, prefix: str) -> list[str]:
        """Sub-folders directly under ``prefix`` (record namespaces), as keys."""

    @abc.abstractmethod
    def _lock(self) -> contextlib.AbstractContextManager[None]:
        """The store-wide lock that serializes channel moves, commits and gc."""

    @abc.abstractmethod
    def _delete(self, key: str) -> None:
        """Remove ``key`` (absent is fine); used only by garbage collection."""

    @abc.abstractmethod
    def _age(self, key: str) -> float:
        """Seconds since ``key`` was written or touched (gc's grace period)."""

    @abc.abstractmethod
    def _size(self, key: str) -> int:
        """Size of ``key`` in bytes, without reading it."""

    @staticmethod
    def _blob_key(digest: str) -> str:
        return f"blobs/sha256/{hex_of(digest)}"

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """The store-wide lock: no channel move, build commit or record update interleaves."""
        return self._lock()

    def record_namespaces(self) -> list[str]:
        return sorted(k.rsplit("/", 1)[-1] for k in self._list_dirs("records/"))

    def list_blob_digests(self) -> list[str]:
        return ["sha256:" + k.rsplit("/", 1)[-1] for k in self._list("blobs/sha256/")]

    def blob_age(self, digest: str) -> float:
        return self._age(self._blob_key(digest))

    def blob_size(self, digest: str) -> int:
        return self._size(self._blob_key(digest))

    def delete_blob(self, digest: str) -> None:
        self._delete(self._blob_key(digest))

    def delete_build(self, build_id: str) -> None:
        """Remove a build's reference (its blobs go with the next collection)."""
        self._delete(f"builds/{check_name('build', build_id)}")

    def delete_record(self, namespace: str, name: str) -> None:
        self._delete(f"records/{check_name('record namespace', namespace)}/{check_name('record', name)}")
