"""Builds in one OCI repository: committed, listed and resolved.

A build is an OCI artifact (``artifactType`` :data:`BUILD_ARTIFACT`) whose config blob is the
avatar-release build manifest and whose layers are every blob it names; its commit marker is the
build tag of the :class:`TagLayout` (written in one PUT after all blobs exist, under the writer
lock). The digest of a build is the digest of that OCI manifest, what ``skopeo inspect --raw``
hashes to and what a pod pins.
"""

from __future__ import annotations

import json
from typing import Any

from ..._digest import is_digest, sha256_digest
from ...errors import InputError, IntegrityError, NotFoundError, RegistryError
from ...records import utcnow
from .._lock import FileLock
from .._protocol import BuildRef, Resolved
from .._resolve import Lookups, plausible_name, resolve_ref
from ._artifact import (
    ANN_BUILD_ID,
    ANN_CREATED,
    ANN_PIPELINE,
    ANN_PUBLISHED,
    ANN_TARGET,
    ANN_TITLE,
    BUILD_ARTIFACT,
    BUILD_CONFIG_TYPE,
    MANIFEST_TITLE,
    OCI_MANIFEST,
    RECORD_TYPE,
    artifact,
    build_id_of,
    build_layers,
    descriptor,
    is_referrers_tag,
)
from ._blobs import Blobs
from ._layout import TagLayout
from ._manifests import Manifests

__all__ = ["Builds"]


