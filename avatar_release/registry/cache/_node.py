"""A node cache: blobs pulled once from a remote store into a directory, bounded, least recently
used evicted first, safe to share between processes (see :mod:`._entries` for the rules)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterable, Iterator, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...errors import RegistryError
from .._protocol import Registry
from ._entries import Entries, Mapped

__all__ = ["NodeCache", "CacheStats", "BlobLike"]


class BlobLike(Protocol):
    """What a pull needs of a blob reference (a ``records.BlobRef`` is one)."""

    digest: str
    size: int


@dataclass
class CacheStats:
    """What this process's cache did: entries found, blobs pulled from the store, bytes pulled,
    entries evicted and seconds spent pulling (wall time of the side-by-side pulls)."""

    hits: int = 0
    pulls: int = 0
    pulled_bytes: int = 0
    evicted: int = 0
    pull_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def to_json(self) -> dict:
        return {
            "hits": self.hits,
            "pulls": self.pulls,
            "pulled_bytes": self.pulled_bytes,
            "evicted": self.evicted,
            "pull_seconds": round(self.pull_seconds, 4),
        }


class NodeCache:
    """Blobs of remote stores on this node's disk, at most ``max_bytes`` of them.

    ``concurrency`` blobs are pulled side by side by :meth:`prefetch` (each one a stream through
    the store's size and sha256 check into its own temporary file).
    """

    def __init__(self, root: str | os.PathLike, *, max_bytes: int, concurrency: int = 8):
        if max_bytes <= 0:
            raise ValueError(f"cache size must be positive, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes, self.concurrency = max_bytes, max(1, concurrency)
        self.entries = Entries(self.root)
        self.stats = CacheStats()
        self._ready = False

    def __repr__(self) -> str:
        return f"NodeCache({str(self.root)!r}, max_bytes={self.max_bytes}, concurrency={self.concurrency})"

    def _ensure_dirs(self) -> None:
        if not self._ready:
            try:
                self.entries.ensure()
            except OSError as e:
                raise RegistryError(
                    f"node cache {self.root}: cannot create it ({e}); give a writable directory "
                    "with --cache-dir or AVATAR_RELEASE_CACHE_DIR"
                ) from None
            self._ready = True

    # ---- one blob ---------------------------------------------------------------------------------
    def open(self, store: Registry, digest: str, size: int, *, keep: Set[str] = frozenset()) -> Mapped:
        """The blob opened from the cache, pulled from ``store`` first if it is not there (or was
        damaged, which is found and dropped on the way); a pull evicts others, never ``keep``."""
        self._ensure_dirs()
        for _ in range(3):  # evicted (or found damaged) between the pull and the open: pull again
            mapped = self._open(digest, size)
            if mapped is not None:
                self.stats.add(hits=1)
                return mapped
            if self._pull(store, digest, size):
                mapped = self._open(digest, size)
                if mapped is not None:
                    self.evict(keep=keep)  # after the open: an entry held is never evicted
                    return mapped
        raise RegistryError(
            f"node cache {self.root}: blob {digest} was evicted three times while being read; "
            "the cache is smaller than what the processes sharing it load at once — give it "
            "more room (--cache-size / AVATAR_RELEASE_CACHE_SIZE)"
        )

    def _open(self, digest: str, size: int) -> Mapped | None:
        try:
            return self.entries.open(digest, size)
        except OSError as e:
            raise RegistryError(
                f"node cache {self.root}: cannot read blob {digest} ({e.strerror or e}); check the "
                "directory's permissions, or give another with --cache-dir"
            ) from None

    def has(self, digest: str, size: int) -> bool:
        path = self.entries.path(digest)
        with contextlib.suppress(FileNotFoundError):
            return path.stat().st_size == size
        return False

    def pull(self, store: Registry, digest: str, size: int) -> bool:
        """Pull ``digest`` into the cache unless it is there (or another process pulls it meanwhile:
        this one then waits for it); True if this one pulled it."""
        self._ensure_dirs()
        return self._pull(store, digest, size)

    def _pull(self, store: Registry, digest: str, size: int) -> bool:
        with self.entries.pulling(digest):
            if self.has(digest, size):
                return False
            t0 = time.perf_counter()
            try:  # streamed into a file through the store's size and sha256 check, renamed in only if right
                with self.entries.insert_path(digest) as tmp:
                    store.stream_blob(digest, size, lambda pieces: _write(tmp, pieces))
                self.entries.seal(digest)
            except OSError as e:
                raise RegistryError(
                    f"node cache {self.root}: cannot write blob {digest} ({size} bytes: "
                    f"{e.strerror or e}); free space there, lower --cache-size, or give another "
                    "directory with --cache-dir"
                ) from None
            self.stats.add(pulls=1, pulled_bytes=size, pull_seconds=time.perf_counter() - t0)
            return True

    # ---- a build's blobs, side by side ----------------------------------------------------------
    def prefetch(self, store: Registry, blobs: Iterable[BlobLike]) -> CacheStats:
        """Pull every blob not cached yet, ``concurrency`` at a time; first make room for them
        (least recently used first, never one of these). Returns what this call did."""
        self._ensure_dirs()
        wanted = {b.digest: b.size for b in blobs}
        missing = {d: s for d, s in wanted.items() if not self.has(d, s)}
        before = CacheStats(**{k: getattr(self.stats, k) for k in ("hits", "pulls", "pulled_bytes", "evicted")})
        if missing:
            self.evict(self.max_bytes - sum(missing.values()), keep=set(wanted))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(
                max_workers=min(self.concurrency, len(missing)), thread_name_prefix="cache-pull"
            ) as pool:
                for f in [pool.submit(self._pull, store, d, s) for d, s in missing.items()]:
                    f.result()
            wall = time.perf_counter() - t0
            self.evict()
        else:
            wall = 0.0
        for d in wanted:
            if d not in missing:
                self.entries.touch(d.split(":", 1)[1])
        return CacheStats(
            hits=len(wanted) - len(missing),
            pulls=self.stats.pulls - before.pulls,
            pulled_bytes=self.stats.pulled_bytes - before.pulled_bytes,
            evicted=self.stats.evicted - before.evicted,
            pull_seconds=wall,
        )

    # ---- the size bound ---------------------------------------------------------------------------
    def size(self) -> int:
        return sum(e.size for e in self.entries.listing())

    def evict(self, target: int | None = None, *, keep: Set[str] = frozenset()) -> int:
        """Remove least recently used entries until the cache holds at most ``target`` bytes
        (default: its bound), skipping entries in use and those in ``keep``; one process at a
        time evicts. Returns how many were removed."""
        self._ensure_dirs()
        target = self.max_bytes if target is None else max(0, target)
        with _locked(self.root / "evict.lock"):
            self.entries.sweep()
            listing = sorted(self.entries.listing(), key=lambda e: e.last_used)
            total, removed = sum(e.size for e in listing), 0
            kept = {d.split(":", 1)[1] for d in keep}
            for e in listing:
                if total <= target:
                    break
                if e.hex in kept:
                    continue
                if self.entries.remove_if_idle(e.hex):
                    total -= e.size
                    removed += 1
        self.stats.add(evicted=removed)
        return removed


def _write(tmp: Path, pieces: Iterator[Any]) -> None:
    """A ``stream_blob`` sink into ``tmp``: starts over when the store retries."""
    with open(tmp, "wb") as f:
        for piece in pieces:
            f.write(piece)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
