"""The writer lock every store takes: an exclusive ``flock`` on one file, with a timeout.

One lock for the local directory (``<root>/.lock``) and the OCI stores (a file per registry
host + repository under ``$AVATAR_RELEASE_LOCK_DIR``): re-entrant within a thread, so a writer
may call another writer's step while holding it; exclusive between threads and processes
(flock belongs to an open file description, and each holder opens the file itself); and never
waiting forever — after ``timeout`` seconds a :class:`RegistryError` says who holds it and what
to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import IntegrityError, RegistryError

__all__ = ["FileLock", "DEFAULT_LOCK_TIMEOUT"]

DEFAULT_LOCK_TIMEOUT = 120.0
_POLL = 0.02


class FileLock:
    """An exclusive, re-entrant, time-limited flock on ``path``; ``what`` names the store in errors.

    ``nofollow``: refuse a symlinked lock file (a store's own lock must live inside the store).
    """

    def __init__(
        self, path: str | os.PathLike, *, timeout: float = DEFAULT_LOCK_TIMEOUT, what: str, nofollow: bool = False
    ):
        self.path, self.timeout, self.what, self.nofollow = Path(path), timeout, what, nofollow
        self._tls = threading.local()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if getattr(self._tls, "depth", 0):
            self._tls.depth += 1
            try:
                yield
            finally:
                self._tls.depth -= 1
            return
        fd = self._open()
        try:
            self._acquire(fd)
            self._tls.depth = 1
            try:
                yield
            finally:
                self._tls.depth = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __call__(self) -> contextlib.AbstractContextManager[None]:
        return self.hold()

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | (os.O_NOFOLLOW if self.nofollow else 0)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o644)
        except OSError as e:
            if self.nofollow and self.path.is_symlink():
                raise IntegrityError(
                    f"{self.what}: {self.path} is a symlink (to {os.readlink(self.path)}); refused. "
                    f"Remove it (rm {self.path}): the store recreates its lock file"
                ) from None
            raise RegistryError(
                f"{self.what}: cannot open the writer lock {self.path} ({e.strerror}); make it writable, or for "
                "an OCI store set AVATAR_RELEASE_LOCK_DIR to a writable directory shared by this machine's writers"
            ) from None

    def _acquire(self, fd: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"{self.what}: another writer has held the lock {self.path} for over {self.timeout:.0f}s "
                        "(a promotion, publish or gc in another process); wait for it to finish, or stop it and "
                        "retry"
                    ) from None
                time.sleep(_POLL)
