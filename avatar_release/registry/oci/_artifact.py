"""How avatar-release objects are encoded as OCI artifacts: media types, annotations, tags.

See :mod:`._registry` for how the registry protocol maps onto one repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..._digest import canonical_json, is_digest, sha256_digest
from ...errors import IntegrityError

__all__ = [
    "descriptor",
    "artifact",
    "build_id_of",
    "blob_refs",
    "build_layers",
    "MANIFEST_TITLE",
    "OCI_MANIFEST",
    "OCI_INDEX",
    "DOCKER_MANIFEST",
    "OCI_EMPTY",
    "EMPTY_BLOB",
    "ACCEPT",
    "BUILD_ARTIFACT",
    "HISTORY_ARTIFACT",
    "PENDING_ARTIFACT",
    "RECORD_ARTIFACT",
    "BUILD_CONFIG_TYPE",
    "ENTRY_TYPE",
    "RECORD_TYPE",
    "ANN_BUILD_ID",
    "ANN_PIPELINE",
    "ANN_TARGET",
    "ANN_PUBLISHED",
    "ANN_ENTRY",
    "ANN_RECORD",
    "ANN_CREATED",
    "ANN_TITLE",
    "INTERNAL_PREFIX",
    "BUILD_PREFIX",
    "V1_BUILD_PREFIX",
    "V1_RECORD_PREFIX",
    "V1_HISTORY_TAG",
    "V1_PENDING_TAG",
    "RECORD_PREFIX",
    "RECORD_SEP",
    "HISTORY_TAG",
    "PENDING_TAG",
    "MAX_TAG",
    "MAX_MANIFEST",
    "ANN_ENVELOPE",
    "ANN_PREDICATE",
    "referrers_tag",
    "is_referrers_tag",
    "referrers_index",
]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
ACCEPT = f"{OCI_MANIFEST}, {OCI_INDEX};q=0.9, {DOCKER_MANIFEST};q=0.5"

BUILD_ARTIFACT = "application/vnd.avatar-release.build.v1"
HISTORY_ARTIFACT = "application/vnd.avatar-release.history.v1"
PENDING_ARTIFACT = "application/vnd.avatar-release.pending-move.v1"
RECORD_ARTIFACT = "application/vnd.avatar-release.record.v1"
BUILD_CONFIG_TYPE = "application/vnd.avatar-release.build-manifest.v1+json"
ENTRY_TYPE = "application/vnd.avatar-release.history-entry.v1+json"
RECORD_TYPE = "application/octet-stream"

ANN_BUILD_ID = "io.avatar-release.build-id"
ANN_PIPELINE = "io.avatar-release.pipeline"
ANN_TARGET = "io.avatar-release.target"
ANN_PUBLISHED = "io.avatar-release.published-at"
ANN_ENTRY = "io.avatar-release.history-entry"
ANN_RECORD = "io.avatar-release.record"
ANN_CREATED = "org.opencontainers.image.created"
ANN_TITLE = "org.opencontainers.image.title"
# on a referrer (a signed blob attached to a build): which blob it carries, and what the signature says
ANN_ENVELOPE = "io.avatar-release.envelope"
ANN_PREDICATE = "io.avatar-release.predicate-type"

# Tag layout. Every bookkeeping tag starts with INTERNAL_PREFIX, so tag listings (``skopeo
# list-tags``) show channels and then one clearly internal family; channel names never start with "_".
#   2026-12-01 (layout 2): "_avr." + b.<build id> | r.<namespace>.N.<name> | history | pending.
#   before     (layout 1): "_b.<build id>", "_r.<namespace>.N.<name>", "_history", "_pending";
#                          still read (builds, records, history, pending), never written: the first
#                          channel move after the upgrade copies the whole history into the new tag.
#   2026-12-01 (still layout 2): signed evidence and statements are also attached to their build as
#     OCI referrers (untagged manifests whose ``subject`` is the build); on a registry without the
#     referrers API, the tag ``sha256-<hex of the build's OCI manifest digest>`` holds the index of
#     them. That tag is named by the OCI distribution spec (what cosign and oras read), not by us,
#     so it is not under INTERNAL_PREFIX; older readers skip it (it names no build).
INTERNAL_PREFIX = "_avr."
BUILD_PREFIX = INTERNAL_PREFIX + "b."
RECORD_PREFIX = INTERNAL_PREFIX + "r."
RECORD_SEP = ".N."
HISTORY_TAG = INTERNAL_PREFIX + "history"
PENDING_TAG = INTERNAL_PREFIX + "pending"
V1_BUILD_PREFIX = "_b."
V1_RECORD_PREFIX = "_r."
V1_HISTORY_TAG = "_history"
V1_PENDING_TAG = "_pending"
MAX_TAG = 128
# the layer holding the build manifest itself, so ``oras pull`` materializes a build as files
MANIFEST_TITLE = "avatar-release-manifest.json"
# distribution refuses manifest bodies over 4 MiB; reading more than that is never needed.
MAX_MANIFEST = 4 << 20


def descriptor(media_type: str, data_digest: str, size: int, annotations: dict | None = None) -> dict:
    d: dict[str, Any] = {"mediaType": media_type, "digest": data_digest, "size": size}
    if annotations:
        d["annotations"] = annotations
    return d


def artifact(
    artifact_type: str,
    layers: list[dict],
    annotations: dict[str, str],
    config: dict | None = None,
    subject: dict | None = None,
) -> bytes:
    """Canonical bytes of an OCI image manifest for an avatar-release artifact; with ``subject`` (a
    descriptor of another manifest) it is a referrer of that manifest."""
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config or descriptor(OCI_EMPTY, sha256_digest(EMPTY_BLOB), len(EMPTY_BLOB)),
        "layers": layers,
        "annotations": annotations,
    }
    if subject is not None:
        doc["subject"] = subject
    return canonical_json(doc)


def build_id_of(doc: dict[str, Any], where: str) -> str:
    """The build id an avatar-release artifact's annotations carry; IntegrityError without one."""
    build_id = (doc.get("annotations") or {}).get(ANN_BUILD_ID)
    if not isinstance(build_id, str) or not build_id:
        raise IntegrityError(f"{where} carries no {ANN_BUILD_ID} annotation")
    return build_id


