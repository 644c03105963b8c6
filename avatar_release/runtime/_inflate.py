"""zstd decompression of a blob as it is read: the stored bytes are never held whole.

:func:`inflate` is the sink a store's ``stream_blob`` hands the stored bytes to, piece by piece:
they go through one streaming zstd reader whose output is hashed and counted as it is written
into a buffer of the declared (already bounded) raw size — or, to only check a blob
(``verify``), into one reused step's worth of memory. It stops one byte past the declared size,
so a frame that inflates to more is refused having produced raw_size + 1 bytes, whatever it
claims. The store checks the stored bytes' size and sha256 after the sink returns; the caller
uses the buffer only then.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, cast

import zstandard

from .._digest import StreamDigest
from ..errors import IntegrityError
from ..records import BlobRef
from ..registry import Registry

__all__ = ["inflate", "inflater", "fetch_inflated", "StreamTimes", "STEP"]

STEP = 1 << 20  # raw bytes per step: memory beyond the raw buffer is one stored piece and one step


class _Source(io.RawIOBase):
    """The ``read(n)`` a zstd stream reader pulls from, over the pieces a store hands out; each
    read copies only what it returns (a whole blob given as one piece is not re-sliced)."""

    def __init__(self, pieces: Iterator[bytes]):
        super().__init__()
        self._pieces, self._piece, self._at = pieces, memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        out = bytearray()
        while n is None or n < 0 or len(out) < n:
            if self._at >= len(self._piece):
                piece = next(self._pieces, None)
                if piece is None:
                    break
                self._piece, self._at = memoryview(piece), 0
                continue
            end = len(self._piece) if n is None or n < 0 else min(len(self._piece), self._at + n - len(out))
            out += self._piece[self._at: end]
            self._at = end
        return bytes(out)


def inflate(pieces: Iterator[bytes], raw_size: int, raw_digest: str, *, where: str,
            keep: bool = True) -> bytearray | None:
    """The raw bytes of a zstd stream (``keep``), or None having only checked them: exactly
    ``raw_size`` bytes hashing to ``raw_digest``, else IntegrityError naming ``where``."""
    out = bytearray(raw_size) if keep else None
    scratch = memoryview(bytearray(STEP)) if out is None else None
    seen = StreamDigest()
    try:
        source = cast(IO[bytes], _Source(pieces))  # a readable raw stream: what the reader calls is read()
        with zstandard.ZstdDecompressor().stream_reader(source, read_size=STEP, read_across_frames=True) as reader:
            view = memoryview(out) if out is not None else None
            while seen.size < raw_size:
                step = min(STEP, raw_size - seen.size)
                if view is not None:
                    target = view[seen.size: seen.size + step]
                else:
                    assert scratch is not None  # one of the two is always made (keep or not)
                    target = scratch[:step]
                k = reader.readinto(target)
                if not k:
                    break
                seen.update(target[:k])
            over = reader.read(1)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"{where}: zstd frame is corrupt or truncated ({e})") from None
    if over:
        raise IntegrityError(f"{where}: decompresses to more than the {raw_size} bytes the manifest says "
                             "(stopped one byte past it)")
    if seen.size != raw_size:
        raise IntegrityError(f"{where}: zstd frame is corrupt or truncated: it decompresses to {seen.size} bytes, "
                             f"the manifest says {raw_size}")
    if seen.digest != raw_digest:
        raise IntegrityError(f"{where}: decompressed bytes hash to {seen.digest}, the manifest says {raw_digest}")
    return out


def inflater(raw_size: int, raw_digest: str, *, where: str, keep: bool = True
             ) -> Callable[[Iterator[bytes]], bytearray | None]:
    """:func:`inflate` as a ``stream_blob`` sink."""
    return lambda pieces: inflate(pieces, raw_size, raw_digest, where=where, keep=keep)


@dataclass
class StreamTimes:
    """Where a streamed blob's seconds went: waiting on the store, the independent sha256 of the
    stored bytes, and the rest (zstd and the hash of the raw bytes)."""

    fetch: float = 0.0
    verify: float = 0.0
    decompress: float = 0.0

    def add(self, other: StreamTimes) -> None:
        self.fetch += other.fetch
        self.verify += other.verify
        self.decompress += other.decompress


def fetch_inflated(registry: Registry, ref: BlobRef, raw: tuple[int, str] | None, *, where: str,
                   keep: bool) -> tuple[bytearray | None, StreamTimes]:
    """One blob streamed from the store through the hash, never held whole: with ``raw`` (declared
    raw size and digest, already bounded) inflated and checked too, its raw bytes kept if ``keep``.

    The stored bytes are hashed here as well as by the store (independent of its own check), and
    the result is returned only once both and the raw check passed: nothing unverified leaves.
    """
    own, times, started = StreamDigest(), StreamTimes(), time.perf_counter()

    def sink(pieces: Iterator[bytes]) -> bytearray | None:
        def hashed() -> Iterator[bytes]:
            while True:
                t0 = time.perf_counter()
                piece = next(pieces, None)
                t1 = time.perf_counter()
                times.fetch += t1 - t0
                if piece is None:
                    return
                own.update(piece)
                times.verify += time.perf_counter() - t1
                yield piece

        it = hashed()
        try:
            out = None if raw is None else inflate(it, raw[0], raw[1], where=where, keep=keep)
        except IntegrityError:
            for _ in it:  # bad raw bytes from bad stored bytes: the stored bytes' fault is the one to name
                pass
            if own.size != ref.size or own.digest != ref.digest:
                what = (f"size {own.size} bytes, manifest says {ref.size}" if own.size != ref.size
                        else f"content hashes to {own.digest}")
                raise IntegrityError(f"{where}: blob {ref.digest}: {what}; the store is corrupted or was tampered "
                                     "with — republish the build") from None
            raise
        for _ in it:  # what decompression left unread is hashed too
            pass
        return out

    out = registry.stream_blob(ref.digest, ref.size, sink)
    if own.digest != ref.digest:
        raise IntegrityError(f"{where}: blob {ref.digest} does not match its digest")
    times.decompress = max(0.0, time.perf_counter() - started - times.fetch - times.verify)
    return out, times