class Builds:
    """Build commits, reads and reference resolution over the repository's manifests and blobs."""

    def __init__(self, manifests: Manifests, blobs: Blobs, layout: TagLayout, lock: FileLock, uri: str):
        self.manifests, self.blobs, self.layout, self.lock, self.uri = manifests, blobs, layout, lock, uri

    def where(self) -> str:
        return self.manifests.where()

    def id_of(self, doc: dict[str, Any], what: str) -> str:
        return build_id_of(doc, f"{self.where()}: {what}")

    # ---- commit ---------------------------------------------------------------------------
    def put(self, build_id: str, manifest_bytes: bytes, *, artifact: bytes | None = None) -> tuple[str, bool]:
        """Commit a build: its manifest blob, then the OCI manifest under the build tag (the marker).

        Returns (OCI manifest digest, created). An existing build id is never rewritten. The
        registry itself refuses the manifest when a blob it references is missing. ``artifact``:
        the exact OCI manifest of this build in another OCI registry (:meth:`artifact`), written
        as is so the build keeps its digest there too (``copy``).
        """
        tag = self.layout.build_tag(build_id)
        op = f"publish build {build_id}"
        with self.lock.hold():
            existing = self.head(build_id, op)
            if existing is not None:
                return existing, False
            config_digest = self.blobs.put(manifest_bytes)
            body = (
                self._new_artifact(build_id, manifest_bytes, config_digest)
                if artifact is None
                else self._checked_artifact(build_id, manifest_bytes, artifact)
            )
            digest = self.manifests.put(tag, body, op)
            now = self.manifests.head(tag, f"{op} (read-back)")
            if now is None:
                raise RegistryError(f"{self.where()}: {op}: the tag {tag} is missing right after it was written")
            # A different digest: a publisher outside this machine's lock wrote the same id at the
            # same time; the build id names what the registry holds now, so report that one.
            return now, now == digest

    def _new_artifact(self, build_id: str, manifest_bytes: bytes, config_digest: str) -> bytes:
        try:
            doc = json.loads(manifest_bytes)
        except ValueError:
            raise InputError(f"build {build_id}: the manifest is not JSON") from None
        # The manifest itself first (also the config), then every blob it names, each titled with a
        # file name, so that a standard client (``oras pull``) materializes the build as files.
        layers = [descriptor(BUILD_CONFIG_TYPE, config_digest, len(manifest_bytes), {ANN_TITLE: MANIFEST_TITLE})]
        layers += build_layers(doc, RECORD_TYPE)
        ann = {ANN_BUILD_ID: build_id, ANN_PUBLISHED: utcnow()}
        fields = doc if isinstance(doc, dict) else {}
        for key, field in ((ANN_CREATED, "created_at"), (ANN_PIPELINE, "pipeline"), (ANN_TARGET, "target")):
            if isinstance(fields.get(field), str):
                ann[key] = fields[field]
        config = descriptor(BUILD_CONFIG_TYPE, config_digest, len(manifest_bytes))
        return artifact(BUILD_ARTIFACT, layers, ann, config)

    def _checked_artifact(self, build_id: str, manifest_bytes: bytes, body: bytes) -> bytes:
        """``body`` if it is an avatar-release build artifact of this very build and manifest."""
        doc = self.manifests.parse(body, f"build artifact of {build_id}", BUILD_ARTIFACT)
        config = doc.get("config") or {}
        if (
            self.id_of(doc, f"build artifact of {build_id}") != build_id
            or config.get("digest") != sha256_digest(manifest_bytes)
            or config.get("size") != len(manifest_bytes)
        ):
            raise IntegrityError(
                f"{self.where()}: the OCI manifest given for build {build_id} names another build or manifest; "
                "refusing it"
            )
        return body

    # ---- reads ----------------------------------------------------------------------------
    def head(self, build_id: str, op: str) -> str | None:
        """The digest of a committed build: its tag in the newest layout that has one."""
        for tag in self.layout.build_tags(build_id):
            found = self.manifests.head(tag, op)
            if found is not None:
                return found
        return None

    def doc(self, digest: str, op: str) -> tuple[bytes, dict[str, Any]]:
        """(bytes, parsed) of the build artifact with this digest."""
        got = self.manifests.get(digest, op)
        if got is None:
            raise NotFoundError(f"manifest {digest} not found in registry {self.uri}")
        return got[1], self.manifests.parse(got[1], f"manifest {digest}", BUILD_ARTIFACT)

    def artifact(self, digest: str) -> bytes:
        """The exact bytes of the OCI manifest of the build with this digest (verified against it)."""
        return self.doc(digest, f"read build {digest}")[0]

    def manifest_bytes(self, digest: str) -> bytes:
        """The avatar-release manifest of the build whose OCI manifest has this digest."""
        if not is_digest(digest):
            raise NotFoundError(f"manifest {digest!r} not found in registry {self.uri}: not a sha256 digest")
        _, doc = self.doc(digest, f"read manifest {digest}")
        config = doc.get("config") or {}
        if config.get("mediaType") != BUILD_CONFIG_TYPE or not isinstance(config.get("size"), int):
            raise IntegrityError(f"{self.where()}: manifest {digest} has no avatar-release build manifest as config")
        return self.blobs.get(str(config.get("digest")), config["size"])

    def target(self, digest: str, build_id: str, op: str) -> bytes:
        """The exact bytes of the build manifest a channel will point at (same bytes, same digest)."""
        body, doc = self.doc(digest, op)
        actual = self.id_of(doc, f"manifest {digest}")
        if actual != build_id:
            raise IntegrityError(
                f"{self.where()}: manifest {digest} is build {actual}, not {build_id}; resolve the reference again"
            )
        return body

    def _ref(self, tag: str) -> BuildRef | None:
        got = self.manifests.get(tag, f"read build {tag}")
        if got is None:
            return None
        doc = self.manifests.parse(got[1], f"build tag {tag}", BUILD_ARTIFACT)
        ann = doc.get("annotations") or {}
        return BuildRef(ann.get(ANN_BUILD_ID, self.layout.build_id_of_tag(tag)), got[0], ann.get(ANN_PUBLISHED, ""))

    def ids(self, prefix: str = "") -> dict[str, str]:
        """build id -> its tag, for ids starting with ``prefix`` (the newest layout's tag wins)."""
        return self.layout.build_ids(self.manifests.tags_with(*self.layout.build_prefixes(prefix)), prefix)

    def list(self) -> list[BuildRef]:
        out = [r for r in (self._ref(t) for t in self.ids().values()) if r is not None]
        return sorted(out, key=lambda r: r.published_at)

    def subject(self, build_id: str, op: str) -> dict[str, Any] | None:
        """The descriptor of a build's OCI manifest, or None when this repository does not hold it."""
        if not plausible_name(build_id):
            return None  # an envelope naming no possible build here: nothing to attach to
        for tag in self.layout.build_tags(build_id):
            got = self.manifests.get(tag, op)
            if got is not None:
                return descriptor(OCI_MANIFEST, got[0], len(got[1]))
        return None

    # ---- resolution -----------------------------------------------------------------------
    def _by_digest(self, ref: str) -> Resolved:
        got = self.manifests.get(ref, f"resolve {ref}")
        if got is None:
            raise NotFoundError(f"no build with manifest digest {ref} in {self.uri}")
        build_id = self.id_of(self.manifests.parse(got[1], f"manifest {ref}", BUILD_ARTIFACT), f"manifest {ref}")
        # Only a committed build counts: its build tag must name this very manifest.
        if self.head(build_id, f"resolve {ref}") != ref:
            raise NotFoundError(f"no build with manifest digest {ref} in {self.uri} (no committed build reference)")
        return Resolved(ref, build_id, ref, "digest")

    def _channel(self, name: str) -> Resolved | None:
        if is_referrers_tag(name):
            return None  # a referrers list, never a channel
        got = self.manifests.get(name, f"resolve channel {name}")
        if got is None:
            return None
        doc = self.manifests.parse(got[1], f"channel tag {name}", BUILD_ARTIFACT)
        return Resolved(name, self.id_of(doc, f"channel tag {name}"), got[0], "channel")

    def resolve(self, ref: str) -> Resolved:
        """Channel name, build id, manifest digest, or a unique prefix of a build id.

        A channel tag is read once; the digest it gave is what everything after fetches.
        """
        return resolve_ref(
            ref,
            self.uri,
            Lookups(
                by_digest=self._by_digest,
                channel=self._channel,
                exact_build=lambda build_id: self.head(build_id, f"resolve build {build_id}"),
                builds_with_prefix=lambda p: sorted(self.ids(p)),
                latest=lambda: [b.build_id for b in self.list()],
            ),
        )
