"""Tags and manifests of one OCI repository: the distribution API's ``/tags`` and ``/manifests``.

Plain distribution, nothing avatar-release specific beyond refusing what is not an OCI image
manifest of an expected ``artifactType``: every manifest read is verified against its digest (and
the ``Docker-Content-Digest`` the registry claims), every read is bounded by the 4 MiB that
distribution itself allows, and a write reports what the registry answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..._digest import is_digest, sha256_digest
from ...errors import IntegrityError, RegistryError
from ._artifact import ACCEPT, MAX_MANIFEST, OCI_MANIFEST
from ._transport import Reply, Transport, next_link, registry_errors

__all__ = ["Manifests"]


class Manifests:
    """Tag listing and manifest GET / HEAD / PUT over a :class:`Transport`."""

    def __init__(self, transport: Transport, *, tag_lister: Callable[[], list[str] | None] | None = None):
        """``tag_lister`` lists tags another way (Artifact Registry's API); None from it means
        "use the OCI endpoint"."""
        self.transport = transport
        self._tag_lister = tag_lister

    @property
    def base(self) -> str:
        return self.transport.location.base

    def where(self) -> str:
        return self.transport.where()

    # ---- tags -----------------------------------------------------------------------------
    def list_tags(self) -> list[str]:
        """Every tag of the repository (following ``Link`` pagination); [] for a new repository."""
        listed = self._tag_lister() if self._tag_lister is not None else None
        if listed is not None:
            return listed
        url: str | None = f"{self.base}/tags/list?n=1000"
        tags: list[str] = []
        while url:
            reply = self.transport.call("list tags", "GET", url, limit=64 << 20)
            if reply.status == 404:
                return tags  # NAME_UNKNOWN: nothing pushed yet
            if reply.status != 200:
                raise self.transport.fail("list tags", reply)
            try:
                tags += json.loads(reply.body).get("tags") or []
            except (ValueError, AttributeError):
                raise IntegrityError(f"{self.where()}: tag list is not JSON ({reply.body[:80]!r})") from None
            url = next_link(reply.headers.get("Link"), self.transport.location.root)
        return tags

    def tags_with(self, *prefixes: str) -> list[str]:
        """Tags starting with any of ``prefixes`` (one listing for all of them)."""
        return sorted(t for t in self.list_tags() if t.startswith(prefixes))

    # ---- manifests ------------------------------------------------------------------------
    def get(self, ref: str, op: str) -> tuple[str, bytes] | None:
        """(digest, bytes) of the manifest a tag or digest names, or None; digest verified."""
        reply = self.transport.call(
            op, "GET", f"{self.base}/manifests/{ref}", headers={"Accept": ACCEPT}, limit=MAX_MANIFEST
        )
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise self.transport.fail(op, reply)
        if len(reply.body) > MAX_MANIFEST:
            raise IntegrityError(f"{self.where()}: manifest {ref} is larger than {MAX_MANIFEST} bytes; refusing it")
        digest = sha256_digest(reply.body)
        claimed = reply.headers.get("Docker-Content-Digest")
        if (is_digest(ref) and digest != ref) or (claimed and is_digest(claimed) and claimed != digest):
            raise IntegrityError(
                f"{self.where()}: manifest {ref} hashes to {digest}, the registry says "
                f"{claimed or ref}; the registry or a proxy altered it"
            )
        return digest, reply.body

    def head(self, ref: str, op: str) -> str | None:
        """The digest a tag points at (one HEAD), or None when it does not exist."""
        reply = self.transport.call(op, "HEAD", f"{self.base}/manifests/{ref}", headers={"Accept": ACCEPT})
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise self.transport.fail(op, reply)
        claimed = reply.headers.get("Docker-Content-Digest")
        if claimed and is_digest(claimed):
            return claimed
        got = self.get(ref, op)  # a registry that does not send the header
        return got[0] if got else None

    def put(self, tag: str, body: bytes, op: str, media_type: str = OCI_MANIFEST) -> str:
        """PUT a manifest under a tag with the OCI Content-Type; returns its digest (callers read back)."""
        return self.push(tag, body, op, media_type)[0]

    def push(self, ref: str, body: bytes, op: str, media_type: str = OCI_MANIFEST) -> tuple[str, Reply]:
        """PUT a manifest under a tag or its own digest: (its digest, the registry's answer)."""
        digest = sha256_digest(body)
        if len(body) > MAX_MANIFEST:
            raise RegistryError(
                f"{self.where()}: {op}: manifest is {len(body)} bytes, over the {MAX_MANIFEST}-byte limit "
                "of OCI registries"
            )
        reply = self.transport.call(
            op, "PUT", f"{self.base}/manifests/{ref}", headers={"Content-Type": media_type}, data=body
        )
        if reply.status not in (200, 201):
            detail = registry_errors(reply.body)
            if "BLOB_UNKNOWN" in detail:
                raise IntegrityError(
                    f"{self.where()}: {op}: the registry refused the manifest because a blob it references is "
                    f"missing ({detail}); push every blob before the manifest that references it"
                )
            raise self.transport.fail(op, reply)
        claimed = reply.headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise IntegrityError(f"{self.where()}: {op}: registry stored {claimed}, this client sent {digest}")
        return digest, reply

    def points_at(self, tag: str, digest: str, op: str) -> bool:
        """The read-back of a tag write: does ``tag`` name ``digest`` now?"""
        return self.head(tag, f"{op} (read-back)") == digest

    def parse(self, body: bytes, where: str, artifact_type: str) -> dict[str, Any]:
        """An OCI image manifest of the given artifactType, as a dict; IntegrityError otherwise."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise IntegrityError(f"{self.where()}: {where} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
            kind = doc.get("mediaType") if isinstance(doc, dict) else type(doc).__name__
            raise IntegrityError(
                f"{self.where()}: {where} is a {kind}, expected an OCI image manifest ({OCI_MANIFEST})"
            )
        if doc.get("artifactType") != artifact_type:
            raise IntegrityError(
                f"{self.where()}: {where} has artifactType {doc.get('artifactType')!r}, expected "
                f"{artifact_type!r}; it was not written by avatar-release — retag it or pick another repository"
            )
        return doc
