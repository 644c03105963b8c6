"""A remote store seen through the node cache: blob reads come from the cache (pulled once), every
other call goes to the store as it is.

Read-ahead: a manifest read through here is remembered; the first read of one of its blobs starts
pulling every blob of that build the node lacks, in the background and side by side (the cache's
``concurrency``), as Run:ai's model streamer reads a model's files: the loader places what has
arrived while the rest is still on the wire. A read waits only for its own blob (and pulls it at
once itself if its turn has not come). Blobs are read only after the loader checked the manifest
(identity, signature, the sizes it declares), so nothing is pulled for a build the loader
refused. A pull that fails in the background is left to the read of that blob, which names it.
While a build loads, its entries are not evicted (a build larger than the bound stays whole).

Reads hand the sink the mapped file a piece at a time (no copy), or read it into the loader's
buffer (``read_blob_into``: the registry's ``NodeBlobs``, for a loader that checks the signed
manifest's BLAKE3 of the bytes instead of hashing them twice); the entry's sha256 was checked
when it entered the node, and its seal is checked at each read (:mod:`._entries`). If the sink
refuses the bytes (an ``IntegrityError``: the loader's own digest disagrees) the entry is hashed
again; a damaged one is dropped, pulled again and the sink called afresh, as a store that
retries does. Writes, manifests, tags and records are never cached: a pod always resolves a
channel at the registry.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ...errors import AvatarReleaseError, IntegrityError
from ...records import Manifest, parse_record
from .._blobcheck import check_size
from .._protocol import Action, BuildRef, Registry, Resolved
from ._node import BlobLike, CacheStats, NodeCache

__all__ = ["CachedRegistry"]

T = TypeVar("T")


class CachedRegistry:
    """``store`` with its blobs read through ``cache``; ``uri`` is the store's."""

    def __init__(self, store: Registry, cache: NodeCache):
        self.store, self.cache = store, cache
        self.uri = store.uri
        self._mutex = threading.Lock()
        self._builds: dict[str, list[Any]] = {}  # manifest digest -> its blobs, until read ahead
        self._of: dict[str, str] = {}  # blob digest -> the manifest digest that names it
        self._pulling: dict[str, Future[bool]] = {}  # blob digest -> its pull in the background
        self._loading: frozenset[str] = frozenset()  # the blobs of the build read ahead last: never evicted for a pull

    def __repr__(self) -> str:
        return f"CachedRegistry({self.store!r}, {self.cache!r})"

    def __getattr__(self, name: str) -> Any:  # what a backend offers beyond the protocol (referrers, ...)
        return getattr(self.store, name)

    # ---- blobs: through the cache -------------------------------------------------------------
    def prefetch(self, blobs: Iterable[BlobLike]) -> CacheStats:
        """Pull the blobs this node lacks, side by side (the cache's ``concurrency``)."""
        return self.cache.prefetch(self.store, blobs)

    def _read_ahead(self, digest: str) -> None:
        """Before a read: start the build's read-ahead on its first read, then wait for this blob."""
        with self._mutex:
            build = self._of.get(digest)
            blobs = self._builds.pop(build, None) if build is not None else None
            if blobs:
                for b in blobs:
                    self._of.pop(b.digest, None)
                self._start(blobs)
            pending = self._pulling.pop(digest, None)
        if pending is not None and not pending.cancel():  # cancelled: not begun, the read pulls it now
            with contextlib.suppress(AvatarReleaseError):
                pending.result()  # a failed pull is left to the read, which names what failed

    def _start(self, blobs: list[Any]) -> None:
        missing = [b for b in blobs if not self.cache.has(b.digest, b.size)]
        if not missing:
            return
        keep = self._loading = frozenset(b.digest for b in blobs)
        self.cache.evict(self.cache.max_bytes - sum(b.size for b in missing), keep=keep)

        def pull(b: Any) -> bool:
            pulled = self.cache.pull(self.store, b.digest, b.size)
            if pulled:
                self.cache.evict(keep=keep)
            return pulled

        pool = ThreadPoolExecutor(
            max_workers=min(self.cache.concurrency, len(missing)), thread_name_prefix="cache-pull"
        )
        for b in missing:
            self._pulling[b.digest] = pool.submit(pull, b)
        pool.shutdown(wait=False)  # its threads finish the pulls; nothing waits for them but the reads

    def stream_blob(self, digest: str, size: int, sink: Callable[[Iterator[bytes]], T]) -> T:
        self._read_ahead(digest)
        for attempt in (1, 2):
            mapped = self.cache.open(self.store, digest, size, keep=self._loading)
            try:
                return sink(mapped.pieces())  # type: ignore[arg-type]  # memoryviews: bytes-like pieces
            except IntegrityError:
                if attempt == 2 or self.cache.entries.recheck(digest, size):
                    raise  # the entry is the blob: the bytes are what the store holds
            finally:
                mapped.close()
        raise AssertionError("unreachable")

    def get_blob(self, digest: str, size: int) -> bytes:
        self._read_ahead(digest)
        mapped = self.cache.open(self.store, digest, size, keep=self._loading)
        try:
            return bytes(mapped.view)
        finally:
            mapped.close()

    def read_blob_into(self, digest: str, size: int, out: memoryview) -> None:
        """The cached blob copied into ``out`` (``NodeBlobs``: its sha256 was checked when it entered
        the node and its seal is checked now; the content against the manifest is the caller's)."""
        self._read_ahead(digest)
        mapped = self.cache.open(self.store, digest, size, keep=self._loading)
        try:
            check_size(mapped.read_into(out), digest, size, f"node cache {self.cache.root}")
        finally:
            mapped.close()

    def has_blob(self, digest: str) -> bool:
        return self.store.has_blob(digest)

    def put_blob(self, data: bytes) -> str:
        return self.store.put_blob(data)

    # ---- everything else: the store's -----------------------------------------------------------
    def put_build(self, build_id: str, manifest_bytes: bytes) -> tuple[str, bool]:
        return self.store.put_build(build_id, manifest_bytes)

    def get_manifest_bytes(self, digest: str) -> bytes:
        data = self.store.get_manifest_bytes(digest)
        try:
            blobs = parse_record(Manifest, data, where=f"manifest {digest}").blobs()
        except AvatarReleaseError:
            return data  # the loader names what is wrong with it; nothing to read ahead
        with self._mutex:
            self._builds[digest] = blobs
            self._of.update({b.digest: digest for b in blobs})
        return data

    def list_builds(self) -> list[BuildRef]:
        return self.store.list_builds()

    def resolve(self, ref: str) -> Resolved:
        return self.store.resolve(ref)

    def get_channel(self, channel: str) -> Any:
        return self.store.get_channel(channel)

    def list_channels(self) -> list[Any]:
        return self.store.list_channels()

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
    ) -> Any:
        return self.store.move_channel(
            channel,
            resolved,
            expected_digest=expected_digest,
            action=action,
            who=who,
            reason=reason,
            gate_result_digest=gate_result_digest,
        )

    def history(self, channel: str | None = None) -> list[Any]:
        return self.store.history(channel)

    def put_record(self, namespace: str, name: str, data: bytes) -> None:
        self.store.put_record(namespace, name, data)

    def get_record(self, namespace: str, name: str) -> bytes | None:
        return self.store.get_record(namespace, name)

    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        return self.store.update_record(namespace, name, update)

    def list_records(self, namespace: str) -> list[str]:
        return self.store.list_records(namespace)
