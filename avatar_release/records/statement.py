"""Signed promotion statements: what a pod checks before it trusts where a channel points.

Changelog of ``avatar-release/statement`` (``STATEMENT_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version. ``build_digest`` is the digest of the build in the store it was
    signed in: the manifest's sha256 in a directory store, the OCI manifest's digest in an OCI one.
  * 2 (2026-12-01): ``build_digest`` is always the store-independent manifest digest
    (``Manifest.content_digest()``), so a statement verifies in every copy of the build
    (``avatar-release copy`` between any two stores). Same fields. Version-1 statements are still
    verified, against either digest (stored example: tests/data/statement-envelope.v1.json).
Changelog of ``avatar-release/signed-statement`` (no reader since 2026-12-05; its schema stays in
``manifests/schema/signed-statement.v1.json``):
  * 1 (2026-11-29): first version (a bare Ed25519 signature beside a version-1 payload); written
    until 2026-12-01, when statements became DSSE envelopes; outside the support window since
    2026-12-05: refused (exit 11) naming ``avatar-release keys sign CHANNEL``, never verified.
Changelog of ``avatar-release/timestamp`` (``TIMESTAMP_SCHEMA_VERSION``):
  * 1 (2026-12-01): first version: a short-lived, re-signed-on-a-schedule statement of the newest
    sequence of a channel (the role TUF calls "timestamp"); ``build_digest`` as in the statement
    it vouches for.
  * 2 (2026-12-01): ``build_digest`` is the store-independent manifest digest, as in a version-2
    statement. Same fields.
"""

from __future__ import annotations

from typing import Literal

from ._base import Record

__all__ = ["STATEMENT_SCHEMA_VERSION", "TIMESTAMP_SCHEMA_VERSION", "StatementPayload", "TimestampPayload"]

STATEMENT_SCHEMA_VERSION = 2
TIMESTAMP_SCHEMA_VERSION = 2


class StatementPayload(Record):
    kind: Literal["avatar-release/statement"] = "avatar-release/statement"
    schema_version: int = STATEMENT_SCHEMA_VERSION
    build_id: str
    build_digest: str  # v2: Manifest.content_digest(), the same in every store; v1: the signing store's digest
    channel: str
    sequence: int
    issued_at: str
    expires_at: str
    key_id: str
    who: str


class TimestampPayload(Record):
    """ "As of ``issued_at``, the newest move of ``channel`` is ``sequence`` (to ``build_digest``)."

    Valid for hours, not days: a pod with no memory of its own (a restarted container) accepts a
    promotion statement only with an unexpired timestamp naming its sequence, so an older
    statement replayed to it is refused once the timestamp that named it has expired.
    """

    kind: Literal["avatar-release/timestamp"] = "avatar-release/timestamp"
    schema_version: int = TIMESTAMP_SCHEMA_VERSION
    channel: str
    sequence: int
    build_id: str
    build_digest: str  # as in the statement it vouches for
    issued_at: str
    expires_at: str
    key_id: str
