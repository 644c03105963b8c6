"""The one zstd decoder: every decode in the package goes through :func:`decode`, bounded.

Stored bytes reach it as pieces (a store's stream, or one whole buffer) and come out as at most
``limit`` raw bytes: written into the caller's buffer ``out`` (a weight chunk's worker reuses
one), into a fresh one, or, to check a blob only, into one reused step of memory. Each step of
output is handed to ``seen`` (a hash) as it is written. A frame that inflates to more than
``limit`` is refused having produced ``limit`` + 1 bytes, whatever its header claims; with
``exact`` a shorter one is refused too. Errors are :class:`DecodeError`, which names what was
wrong; callers add where (an IntegrityError naming the blob).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import IO, Protocol, cast

import zstandard

__all__ = ["decode", "declared_size", "DecodeError", "STEP"]

STEP = 1 << 20  # raw bytes per step: memory beyond the output is one stored piece and one step


class DecodeError(ValueError):
    """The stored bytes are not a zstd stream of the size allowed."""


class _Seen(Protocol):
    def update(self, data: memoryview) -> None: ...


class _Source(io.RawIOBase):
    """The ``read(n)`` a zstd stream reader pulls from, over the pieces a store hands out; each
    read copies only what it returns, and a whole piece that fits the read (the stores' pieces are
    one ``STEP``, what the reader asks for) is handed on as it came, not copied at all."""

    def __init__(self, pieces: Iterator[bytes | bytearray | memoryview]):
        super().__init__()
        self._pieces, self._piece, self._at = pieces, memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        if self._at >= len(self._piece):
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            if type(piece) is bytes and (n is None or n < 0 or len(piece) <= n):
                return piece  # a short read is a read: the reader asks again
            self._piece, self._at = memoryview(piece).cast("B"), 0
        out = bytearray()
        while n is None or n < 0 or len(out) < n:
            if self._at >= len(self._piece):
                piece = next(self._pieces, None)
                if piece is None:
                    break
                self._piece, self._at = memoryview(piece).cast("B"), 0
                continue
            end = len(self._piece) if n is None or n < 0 else min(len(self._piece), self._at + n - len(out))
            out += self._piece[self._at : end]
            self._at = end
        return bytes(out)


def declared_size(data: bytes | bytearray | memoryview, limit: int) -> int:
    """The raw size a zstd frame's header declares, refused (DecodeError) when it declares none or
    more than ``limit``: what to :func:`decode` a blob of unknown size (gate frames) by, exactly."""
    try:
        size = zstandard.get_frame_parameters(data).content_size
    except zstandard.ZstdError as e:
        raise DecodeError(f"not a zstd frame ({e})") from None
    if size == zstandard.CONTENTSIZE_UNKNOWN or size < 0:
        raise DecodeError("the zstd frame declares no size")
    if size > limit:
        raise DecodeError(f"the zstd frame declares {size} bytes, more than the {limit} allowed")
    return int(size)


def decode(
    pieces: Iterable[bytes | bytearray | memoryview],
    limit: int,
    *,
    out: memoryview | None = None,
    keep: bool = True,
    exact: bool = True,
    seen: _Seen | None = None,
    said: str = "the manifest says",
) -> memoryview | None:
    """The raw bytes of the zstd stream ``pieces`` (all its frames), at most ``limit`` of them.

    ``out``: write them there (at least ``limit`` bytes long); else a fresh buffer of ``limit``
    bytes when ``keep``, or none at all (check only). Returns a view of what was written (None when
    not kept). ``exact``: fewer than ``limit`` bytes is an error too. ``seen.update`` gets every
    step of output as it is written. ``said``: who set the limit, for the errors. Raises
    :class:`DecodeError`.
    """
    if out is not None and len(out) < limit:
        raise ValueError(f"a buffer of {len(out)} bytes cannot hold {limit}")
    target = out if out is not None else (memoryview(bytearray(limit)) if keep else None)
    scratch = memoryview(bytearray(min(STEP, limit) or 1)) if target is None else None
    produced = 0
    source = cast(IO[bytes], _Source(iter(pieces)))  # a readable raw stream
    try:
        with zstandard.ZstdDecompressor().stream_reader(source, read_size=STEP, read_across_frames=True) as reader:
            while produced < limit:
                step = min(STEP, limit - produced)
                view = target[produced : produced + step] if target is not None else cast(memoryview, scratch)[:step]
                k = reader.readinto(view)
                if not k:
                    break
                if seen is not None:
                    seen.update(view[:k])
                produced += k
            over = reader.read(1)
    except zstandard.ZstdError as e:
        if produced == limit:  # the frame filled the limit; what follows it is not a frame
            raise DecodeError(
                f"decompresses to more than the {limit} bytes {said} (the stored bytes go on past the frame: {e})"
            ) from None
        raise DecodeError(f"zstd frame is corrupt or truncated ({e})") from None
    if over:
        raise DecodeError(f"decompresses to more than the {limit} bytes {said} (stopped one byte past it)")
    if exact and produced != limit:
        raise DecodeError(f"zstd frame is corrupt or truncated: it decompresses to {produced} bytes, {said} {limit}")
    return None if target is None else target[:produced]
