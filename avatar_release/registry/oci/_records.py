"""Side records (gate results, reviews, statements) in one OCI repository.

A record ``namespace/name`` is a small artifact under the layout's record tag with the record's
bytes as its first layer; the blobs the record refers to (a gate result, its frames) are further
layers, so the registry's garbage collector keeps them as long as the record exists. The signed
blobs a record holds are attached to their builds as referrers before the record is written, so
a record that is there means its referrers are too.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ...errors import ConflictError, InputError, IntegrityError
from ...records import utcnow
from .._lock import FileLock
from .._protocol import check_name
from ._artifact import ANN_PUBLISHED, ANN_RECORD, RECORD_ARTIFACT, RECORD_TYPE, artifact, blob_refs, descriptor
from ._blobs import Blobs
from ._layout import TagLayout
from ._manifests import Manifests
from ._referrers import Referrers

__all__ = ["Records"]


class Records:
    """put / get / update / list of side records; writes hold the writer lock."""

    def __init__(self, manifests: Manifests, blobs: Blobs, referrers: Referrers, layout: TagLayout, lock: FileLock):
        self.manifests, self.blobs, self.referrers, self.layout, self.lock = manifests, blobs, referrers, layout, lock

    def put(self, namespace: str, name: str, data: bytes) -> None:
        self.layout.record_tag(namespace, name)
        with self.lock.hold():
            self._write(namespace, name, data)

    def get(self, namespace: str, name: str) -> bytes | None:
        self.layout.record_tag(namespace, name)  # a name that could never be written is refused, not "absent"
        for tag in self.layout.record_tags(namespace, name):
            got = self.manifests.get(tag, f"read record {namespace}/{name}")
            if got is not None:
                break
        else:
            return None
        layers = self.manifests.parse(got[1], f"record {namespace}/{name}", RECORD_ARTIFACT).get("layers") or []
        # The first layer is the record; any further layers are blobs it refers to (kept for GC).
        if not layers or layers[0].get("mediaType") != RECORD_TYPE or not isinstance(layers[0].get("size"), int):
            raise IntegrityError(f"{self.manifests.where()}: record {namespace}/{name} has no record layer first")
        return self.blobs.get(str(layers[0].get("digest")), layers[0]["size"])

    def update(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        """Read-modify-write one record under the writer lock: ``update(old or None) -> new``."""
        self.layout.record_tag(namespace, name)
        with self.lock.hold():
            new = update(self.get(namespace, name))
            self._write(namespace, name, new)
            return new

    def list(self, namespace: str) -> list[str]:
        check_name("record namespace", namespace)
        return self.layout.record_names(self.manifests.tags_with(*self.layout.record_prefixes(namespace)), namespace)

    def _write(self, namespace: str, name: str, data: bytes) -> None:
        tag = self.layout.record_tag(namespace, name)
        op = f"write record {namespace}/{name}"
        if not isinstance(data, (bytes, bytearray)):
            raise InputError(f"record {namespace}/{name}: expected bytes, got {type(data).__name__}")
        self.blobs.ensure_empty()
        digest = self.blobs.put(bytes(data))
        layers = [descriptor(RECORD_TYPE, digest, len(data), {ANN_RECORD: f"{namespace}/{name}"})]
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        seen = {digest}
        for _, ref in blob_refs(doc) if doc is not None else ():
            if ref["digest"] not in seen:
                seen.add(ref["digest"])
                layers.append(descriptor(ref["media_type"], ref["digest"], ref["size"]))
        self.referrers.attach(namespace, name, bytes(data), op)  # before the record (see the module)
        body = artifact(RECORD_ARTIFACT, layers, {ANN_RECORD: f"{namespace}/{name}", ANN_PUBLISHED: utcnow()})
        written = self.manifests.put(tag, body, op)
        if not self.manifests.points_at(tag, written, op):
            raise ConflictError(
                f"record {namespace}/{name} was overwritten by a writer outside this machine's lock; retry"
            )
