"""An in-memory registry for unit tests only (no persistence, one process)."""

from __future__ import annotations

import threading

from ._kv import KVRegistry

__all__ = ["MemoryRegistry"]


class MemoryRegistry(KVRegistry):
    def __init__(self, name: str = "memory"):
        self.uri = f"memory://{name}"
        self._data: dict[str, bytes] = {}
        self._mutex = threading.RLock()

    def _read(self, key, limit=None):
        data = self._data.get(key)
        if data is None:
            return None
        return data if limit is None else data[:limit]

    def _write_atomic(self, key, data):
        self._data[key] = bytes(data)

    def _append(self, key, line):
        self._data[key] = self._data.get(key, b"") + line

    def _delete(self, key):
        self._data.pop(key, None)

    def _size(self, key):
        return len(self._data.get(key, b""))

    def _age(self, key):
        return float("inf")  # no clock: everything counts as old enough to collect

    def _list(self, prefix):
        return sorted(k for k in self._data if k.startswith(prefix) and "/" not in k[len(prefix):])

    def _list_dirs(self, prefix):
        return sorted({prefix + k[len(prefix):].split("/", 1)[0] for k in self._data
                       if k.startswith(prefix) and "/" in k[len(prefix):]})

    def _lock(self):
        return self._mutex
