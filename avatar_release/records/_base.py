"""What every on-disk record shares: canonical bytes, a content digest, and a versioned reader.

Each record kind that is stored on its own (a build manifest, a gate result, ...) declares
``kind`` and ``schema_version`` (the version this tool writes) and ``oldest_readable``.
The version moves with every change of the format, additive or not (records forbid unknown
fields, so an older reader could not read a newer record anyway); each kind's module keeps
a dated changelog, and ``tests/data/`` keeps a stored example of every released version.

A reader refuses a newer version with :class:`SchemaVersionError` (its own exit code), named
before any field is validated, so "written by a newer avatar-release" never reads like
tampering.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .._digest import DIGEST_RE, canonical_json, sha256_digest
from ..errors import IntegrityError, SchemaVersionError

__all__ = ["Record", "BlobRef", "parse_record", "readable_versions", "utcnow", "check_digest_fields"]


def utcnow() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Stored kinds override this: the oldest schema_version this tool still reads.
    oldest_readable: ClassVar[int] = 1

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
    """(kind, oldest, newest) schema versions this tool reads for a stored record kind."""
    fields = cls.model_fields
    if "kind" not in fields or "schema_version" not in fields:
        raise TypeError(f"{cls.__name__} is not a stored record kind (no kind / schema_version)")
    return fields["kind"].default, cls.oldest_readable, fields["schema_version"].default


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
        newer = version > hi
        raise SchemaVersionError(
            f"{where}: {kind} schema_version {version}, this avatar-release reads {lo}..{hi}; "
            + ("it was written by a newer avatar-release: upgrade avatar-release to read it" if newer
               else "it is older than this avatar-release supports: recompile or re-gate with this version"),
            kind=kind, found=version, supported=(lo, hi),
        )
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise IntegrityError(
            f"{where}: invalid {kind} v{version}: {loc}: {first['msg']} ({e.error_count()} error(s))"
        ) from None
