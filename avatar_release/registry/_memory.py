"""An in-memory registry for unit tests only (no persistence, one process)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ._kv import KVRegistry

__all__ = ["MemoryRegistry"]


class MemoryRegistry(KVRegistry):
    def __init__(self, name: str = "memory"):
        self.uri = f"memory://{name}"
        self._data: dict[str, bytes] = {}
        self._mutex = threading.RLock()

    def _read(self, key: str, limit: int | None = None) -> bytes | None:
        data = self._data.get(key)
        if data is None:
            return None
        return data if limit is None else data[:limit]

    def _write_atomic(self, key: str, data: bytes) -> None:
        self._data[key] = bytes(data)

    def _append(self, key: str, line: bytes) -> None:
        self._data[key] = self._data.get(key, b"") + line

    def _delete(self, key: str) -> None:
        self._data.pop(key, None)

    def _size(self, key: str) -> int:
        return len(self._data.get(key, b""))

    def _age(self, key: str) -> float:
        return float("inf")  # no clock: everything counts as old enough to collect

    def _list(self, prefix: str) -> list[str]:
        return sorted(k for k in self._data if k.startswith(prefix) and "/" not in k[len(prefix) :])

    def _list_dirs(self, prefix: str) -> list[str]:
        return sorted(
            {
                prefix + k[len(prefix) :].split("/", 1)[0]
                for k in self._data
                if k.startswith(prefix) and "/" in k[len(prefix) :]
            }
        )

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with self._mutex:
            yield
