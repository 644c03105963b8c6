"""Signed promotion statements: what a pod checks before it trusts where a channel points.

Changelog of ``avatar-release/statement`` and ``avatar-release/signed-statement``
(``STATEMENT_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version.
"""

from __future__ import annotations

from typing import Literal

from ._base import Record

__all__ = ["STATEMENT_SCHEMA_VERSION", "StatementPayload", "SignedStatement"]

STATEMENT_SCHEMA_VERSION = 1


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
