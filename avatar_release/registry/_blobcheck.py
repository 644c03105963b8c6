"""The rule every store applies to a blob it hands out: exactly the declared size, and the bytes
hash to the digest they were asked for. Written once for every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from .._digest import StreamDigest, sha256_digest
from ..errors import IntegrityError

__all__ = ["checked_blob", "checked_stream", "check_size", "copy_into", "BLOB_CHUNK"]

T = TypeVar("T")
BLOB_CHUNK = 1 << 20  # what a streamed read hands its sink at a time


B = TypeVar("B", bound=bytes | memoryview)  # what a store read: bytes, or a mapped view


def checked_blob(data: B, digest: str, size: int, where: str) -> B:
    """``data`` if it is ``size`` bytes hashing to ``digest``; IntegrityError naming ``where`` otherwise.

    Backends read at most ``size`` + 1 bytes, so "more than size" is detected without reading
    an endless body.
    """
    check_size(len(data), digest, size, where)
    _check_hash(sha256_digest(data), digest, where)
    return data


def checked_stream(
    pieces: Iterable[bytes], digest: str, size: int, where: str, sink: Callable[[Iterator[bytes]], T]
) -> T:
    """``sink(chunks)`` over the pieces of a stored blob, then the same rule as :func:`checked_blob`.

    The sink sees at most ``size`` + 1 bytes (then the stream stops) and is handed them as they
    are read, hashed on the way; its result is returned only if exactly ``size`` bytes hashing to
    ``digest`` passed. A sink must therefore treat what it made as unverified until this returns
    (decompress into a buffer, hash, never deserialize), and must consume every chunk it is given.
    """
    seen, source = StreamDigest(), iter(pieces)

    def counted() -> Iterator[bytes]:
        for piece in source:
            piece = piece[: size + 1 - seen.size]
            if not piece:
                break
            seen.update(piece)
            yield piece
            if seen.size > size:
                break

    result = sink(counted())
    for _ in counted():  # what the sink left unread still counts: the whole blob is checked
        pass
    check_size(seen.size, digest, size, where)
    _check_hash(seen.digest, digest, where)
    return result


_REPAIR = (
    "the store is corrupted or was tampered with — repair it from a registry holding the same "
    "build: `avatar-release repair BUILD --from REGISTRY`"
)


def check_size(got: int, digest: str, size: int, where: str) -> None:
    """The size rule alone, for a store that copies a blob on this node unhashed (``NodeBlobs``:
    the caller checks the content against the digest its signed manifest names)."""
    if got != size:
        raise IntegrityError(
            f"blob {digest} in {where}: size {f'more than {size}' if got > size else got} bytes, "
            f"manifest says {size}; {_REPAIR}"
        )


def _check_hash(actual: str, digest: str, where: str) -> None:
    if actual != digest:
        raise IntegrityError(f"blob {digest} in {where}: content hashes to {actual}; {_REPAIR}")


def copy_into(pieces: Iterable[bytes], out: memoryview, size: int) -> int:
    """The pieces of a blob copied into ``out`` (its first ``size`` bytes); how many bytes there were."""
    got = 0
    for piece in pieces:
        take = max(0, min(len(piece), size - got))
        out[got : got + take] = piece[:take]
        got += len(piece)
    return got
