"""Signed promotion statements: what a pod checks before it trusts where a channel points.

Changelog of ``avatar-release/statement`` and ``avatar-release/signed-statement``
(``STATEMENT_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version.
Changelog of ``avatar-release/timestamp`` (``TIMESTAMP_SCHEMA_VERSION``):
  * 1 (2026-12-01): first version: a short-lived, re-signed-on-a-schedule statement of the newest
    sequence of a channel (the role TUF calls "timestamp").
"""

from __future__ import annotations

from typing import Literal

from ._base import Record

__all__ = ["STATEMENT_SCHEMA_VERSION", "TIMESTAMP_SCHEMA_VERSION", "StatementPayload", "SignedStatement",
           "TimestampPayload"]

STATEMENT_SCHEMA_VERSION = 1
TIMESTAMP_SCHEMA_VERSION = 1


class StatementPayload(Record):
    kind: Literal["avatar-release/statement"] = "avatar-release/statement"
    schema_version: int = STATEMENT_SCHEMA_VERSION
    build_id: str
    build_digest: str
    channel: str
    sequence: int
    issued_at: str
    expires_at: str
    key_id: str
    who: str


class SignedStatement(Record):
    kind: Literal["avatar-release/signed-statement"] = "avatar-release/signed-statement"
    schema_version: int = STATEMENT_SCHEMA_VERSION
    payload: StatementPayload
    signature: str  # base64 ed25519 over canonical JSON of the payload


class TimestampPayload(Record):
    """"As of ``issued_at``, the newest move of ``channel`` is ``sequence`` (to ``build_digest``)."

    Valid for hours, not days: a pod with no memory of its own (a restarted container) accepts a
    promotion statement only with an unexpired timestamp naming its sequence, so an older
    statement replayed to it is refused once the timestamp that named it has expired.
    """

    kind: Literal["avatar-release/timestamp"] = "avatar-release/timestamp"
    schema_version: int = TIMESTAMP_SCHEMA_VERSION
    channel: str
    sequence: int
    build_id: str
    build_digest: str
    issued_at: str
    expires_at: str
    key_id: str
