"""The rule every store applies to a blob it hands out: exactly the declared size, and the bytes
hash to the digest they were asked for. Written once for every backend."""

from __future__ import annotations

from .._digest import sha256_digest
from ..errors import IntegrityError

__all__ = ["checked_blob"]


def checked_blob(data: bytes, digest: str, size: int, where: str) -> bytes:
    """``data`` if it is ``size`` bytes hashing to ``digest``; IntegrityError naming ``where`` otherwise.

    Backends read at most ``size`` + 1 bytes, so "more than size" is detected without reading
    an endless body.
    """
    if len(data) != size:
        got = f"more than {size}" if len(data) > size else str(len(data))
        raise IntegrityError(
            f"blob {digest} in {where}: size {got} bytes, manifest says {size}; "
            "the store is corrupted or was tampered with — republish the build"
        )
    actual = sha256_digest(data)
    if actual != digest:
        raise IntegrityError(
            f"blob {digest} in {where}: content hashes to {actual}; "
            "the store is corrupted or was tampered with — republish the build"
        )
    return data
