"""Signed evidence attached to a build as OCI referrers, where standard tools read it.

Every signed blob a record holds about a build (the namespace's ``attachments`` in
:mod:`avatar_release.records.stored`) becomes an untagged image manifest whose ``subject`` is the
build's OCI manifest, with the envelope as its one layer (``oras discover``, ``cosign tree``). A
registry with the referrers API says so by answering the manifest PUT with ``OCI-Subject``;
without it (distribution 2.8) the client keeps the list itself, as the distribution spec asks:
the image index under the tag ``sha256-<hex of the build's digest>``, read, extended and written
back under the writer lock and read back like every tag here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast
from urllib.parse import quote

from ..._digest import is_digest, sha256_digest
from ...errors import ConflictError, IntegrityError
from ...records.stored import STORED_NAMESPACES, Attachment
from ._artifact import (
    ANN_BUILD_ID,
    ANN_ENVELOPE,
    ANN_PREDICATE,
    ANN_TITLE,
    MAX_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    artifact,
    descriptor,
    referrers_index,
    referrers_tag,
)
from ._blobs import Blobs
from ._builds import Builds
from ._manifests import Manifests
from ._transport import next_link, registry_errors

__all__ = ["Referrer", "Referrers"]


@dataclasses.dataclass(frozen=True)
class Referrer:
    """One manifest attached to a build (its ``subject`` is the build's OCI manifest): a descriptor
    from the referrers list. Pull it by digest (``oras pull REPO@DIGEST``) for the envelope."""

    digest: str
    size: int
    artifact_type: str
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    media_type: str = OCI_MANIFEST


class Referrers:
    """Listing (API or fallback tag) and attaching; attaching runs under the caller's writer lock."""

    def __init__(self, manifests: Manifests, blobs: Blobs, builds: Builds):
        self.manifests, self.blobs, self.builds = manifests, blobs, builds
        # Does the server answer the referrers API? None until it has said (200 / OCI-Subject, or 404).
        self.api: bool | None = None

    def where(self) -> str:
        return self.manifests.where()

    # ---- listing --------------------------------------------------------------------------
    def of(self, digest: str, artifact_type: str | None = None) -> list[Referrer]:
        """The manifests whose subject is ``digest``, oldest first, of ``artifact_type`` if given."""
        found, _ = self._descriptors(digest, f"list referrers of {digest}", artifact_type)
        out = []
        for d in found:
            if artifact_type is not None and d.get("artifactType") != artifact_type:
                continue  # a server that did not apply the filter
            out.append(
                Referrer(
                    str(d["digest"]),
                    int(d["size"]),
                    str(d.get("artifactType") or ""),
                    dict(d.get("annotations") or {}),
                    str(d.get("mediaType") or OCI_MANIFEST),
                )
            )
        return out

    def _descriptors(self, digest: str, op: str, artifact_type: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """(the referrer descriptors of a manifest, whether they came from the fallback tag)."""
        if self.api is not False:
            listed = self._api_list(digest, op, artifact_type)
            if listed is not None:
                return listed, False
        return self._fallback(digest, op), True

    def _api_list(self, digest: str, op: str, artifact_type: str | None) -> list[dict[str, Any]] | None:
        """The referrers API's answer (every page), or None where the registry does not have it (404)."""
        transport = self.manifests.transport
        first = f"{self.manifests.base}/referrers/{digest}"
        url: str | None = first if artifact_type is None else f"{first}?artifactType={quote(artifact_type, safe='')}"
        out: list[dict[str, Any]] = []
        while url:
            reply = transport.call(op, "GET", url, headers={"Accept": OCI_INDEX}, limit=MAX_MANIFEST)
            if reply.status == 404:
                # A registry with the API answers 200 for every repository it has: 404 means no API,
                # unless the repository itself is unknown (then there is nothing to list either way).
                if "NAME_UNKNOWN" not in registry_errors(reply.body):
                    self.api = False
                return None
            if reply.status != 200:
                raise transport.fail(op, reply)
            self.api = True
            out += self._index(reply.body, f"the referrers API's answer for {digest}")
            url = next_link(reply.headers.get("Link"), transport.location.root)
        return out

    def _index(self, body: bytes, where: str) -> list[dict[str, Any]]:
        """The descriptors of an OCI image index (a referrers list); IntegrityError for anything else."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise IntegrityError(f"{self.where()}: {where} is not JSON") from None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        described = isinstance(manifests, list) and all(
            isinstance(d, dict) and is_digest(str(d.get("digest", ""))) and isinstance(d.get("size"), int)
            for d in manifests
        )
        if not isinstance(doc, dict) or doc.get("mediaType", OCI_INDEX) != OCI_INDEX or not described:
            kind = doc.get("mediaType") if isinstance(doc, dict) else type(doc).__name__
            raise IntegrityError(
                f"{self.where()}: {where} is a {kind}, not an OCI image index of referrers ({OCI_INDEX})"
            )
        return cast(list[dict[str, Any]], manifests)  # checked just above: a list of descriptor dicts

    def _fallback(self, digest: str, op: str) -> list[dict[str, Any]]:
        tag = referrers_tag(digest)
        got = self.manifests.get(tag, f"{op} (tag {tag})")
        if got is None:
            return []
        # Not an index: someone else's tag. Reported rather than read as "no referrers" (and never
        # overwritten), so evidence is not silently lost.
        return self._index(got[1], f"the referrers tag {tag}")

    # ---- attaching (under the writer lock) ------------------------------------------------
    def attach(self, namespace: str, name: str, data: bytes, op: str) -> None:
        """Attach the signed blobs a record holds to their builds (those this repository holds)."""
        ns = STORED_NAMESPACES.get(namespace)
        by_build: dict[str, list[Attachment]] = {}
        for a in ns.attachments(data, name) if ns is not None else ():
            by_build.setdefault(a.build_id, []).append(a)
        for build_id, wanted in by_build.items():
            subject = self.builds.subject(build_id, f"{op}: attach to build {build_id}")
            if subject is not None:
                self._attach_to(subject, build_id, wanted, data, f"{op}: attach to build {build_id}")

    def _attach_to(
        self, subject: dict[str, Any], build_id: str, wanted: list[Attachment], record: bytes, op: str
    ) -> None:
        present, from_tag = self._descriptors(subject["digest"], op)
        have = {(d.get("artifactType"), (d.get("annotations") or {}).get(ANN_ENVELOPE)) for d in present}
        unlisted = []
        for a in wanted:
            if (a.artifact_type, a.blob.digest) in have:
                continue
            have.add((a.artifact_type, a.blob.digest))
            # a statement is its own envelope: its bytes are in hand; evidence is read back from its blob
            envelope = record if a.blob.digest == sha256_digest(record) else self.blobs.get(a.blob.digest, a.blob.size)
            body, ann = self._manifest(a, envelope, build_id, subject)
            digest, reply = self.manifests.push(sha256_digest(body), body, op)
            if reply.headers.get("OCI-Subject") == subject["digest"]:
                self.api = True  # the registry lists it itself
                continue
            d = descriptor(OCI_MANIFEST, digest, len(body), ann)
            d["artifactType"] = a.artifact_type
            unlisted.append(d)
        if unlisted:
            self._extend_fallback(subject["digest"], unlisted, present if from_tag else None, op)

    def _manifest(
        self, a: Attachment, envelope: bytes, build_id: str, subject: dict[str, Any]
    ) -> tuple[bytes, dict[str, str]]:
        """The manifest attaching ``a`` to its build: the same bytes wherever it is written (no times),
        so the same attachment in another registry of the same OCI build has the same digest."""
        title, predicate = a.label(envelope)
        ann = {ANN_BUILD_ID: build_id, ANN_ENVELOPE: a.blob.digest}
        if predicate:
            ann[ANN_PREDICATE] = predicate
        self.blobs.ensure_empty()
        layer = descriptor(a.blob.media_type, a.blob.digest, a.blob.size, {ANN_TITLE: title})
        return artifact(a.artifact_type, [layer], ann, subject=subject), ann

    def _extend_fallback(
        self, digest: str, new: list[dict[str, Any]], current: list[dict[str, Any]] | None, op: str
    ) -> None:
        """Read-modify-write the referrers tag of ``digest`` (the distribution spec's fallback), read back."""
        tag = referrers_tag(digest)
        current = self._fallback(digest, op) if current is None else current
        known = {d["digest"] for d in current}
        manifests = current + [d for d in new if d["digest"] not in known]
        if len(manifests) == len(current):
            return
        written = self.manifests.put(tag, referrers_index(manifests), f"{op} (tag {tag})", OCI_INDEX)
        if not self.manifests.points_at(tag, written, op):
            raise ConflictError(
                f"{self.where()}: {op}: the referrers tag {tag} was overwritten by a writer outside this machine's "
                "lock; write the record again to attach its evidence"
            )
