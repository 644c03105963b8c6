"""The node cache's entries: one file per blob, keyed by its sha256, shared by every process on a node.

Layout under the cache directory::

    blobs/<hex>     the blob's bytes, written to a temporary name and renamed in only
                    once the store checked its size and sha256 (the OCI descriptor's digest)
    seals/<hex>     "inode size mtime_ns ctime_ns boot_id" of the entry as it was when verified; its
                    own mtime is the entry's last use (the LRU clock)
    locks/<hex>     held (flock) by the one process pulling that blob; removed when it is done

Why the seal: an entry is hashed once, when it enters the node. A later read checks the seal, a
``stat`` away: any write to the file through the file system (a process, a torn copy, a tamperer)
moves its change time, and an entry whose seal does not match is hashed again before anything
reads it (and dropped if it fails). Decay of the medium under an unchanged seal is caught by the
loader, which checks every byte it uses against the signed manifest's digest.

Entries are not fsynced (a cache can pull a blob again; a disk flush per blob is not worth it):
bytes a kernel crash or a power loss could lose are lost only with a reboot, and a seal names the
boot it was written in (``/proc/sys/kernel/random/boot_id``), so after a reboot every entry is
hashed again on its first read, and dropped if it is not whole.

Sharing rules, for several pods on one node through a volume:

* concurrent pulls of one digest: the ``locks/<hex>`` flock makes the second wait and then find
  the entry; if the lock file was removed under it, both pull into their own temporary files and
  the second rename replaces identical bytes: never a torn or mixed file;
* a reader holds a shared flock on the entry while it reads (a mapping keeps it); eviction takes
  an exclusive one without waiting and skips entries in use. An entry removed anyway (unlinked
  while mapped) stays readable to whoever has it open: POSIX frees it at the last close.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import mmap
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ... import _atomic
from ..._digest import StreamDigest, hex_of

__all__ = ["Entries", "Entry", "Mapped", "boot_id"]

_CHUNK = 1 << 20


@functools.cache
def boot_id() -> str:
    """This boot of the machine (Linux); "-" where the kernel does not say (then seals outlive reboots)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or "-"
    except OSError:
        return "-"


@dataclass(frozen=True)
class Entry:
    """One cached blob as listed for eviction."""

    hex: str
    size: int
    last_used: float  # the seal's mtime (or the entry's, without a seal)


class Mapped:
    """A cached blob opened for reading, under a shared lock (held until ``close``).

    ``read_into`` copies it into a caller's buffer with ``pread`` (one copy out of the page cache);
    ``pieces`` hands out views of a read-only mapping of it (no copy). A view a caller keeps (an
    array placed straight from the bytes) keeps the mapping, and with it the lock, alive until freed.
    """

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    @property
    def view(self) -> memoryview:
        if self._view is None:
            self._map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ) if self.size else None
            self._view = memoryview(self._map) if self._map is not None else memoryview(b"")
        return self._view

    def pieces(self, chunk: int = _CHUNK) -> Iterator[memoryview]:
        for start in range(0, self.size, chunk):
            yield self.view[start : start + chunk]

    def read_into(self, out: memoryview) -> int:
        """The entry copied into ``out``; how many bytes there were (fewer than ``size`` if it was
        cut short since it was opened)."""
        got = 0
        while got < self.size:
            n = os.preadv(self.fd, [out[got : self.size]], got)
            if n <= 0:
                break
            got += n
        return got

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view handed out is still alive: the GC frees it
            if self._view is not None:
                self._view.release()
            if self._map is not None:
                self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)  # the lock goes with the last descriptor (a live mapping holds one)


def _hashes_to(fd: int, digest: str, size: int) -> bool:
    seen, at = StreamDigest(), 0
    while piece := os.pread(fd, _CHUNK, at):
        seen.update(piece)
        at += len(piece)
    return seen.matches(digest, size)