_TAG_CHAR = re.compile(r"[^a-zA-Z0-9._-]")


def referrers_tag(digest: str) -> str:
    """The referrers tag schema of the OCI distribution spec: ``<alg>-<encoded>``, the algorithm cut
    to 32 characters and the encoded part to 64, characters a tag cannot hold replaced by ``-``."""
    alg, _, encoded = digest.partition(":")
    return f"{_TAG_CHAR.sub('-', alg[:32])}-{_TAG_CHAR.sub('-', encoded[:64])}"


def is_referrers_tag(tag: str) -> bool:
    return bool(re.fullmatch(r"sha256-[0-9a-f]{64}", tag))


def referrers_index(manifests: list[dict]) -> bytes:
    """An OCI image index listing referrers (the referrers API's answer; the fallback tag's content)."""
    return canonical_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})


def blob_refs(node: Any, label: str = "manifest") -> Iterator[tuple[str, dict]]:
    """Every BlobRef-shaped object ({digest, size, media_type}) in a manifest, with a label.

    Walking the JSON instead of parsing it as a Manifest keeps layers (and so garbage
    collection safety) right for manifests of other schema versions too.
    """
    if isinstance(node, dict):
        if is_digest(str(node.get("digest", ""))) and isinstance(node.get("size"), int) and "media_type" in node:
            yield label, node
            return
        for k, v in node.items():
            yield from blob_refs(v, _key_of(v) or str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from blob_refs(v, _key_of(v) or f"{label}[{i}]")


def _key_of(node: Any) -> str | None:
    """The ``key`` an executable entry carries (what it is called), if this node is one."""
    key = node.get("key") if isinstance(node, dict) else None
    return key if isinstance(key, str) else None


def _extension(media_type: str) -> str:
    """``application/vnd.avatar-release.weights.safetensors.v1+zstd`` -> ``.safetensors.zst``."""
    sub = media_type.split("/", 1)[-1]
    ext = ""
    if "safetensors" in sub:
        ext = ".safetensors"
    elif "weights.chunk" in sub:
        ext = ".tensors"
    elif "executable" in sub:
        ext = ".xla"
    elif sub.endswith("json"):
        ext = ".json"
    return ext + (".zst" if sub.endswith("+zstd") else "")


def _chunk_title(tensors: list) -> str:
    """A weight chunk says what it holds: its first tensor, and how many follow."""
    first = str(tensors[0].get("name", "tensor")) if tensors and isinstance(tensors[0], dict) else "empty"
    return first + (f"-and-{len(tensors) - 1}-more" if len(tensors) > 1 else "")


def _titled(node: Any, names: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict]]:
    if isinstance(node, dict) and isinstance(node.get("blob"), dict) and isinstance(node.get("tensors"), list):
        yield from _titled(node["blob"], ("weights", _chunk_title(node["tensors"])))  # a v5 weight chunk
        return
    if isinstance(node, dict):
        if is_digest(str(node.get("digest", ""))) and isinstance(node.get("size"), int) and "media_type" in node:
            yield names, node
            return
        for k, v in node.items():
            yield from _titled(v, names if k == "blob" else names + (str(k),))
    elif isinstance(node, list):
        parent, base = names[-1:] or ("item",), names[:-1]
        for i, v in enumerate(node):
            key = v.get("key") if isinstance(v, dict) and isinstance(v.get("key"), str) else None
            yield from _titled(v, base + ((key,) if key else (f"{parent[0]}-{i}",)))


def build_layers(doc: Any, media_fallback: str) -> list[dict]:
    """One layer per distinct blob a build manifest names, titled with a file name that says what
    it is (``weights.safetensors.zst``, ``dit-f8.xla.zst``): ``org.opencontainers.image.title``
    is what ``oras pull`` writes each layer as."""
    layers, seen, titles = [], set(), set()
    for names, ref in _titled(doc, ()):
        if ref["digest"] in seen:
            continue
        seen.add(ref["digest"])
        media = ref["media_type"] if isinstance(ref["media_type"], str) and "/" in ref["media_type"] else media_fallback
        stem = "-".join(n.replace("/", "-") for n in names) or "blob"
        stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem).strip(".-") or "blob"
        title = stem + _extension(media)
        if title in titles or title == MANIFEST_TITLE:
            title = f"{stem}-{ref['digest'][7:19]}{_extension(media)}"
        titles.add(title)
        layers.append(descriptor(media, ref["digest"], ref["size"], {ANN_TITLE: title}))
    return layers
