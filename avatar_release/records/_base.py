"""What every on-disk record shares: canonical bytes, a content digest, and a versioned reader.

Each record kind that is stored on its own (a build manifest, a gate result, ...) declares
``kind`` and ``schema_version`` (the version this tool writes, its CURRENT). The version moves
with every change of the format, additive or not (records forbid unknown fields, so an older
reader could not read a newer record anyway); each kind's module keeps a dated changelog, and
``tests/data/`` keeps a stored example of every released version.

**The support window**: this tool reads the current version of each kind and the one before it
(``SUPPORTED_VERSIONS``; :func:`oldest_supported` derives each kind's OLDEST_SUPPORTED from its
CURRENT, so a new version moves the window and the version two back drops out). Readers of
versions outside the window are removed, not kept beside the current one. A record outside it
is refused with :class:`SchemaVersionError` (its own exit code, 11) naming the kind, its version,
the window and what to do (:data:`UPGRADE`: recompile a build, re-run a gate, re-sign a
statement), before any field is validated, so "written by another avatar-release" never reads
like tampering.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .._digest import DIGEST_RE, canonical_json, sha256_digest
from ..errors import IntegrityError, SchemaVersionError

__all__ = [
    "Record",
    "BlobRef",
    "parse_record",
    "readable_versions",
    "utcnow",
    "check_digest_fields",
    "SUPPORTED_VERSIONS",
    "oldest_supported",
    "UPGRADE",
    "RECORD_FORMATS_PAGE",
]

# How many schema versions of each record kind this tool reads: the current one and the previous.
SUPPORTED_VERSIONS = 2
# Where a version error sends the user: a page of the docs site.
RECORD_FORMATS_PAGE = "docs site: Reference > Record formats, support window"

# What to do with a record older than the window, by kind: write it again with this avatar-release.
_REGATE = (
    "run the gate again with this avatar-release (`avatar-release gate BUILD`); the gate key signs the new evidence"
)
UPGRADE: dict[str, str] = {
    "avatar-release/build": (
        "compile the build again with this avatar-release (`avatar-release compile --pipeline PIPELINE --target "
        "TARGET`: builds are reproducible, the same program comes out under a new build id, since the identity "
        "covers the version), then gate and promote it; signatures over the old manifest do not carry over"
    ),
    "avatar-release/gate-result": _REGATE,
    "avatar-release/compile-gate": _REGATE,
    "avatar-release/gate-shard": _REGATE,
    "avatar-release/band": "measure the band again with this avatar-release (`avatar-release gate calibrate`)",
    "avatar-release/review": (
        "hold the blind review again with this avatar-release (`avatar-release review BUILD`); "
        "reviewers sign their new answers"
    ),
    "avatar-release/statement": (
        "re-sign the channel's statement with this avatar-release (`avatar-release keys sign CHANNEL --key KEY`)"
    ),
    "avatar-release/timestamp": "refresh it with this avatar-release (`avatar-release keys refresh CHANNEL`)",
}
_UPGRADE_OTHER = (
    "read it with the avatar-release that wrote it, or write it again with this one (the registry's "
    "records: `avatar-release registry upgrade`)"
)


def oldest_supported(current: int) -> int:
    """The oldest schema version read of a kind whose current version is ``current``."""
    return max(1, current - SUPPORTED_VERSIONS + 1)


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json_bytes(self) -> bytes:
        """Canonical bytes: what is stored and what the digest is taken over."""
        return canonical_json(self.model_dump(mode="json"))

    def content_digest(self) -> str:
        return sha256_digest(self.to_json_bytes())


def check_digest_fields(*names: str) -> classmethod[Any, [object], object]:
    """A validator for fields that hold sha256 digests (None allowed): a malformed one read from a
    registry file makes the record invalid, an integrity refusal naming the file, never a crash
    where the digest is used. Validation only: the JSON schema is unchanged."""

    def check(cls: type[BaseModel], v: object) -> object:
        if v is not None and not (isinstance(v, str) and DIGEST_RE.match(v)):
            raise ValueError(f"expected 'sha256:' + 64 lowercase hex, got {v!r}")
        return v

    return field_validator(*names)(classmethod(check))


class BlobRef(Record):
    """A content-addressed blob: what to fetch and how to check it before use."""

    digest: str
    size: int = Field(ge=0)
    media_type: str

    @field_validator("digest")
    @classmethod
    def _check_digest(cls, v: str) -> str:
        if not DIGEST_RE.match(v):
            raise ValueError(f"expected 'sha256:' + 64 lowercase hex, got {v!r}")
        return v


def readable_versions(cls: type[Record]) -> tuple[str, int, int]:
    """(kind, oldest, newest) schema versions this tool reads for a stored record kind: its support window."""
    fields = cls.model_fields
    if "kind" not in fields or "schema_version" not in fields:
        raise TypeError(f"{cls.__name__} is not a stored record kind (no kind / schema_version)")
    current = fields["schema_version"].default
    return fields["kind"].default, oldest_supported(current), current


def parse_record(cls: type[Record], data: bytes, *, where: str) -> Any:
    """Parse stored bytes as ``cls``, checking the kind and schema version first.

    Raises IntegrityError (bad JSON, wrong kind, bad fields) or SchemaVersionError, naming
    ``where``.
    """
    kind, lo, hi = readable_versions(cls)
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise IntegrityError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("kind", kind) != kind:
        raise IntegrityError(f"{where}: expected a {kind} record, found kind {raw.get('kind')!r}")
    version = raw.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise IntegrityError(f"{where}: missing or non-integer schema_version (got {version!r})")
    if not lo <= version <= hi:
        fix = (
            "it was written by a newer avatar-release: upgrade avatar-release to read it"
            if version > hi
            else f"it is older than the support window (the current version and the one before): "
            f"{UPGRADE.get(kind, _UPGRADE_OTHER)}"
        )
        raise SchemaVersionError(
            f"{where}: {kind} schema_version {version}, this avatar-release reads {lo}..{hi}; {fix} "
            f"({RECORD_FORMATS_PAGE})",
            kind=kind,
            found=version,
            supported=(lo, hi),
        )
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise IntegrityError(
            f"{where}: invalid {kind} v{version}: {loc}: {first['msg']} ({e.error_count()} error(s))"
        ) from None
