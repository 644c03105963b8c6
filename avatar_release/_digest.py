"""Content digests: the one spelling of a sha256 used everywhere (``sha256:<64 hex>``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable

__all__ = ["sha256_digest", "canonical_json", "is_digest", "hex_of", "DIGEST_RE", "StreamDigest", "file_digest"]

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256_digest(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: object) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def is_digest(text: str) -> bool:
    return bool(DIGEST_RE.match(text))


def hex_of(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r} (expected 'sha256:' + 64 lowercase hex)")
    return digest.split(":", 1)[1]


class StreamDigest:
    """A sha256 taken over a stream, piece by piece, with the byte count beside it.

    The one way a stream is hashed here: ``update`` each piece as it passes (bytes, bytearray or a
    memoryview; hashlib releases the GIL on large pieces), then read ``digest`` (``sha256:<hex>``)
    and ``size``. ``matches(digest, size)`` is the check every reader of stored bytes makes.
    """

    __slots__ = ("_h", "size")

    def __init__(self, data: bytes | bytearray | memoryview = b""):
        self._h = hashlib.sha256()
        self.size = 0
        if data:
            self.update(data)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.size += len(data) if not isinstance(data, memoryview) else data.nbytes

    def feed(self, pieces: Iterable[bytes]) -> "StreamDigest":
        for piece in pieces:
            self.update(piece)
        return self

    @property
    def digest(self) -> str:
        return "sha256:" + self._h.hexdigest()

    def matches(self, digest: str, size: int | None = None) -> bool:
        return self.digest == digest and (size is None or self.size == size)


def file_digest(path: str | os.PathLike, *, chunk: int = 1 << 20) -> StreamDigest:
    """The digest and size of a file, read ``chunk`` bytes at a time (memory: one chunk)."""
    with open(path, "rb") as f:
        return StreamDigest().feed(iter(lambda: f.read(chunk), b""))
