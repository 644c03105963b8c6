"""The local-directory registry, the embedded default (``./.avatar-release``).

Layout::

    blobs/sha256/<hex>        content-addressed blobs (executables, weights, manifests)
    builds/<build-id>         {"build_id", "digest", "published_at"}: the commit marker
    channels/<name>.json      current state + the entry that put it there
    history.jsonl             append-only move history
    records/<ns>/<name>       gate results and reviews
    tmp/                      staging area for atomic writes (leftovers swept on open)
    .lock                     flock()ed by every writer that needs mutual exclusion

Every write goes to ``tmp/``, is fsynced, renamed into place and the directory fsynced,
so kill -9 at any instant leaves the old or the new state, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .. import _atomic
from ..errors import IntegrityError, NotFoundError, RegistryError
from ._blobcheck import BLOB_CHUNK, check_size
from ._kv import KVRegistry
from ._lock import DEFAULT_LOCK_TIMEOUT, FileLock

__all__ = ["LocalRegistry"]


class LocalRegistry(KVRegistry):
    def __init__(self, root: str | os.PathLike, *, create: bool = True, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        self.root = Path(root).absolute()
        self.uri = str(self.root)
        # O_NOFOLLOW: a symlinked .lock would have writers create or lock a file outside the store
        self._writer = FileLock(self.root / ".lock", timeout=lock_timeout, what=f"registry {self.root}", nofollow=True)
        if create:
            try:
                for sub in ("blobs/sha256", "builds", "channels", "records", "tmp"):
                    (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RegistryError(
                    f"registry {self.root}: cannot create it ({e.strerror}); pass a writable "
                    "--registry or set AVATAR_RELEASE_REGISTRY"
                ) from None
            # What a killed writer left in tmp/ (never a write in flight: only old files).
            with contextlib.suppress(OSError):
                self.sweep()
        elif not (self.root / "builds").is_dir():
            raise NotFoundError(
                f"registry {self.root}: not found (no builds/ directory there); create one with "
                "`avatar-release compile --pipeline PIPELINE --target TARGET --registry PATH` "
                "(inside a project, the directory holding manifests/, or with --project DIR), or "
                "name an existing one with --registry (see `avatar-release registries`)"
            )

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root.resolve() not in p.parents:
            raise RegistryError(f"registry key {key!r} escapes the registry root")
        return p

    def _read(self, key: str, limit: int | None = None) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read() if limit is None else f.read(limit)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RegistryError(f"registry {self.root}: cannot read {key} ({e.strerror})") from None

    def _read_pieces(self, key: str, limit: int) -> Iterator[bytes] | None:
        """The file at ``key`` a chunk at a time (at most ``limit`` bytes), or None when absent."""
        try:
            f = open(self._path(key), "rb")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RegistryError(f"registry {self.root}: cannot read {key} ({e.strerror})") from None

        def pieces() -> Iterator[bytes]:
            with f:
                left = limit
                while left > 0:
                    piece = f.read(min(BLOB_CHUNK, left))
                    if not piece:
                        return
                    left -= len(piece)
                    yield piece

        return pieces()

    def read_blob_into(self, digest: str, size: int, out: memoryview) -> None:
        """The blob file read straight into ``out`` (one copy out of the page cache, no hash: the
        caller checks the digest its signed manifest names; see ``NodeBlobs``)."""
        key = self._blob_key(digest)
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                got = 0
                while got < size:
                    k = f.readinto(out[got:size])
                    if not k:
                        break
                    got += k
                if got == size and f.read(1):
                    got += 1
        except FileNotFoundError:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}") from None
        except OSError as e:
            raise RegistryError(f"registry {self.root}: cannot read {key} ({e.strerror})") from None
        check_size(got, digest, size, self.uri)

    def _tmp_dir(self) -> Path:
        """The staging area, refused when it is a symlink: writes would land wherever it points."""
        tmp = self.root / "tmp"
        if tmp.is_symlink():
            raise IntegrityError(
                f"registry {self.root}: {tmp} is a symlink (to {os.readlink(tmp)}); a store writes "
                f"only inside itself. Replace it with a directory: rm {tmp} && mkdir {tmp}"
            )
        return tmp

    def _write_atomic(self, key: str, data: bytes) -> None:
        dest = self._path(key)
        tmp_dir = self._tmp_dir()
        try:
            _atomic.write_bytes(dest, data, tmp_dir=tmp_dir)
        except OSError as e:
            raise RegistryError(
                f"registry {self.root}: cannot write {key} ({e.strerror}); check permissions and free space"
            ) from None

    def sweep(self, older_than: float = 3600.0) -> list[Path]:
        """Remove temporary files a killed writer left in ``tmp/`` (older than ``older_than`` s)."""
        if (self.root / "tmp").is_symlink():
            return []  # never sweep wherever it points; writes refuse it (_tmp_dir)
        return _atomic.sweep(self.root / "tmp", older_than=older_than)

    def _append(self, key: str, line: bytes) -> None:
        path = self._path(key)
        try:
            with open(path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise RegistryError(f"registry {self.root}: cannot append to {key} ({e.strerror})") from None

    def _delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise RegistryError(f"registry {self.root}: cannot delete {key} ({e.strerror})") from None

    def _age(self, key: str) -> float:
        """Seconds since ``key`` was last written or re-put (put_blob touches existing blobs)."""
        try:
            return time.time() - self._path(key).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def _size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return 0

    def _touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self._path(key))

    def _list(self, prefix: str) -> list[str]:
        d = self._path(prefix.rstrip("/"))
        if not d.is_dir():
            return []
        return sorted(f"{prefix}{p.name}" for p in d.iterdir() if p.is_file())

    def _list_dirs(self, prefix: str) -> list[str]:
        d = self._path(prefix.rstrip("/"))
        if not d.is_dir():
            return []
        return sorted(f"{prefix}{p.name}" for p in d.iterdir() if p.is_dir())

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return self._writer.hold()