class Entries:
    """The files of one cache directory: lookup, verified insert, mapping, removal."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.blobs, self.seals, self.locks = self.root / "blobs", self.root / "seals", self.root / "locks"

    def ensure(self) -> None:
        for d in (self.blobs, self.seals, self.locks):
            d.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        return self.blobs / hex_of(digest)

    # ---- pulling: one process per digest ---------------------------------------------------
    @contextlib.contextmanager
    def pulling(self, digest: str) -> Iterator[None]:
        """Held while this process pulls ``digest``: another process pulling it waits here, then
        finds the entry. The lock file goes once the pull is over (a waiter re-checks the entry)."""
        lock = self.locks / hex_of(digest)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def insert_path(self, digest: str) -> Iterator[Path]:
        """A temporary file to write the blob into; renamed over the entry only if the ``with`` body
        returns, i.e. once the store checked what arrived (no fsync: see the seal's boot id)."""
        tmp = self.blobs / f"{_atomic.TMP_PREFIX}{hex_of(digest)}.{os.getpid()}.{threading.get_ident()}"
        try:
            yield tmp
            os.replace(tmp, self.path(digest))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def seal(self, digest: str) -> None:
        """Record the entry as verified, as it is now (after the rename, which moves its ctime)."""
        st = os.stat(self.path(digest))
        self._write_seal(hex_of(digest), st)

    def _write_seal(self, hex_: str, st: os.stat_result) -> None:
        text = f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {boot_id()}\n"
        tmp = self.seals / f"{_atomic.TMP_PREFIX}{hex_}.{os.getpid()}"
        tmp.write_text(text)  # a torn seal only costs a re-hash: no fsync
        os.replace(tmp, self.seals / hex_)

    # ---- reading ------------------------------------------------------------------------------
    def open(self, digest: str, size: int) -> Mapped | None:
        """The entry mapped under a shared lock, or None if absent or not the blob (then removed).

        An entry whose seal matches is not hashed; one without (or with a stale) seal is hashed
        here first and sealed again if it is right.
        """
        hex_ = hex_of(digest)
        try:
            fd = os.open(self.blobs / hex_, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            sealed = st.st_size == size and self._sealed(hex_, st)
            if st.st_size != size or not (sealed or _hashes_to(fd, digest, size)):
                os.close(fd)
                self._drop(hex_, st)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        if not sealed:
            self._write_seal(hex_, st)  # hashed just now: sealed as it is
        self.touch(hex_)
        return Mapped(fd, size)

    def recheck(self, digest: str, size: int) -> bool:
        """Hash the entry now, whatever its seal says; drop it if it is not the blob. True if it is."""
        hex_ = hex_of(digest)
        try:
            f = open(self.blobs / hex_, "rb")
        except FileNotFoundError:
            return False
        with f:
            st, whole = os.fstat(f.fileno()), _hashes_to(f.fileno(), digest, size)
        if whole:
            return True
        self._drop(hex_, st)
        return False

    def _sealed(self, hex_: str, st: os.stat_result) -> bool:
        try:
            text = (self.seals / hex_).read_text()
        except (FileNotFoundError, UnicodeDecodeError):
            return False
        return text.split() == [str(st.st_ino), str(st.st_size), str(st.st_mtime_ns), str(st.st_ctime_ns), boot_id()]

    def touch(self, hex_: str) -> None:
        """Move the entry to the young end of the LRU order."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.seals / hex_)

    def _drop(self, hex_: str, st: os.stat_result) -> None:
        """Remove a damaged entry, unless another process has already replaced it."""
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.blobs / hex_).st_ino == st.st_ino:
                os.unlink(self.blobs / hex_)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.seals / hex_)

    # ---- eviction -------------------------------------------------------------------------------
    def listing(self) -> list[Entry]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for d in os.scandir(self.blobs):
                if d.name.startswith(_atomic.TMP_PREFIX):
                    continue
                try:
                    size = d.stat().st_size
                    used = (
                        os.stat(self.seals / d.name).st_mtime if (self.seals / d.name).exists() else d.stat().st_mtime
                    )
                except FileNotFoundError:
                    continue
                out.append(Entry(d.name, size, used))
        return out

    def remove_if_idle(self, hex_: str) -> bool:
        """Remove an entry nobody is reading (an exclusive lock taken without waiting); False if busy."""
        try:
            fd = os.open(self.blobs / hex_, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.blobs / hex_)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.seals / hex_)
            return True
        finally:
            os.close(fd)

    def sweep(self, older_than: float = 3600.0) -> None:
        """Temporary files a killed writer left (never one being written: they are young)."""
        _atomic.sweep(self.blobs, older_than=older_than)
        _atomic.sweep(self.seals, older_than=older_than)
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for d in os.scandir(self.locks):  # a lock file a killed puller left
                with contextlib.suppress(FileNotFoundError):
                    if now - d.stat().st_mtime >= older_than:
                        os.unlink(d.path)
