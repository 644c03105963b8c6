"""The registry protocol: what compile, runtime, gates and promote need from a store.

A store holds content-addressed blobs, build references (build id -> manifest digest),
channels (name -> build) and an append-only history. Backends: a local directory (the
default), an in-memory fake for unit tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from ..errors import InputError
from ..records import CHANNELS, ChannelState, HistoryEntry

T = TypeVar("T")
Action = Literal["publish", "promote", "rollback"]  # what a channel move records (HistoryEntry.action)

__all__ = ["Action", "Registry", "Collectable", "NodeBlobs", "Resolved", "BuildRef", "check_name", "CHANNELS"]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Refuse names that could escape a directory or a tag namespace."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise InputError(
            f"invalid {kind} name {name!r}: expected lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 128 characters, no '..'"
        )
    return name


@dataclass(frozen=True)
class Resolved:
    """A reference resolved once to a digest; everything after fetches by digest."""

    ref: str
    build_id: str
    digest: str
    via: str  # "channel", "build-id", "digest"


@dataclass(frozen=True)
class BuildRef:
    build_id: str
    digest: str
    published_at: str


@runtime_checkable
class Registry(Protocol):
    uri: str

    # blobs
    def has_blob(self, digest: str) -> bool: ...
    def put_blob(self, data: bytes) -> str: ...
    def get_blob(self, digest: str, size: int) -> bytes: ...
    def stream_blob(self, digest: str, size: int, sink: Callable[[Iterator[bytes]], T]) -> T:
        """``sink(chunks)`` over the blob as it is read (memory: one chunk), then the size and sha256
        check of ``get_blob``: the sink's result is returned only for the right bytes (see
        ``_blobcheck.checked_stream``). A store that retries calls the sink afresh: it must start over."""
        ...

    # builds
    def put_build(self, build_id: str, manifest_bytes: bytes) -> tuple[str, bool]: ...
    def get_manifest_bytes(self, digest: str) -> bytes: ...
    def list_builds(self) -> list[BuildRef]: ...
    def resolve(self, ref: str) -> Resolved: ...

    # channels and history
    def get_channel(self, channel: str) -> ChannelState | None: ...
    def list_channels(self) -> list[ChannelState]: ...
    def move_channel(
        self,
        channel: str,
        resolved: Resolved,
        *,
        expected_digest: str | None,
        action: Action,
        who: str,
        reason: str,
        gate_result_digest: str | None = None,
    ) -> HistoryEntry | None: ...
    def history(self, channel: str | None = None) -> list[HistoryEntry]: ...

    # side records (gate results, reviews), content-addressed under a namespace
    def put_record(self, namespace: str, name: str, data: bytes) -> None: ...
    def get_record(self, namespace: str, name: str) -> bytes | None: ...
    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes: ...
    def list_records(self, namespace: str) -> list[str]: ...


@runtime_checkable
class Collectable(Protocol):
    """What garbage collection needs from a store that can delete (directory-like stores).

    The OCI stores are not collectable here: a DELETE by digest removes every tag on it, so
    collection is left to the registry server, which keeps every layer a manifest lists.
    """

    def exclusive(self) -> Any: ...
    def record_namespaces(self) -> list[str]: ...
    def list_blob_digests(self) -> list[str]: ...
    def blob_age(self, digest: str) -> float: ...
    def blob_size(self, digest: str) -> int: ...
    def delete_blob(self, digest: str) -> None: ...
    def delete_build(self, build_id: str) -> None: ...
    def delete_record(self, namespace: str, name: str) -> None: ...


@runtime_checkable
class NodeBlobs(Protocol):
    """A store whose blobs are already on this node (a directory, memory, a node cache): it can
    copy a blob's bytes straight into a caller's buffer without hashing them.

    For a caller that checks the bytes against another digest the signed manifest names (a v8
    weight chunk's BLAKE3), so each byte is hashed once at load. The size is checked (reading at
    most ``size`` + 1 bytes, IntegrityError when it differs); the content is the caller's to check.
    A blob arriving from another machine is not on the node: its sha256 is checked as it enters
    (``Registry.stream_blob``), which is why remote stores do not offer this.
    """

    def read_blob_into(self, digest: str, size: int, out: memoryview) -> None: ...
