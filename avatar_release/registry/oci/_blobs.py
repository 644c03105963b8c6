"""Blobs of one OCI repository: ``/blobs`` and ``/blobs/uploads``, whole or streamed.

Every pull reads at most the declared size + 1 bytes (so an overlong body is detected without
reading it all) and checks size and sha256 before returning. Blobs larger than memory stream:
a pull into a file is hashed as it arrives and renamed into place only once verified; a push
from a file goes in PATCH chunks of one upload session and resumes from the offset the
registry reports when a chunk fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import urljoin

from ... import _atomic
from ..._digest import StreamDigest, file_digest, is_digest, sha256_digest
from ...errors import InputError, IntegrityError, NotFoundError, RegistryError
from .._blobcheck import checked_blob, checked_stream
from ._artifact import EMPTY_BLOB
from ._transport import Transport

__all__ = ["Blobs"]

_OCTETS = "application/octet-stream"
T = TypeVar("T")


class Blobs:
    """Blob HEAD / GET / upload over a :class:`Transport`; ``uri`` names the store in errors."""

    def __init__(self, transport: Transport, uri: str):
        self.transport, self.uri = transport, uri
        self._have_empty = False

    @property
    def base(self) -> str:
        return self.transport.location.base

    def where(self) -> str:
        return self.transport.where()

    def url(self, digest: str) -> str:
        if not is_digest(digest):
            raise InputError(f"not a sha256 digest: {digest!r} (expected 'sha256:' + 64 lowercase hex)")
        return f"{self.base}/blobs/{digest}"

    def _session_url(self, location: str) -> str:
        return urljoin(self.transport.location.root + "/", location)

    def has(self, digest: str) -> bool:
        reply = self.transport.call(f"check blob {digest}", "HEAD", self.url(digest))
        if reply.status not in (200, 404):
            raise self.transport.fail(f"check blob {digest}", reply)
        return reply.status == 200

    def put(self, data: bytes) -> str:
        digest = sha256_digest(data)
        op = f"push blob {digest} ({len(data)} bytes)"
        for _ in range(2):  # a second round when the upload session was lost between POST and PUT
            reply = self.transport.call(op, "HEAD", self.url(digest))
            if reply.status == 200 and reply.headers.get("Content-Length") in (None, str(len(data))):
                return digest  # content-addressed: already there
            loc = self._start_upload(op)
            done = self.transport.call(
                op,
                "PUT",
                _with_digest(loc, digest),
                data=data,
                headers={"Content-Type": _OCTETS, "Content-Length": str(len(data))},
            )
            if done.status in (200, 201, 204):
                return digest
            if done.status == 404:  # BLOB_UPLOAD_UNKNOWN: a retried PUT after a lost answer
                continue
            raise self.transport.fail(op, done)
        raise RegistryError(f"{self.where()}: {op}: the upload session vanished twice; retry the publish")

    def ensure_empty(self) -> None:
        """The empty config blob every artifact here names (pushed once per client)."""
        if not self._have_empty:
            self.put(EMPTY_BLOB)
            self._have_empty = True

    def get(self, digest: str, size: int) -> bytes:
        """Fetch by digest, reading at most ``size`` + 1 bytes, and verify both."""
        reply = self.transport.call(f"pull blob {digest}", "GET", self.url(digest), limit=size)
        if reply.status == 404:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        if reply.status != 200:
            raise self.transport.fail(f"pull blob {digest}", reply)
        return checked_blob(reply.body, digest, size, self.uri)

    def stream(self, digest: str, size: int, sink: Callable[[Iterator[bytes]], T]) -> T:
        """``sink(chunks)`` over the blob as it arrives, then its size and sha256 checked
        (:func:`.._blobcheck.checked_stream`); a retried GET calls the sink afresh."""
        got: list[T] = []
        op = f"pull blob {digest}"

        def consume(chunks: Iterator[bytes]) -> None:
            got[:] = [checked_stream(chunks, digest, size, self.uri, sink)]

        reply = self.transport.call(op, "GET", self.url(digest), limit=size, sink=consume)
        if reply.status == 404:
            raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
        if reply.status != 200:
            raise self.transport.fail(op, reply)
        if not got:
            raise IntegrityError(f"blob {digest} in {self.uri}: the registry answered without a body")
        return got[0]

    # ---- streaming: blobs larger than memory ----------------------------------------------
    def pull_to(self, digest: str, size: int, dest: str | os.PathLike) -> Path:
        """Stream a blob into the file ``dest``, hashing as it arrives: memory is one chunk, whatever
        the size. Written to a temporary file beside ``dest``, renamed only once exactly ``size``
        bytes hashing to ``digest`` arrived (at most ``size`` + 1 bytes are read)."""
        dest = Path(dest)
        got: list[StreamDigest] = []
        op = f"pull blob {digest}"
        with _atomic.atomic_path(dest) as tmp:  # renamed over dest only if the body below returns

            def sink(chunks: Iterator[bytes]) -> None:  # called afresh on a retry: starts over
                seen = StreamDigest()
                with open(tmp, "wb") as f:
                    for chunk in chunks:
                        seen.update(chunk)
                        f.write(chunk)
                got[:] = [seen]

            reply = self.transport.call(op, "GET", self.url(digest), limit=size, sink=sink)
            if reply.status == 404:
                raise NotFoundError(f"blob {digest} not found in registry {self.uri}")
            if reply.status != 200:
                raise self.transport.fail(op, reply)
            seen = got[0] if got else StreamDigest()
            if not seen.matches(digest, size):
                n = seen.size
                what = (
                    f"size {'more than ' + str(size) if n > size else n} bytes, manifest says {size}"
                    if n != size
                    else f"content hashes to {seen.digest}"
                )
                raise IntegrityError(
                    f"blob {digest} in {self.uri}: {what}; the store is corrupted or was tampered "
                    "with — repair it from a registry holding the same build: "
                    "`avatar-release repair BUILD --from REGISTRY`"
                )
        return dest

    def push_from(self, path: str | os.PathLike, *, chunk_size: int = 16 << 20, resumes: int = 3) -> str:
        """Push the file ``path`` as a blob in PATCH chunks of one upload session: memory is one chunk.

        A chunk that still fails after the transport's retries is resumed, up to ``resumes`` times,
        from the offset the registry reports for the session (``GET`` on it: ``Range: 0-N``), so a
        dropped connection costs one chunk, not the upload.
        """
        whole = file_digest(path)
        digest, size = whole.digest, whole.size
        op = f"push blob {digest} ({size} bytes, in chunks of {chunk_size})"
        if self.transport.call(op, "HEAD", self.url(digest)).status == 200:
            return digest
        loc, offset, left = self._start_upload(op), 0, resumes
        with open(path, "rb") as f:
            while offset < size:
                f.seek(offset)
                chunk = f.read(min(chunk_size, size - offset))
                try:
                    reply = self.transport.call(
                        op,
                        "PATCH",
                        loc,
                        data=chunk,
                        headers={
                            "Content-Type": _OCTETS,
                            "Content-Length": str(len(chunk)),
                            "Content-Range": f"{offset}-{offset + len(chunk) - 1}",
                        },
                    )
                except RegistryError:
                    if left <= 0:
                        raise
                    left -= 1
                    offset, loc = self._upload_status(loc, op)
                    continue
                if reply.status != 202:
                    raise self.transport.fail(op, reply)
                loc = self._session_url(reply.headers.get("Location") or loc)
                offset = _range_end(reply.headers.get("Range"), offset + len(chunk))
        done = self.transport.call(op, "PUT", _with_digest(loc, digest), headers={"Content-Length": "0"})
        if done.status not in (200, 201, 204):
            raise self.transport.fail(op, done)
        return digest

    def _start_upload(self, op: str) -> str:
        start = self.transport.call(op, "POST", f"{self.base}/blobs/uploads/")
        if start.status != 202 or not start.headers.get("Location"):
            raise self.transport.fail(op, start)
        return self._session_url(start.headers["Location"])

    def _upload_status(self, loc: str, op: str) -> tuple[int, str]:
        """(bytes the registry holds, session URL) of an upload session."""
        reply = self.transport.call(f"{op} (resume)", "GET", loc)
        if reply.status not in (200, 204):
            raise self.transport.fail(f"{op} (resume)", reply)
        return _range_end(reply.headers.get("Range"), 0), self._session_url(reply.headers.get("Location") or loc)


def _with_digest(loc: str, digest: str) -> str:
    return f"{loc}{'&' if '?' in loc else '?'}digest={digest}"


def _range_end(header: str | None, default: int) -> int:
    """``Range: 0-N`` of an upload session -> N + 1 bytes held (distribution says ``0--1`` for none)."""
    if not header or "-" not in header:
        return default
    try:
        return max(0, int(header.split("-", 1)[1]) + 1)
    except ValueError:
        return default
