"""Content digests: the one spelling of a sha256 used everywhere (``sha256:<64 hex>``), and of the
BLAKE3 digest a build manifest (v8) records for each raw weight chunk (``blake3:<64 hex>``): sha256
addresses blobs in every store and on the wire, BLAKE3 checks the bytes a loader places (about
2.7x sha256's speed on one core here, and it also hashes on several threads)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable

import blake3

__all__ = [
    "sha256_digest",
    "blake3_digest",
    "canonical_json",
    "is_digest",
    "hex_of",
    "DIGEST_RE",
    "BLAKE3_RE",
    "StreamDigest",
    "file_digest",
]

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
BLAKE3_RE = re.compile(r"^blake3:[0-9a-f]{64}$")


def sha256_digest(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blake3_digest(data: bytes | bytearray | memoryview, *, threads: int = 1) -> str:
    """``blake3:<hex>`` (256 bits) of ``data``; ``threads`` > 1 hashes on that many threads (the
    GIL is released either way)."""
    return "blake3:" + blake3.blake3(data, max_threads=threads).hexdigest()


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
    """A sha256 (or, with ``algorithm="blake3"``, a BLAKE3) taken over a stream, piece by piece,
    with the byte count beside it.

    The one way a stream is hashed here: ``update`` each piece as it passes (bytes, bytearray or a
    memoryview; hashlib releases the GIL on large pieces), then read ``digest`` (``sha256:<hex>``)
    and ``size``. ``matches(digest, size)`` is the check every reader of stored bytes makes.
    """

    __slots__ = ("_h", "size", "algorithm")

    def __init__(self, data: bytes | bytearray | memoryview = b"", *, algorithm: str = "sha256"):
        self.algorithm = algorithm
        self._h: hashlib._Hash | blake3.blake3 = blake3.blake3() if algorithm == "blake3" else hashlib.sha256()
        self.size = 0
        if data:
            self.update(data)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.size += len(data) if not isinstance(data, memoryview) else data.nbytes

    def feed(self, pieces: Iterable[bytes]) -> StreamDigest:
        for piece in pieces:
            self.update(piece)
        return self

    @classmethod
    def like(cls, digest: str) -> StreamDigest:
        """A stream digest of the algorithm ``digest`` is spelled in (``blake3:`` or ``sha256:``)."""
        return cls(algorithm="blake3" if digest.startswith("blake3:") else "sha256")

    @property
    def digest(self) -> str:
        return f"{self.algorithm}:" + self._h.hexdigest()

    def matches(self, digest: str, size: int | None = None) -> bool:
        return self.digest == digest and (size is None or self.size == size)


def file_digest(path: str | os.PathLike, *, chunk: int = 1 << 20) -> StreamDigest:
    """The digest and size of a file, read ``chunk`` bytes at a time (memory: one chunk)."""
    with open(path, "rb") as f:
        return StreamDigest().feed(iter(lambda: f.read(chunk), b""))
