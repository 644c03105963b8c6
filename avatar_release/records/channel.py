"""Where a channel points, and the append-only history of every move.

Changelog of ``avatar-release/channel`` (``CHANNEL_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version.
Changelog of ``avatar-release/history-entry`` (``HISTORY_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version.
"""

from __future__ import annotations

from typing import Literal

from ._base import Record, check_digest_fields

__all__ = ["CHANNELS", "CHANNEL_SCHEMA_VERSION", "HISTORY_SCHEMA_VERSION", "ChannelState", "HistoryEntry"]

# The release channels, in promotion order: every room names them from here.
CHANNELS = ("dev", "staging", "prod")

CHANNEL_SCHEMA_VERSION = 1
HISTORY_SCHEMA_VERSION = 1


class ChannelState(Record):
    schema_version: int = CHANNEL_SCHEMA_VERSION
    kind: Literal["avatar-release/channel"] = "avatar-release/channel"
    channel: str
    build_id: str
    digest: str
    sequence: int
    updated_at: str

    _digests = check_digest_fields("digest")


class HistoryEntry(Record):
    schema_version: int = HISTORY_SCHEMA_VERSION
    kind: Literal["avatar-release/history-entry"] = "avatar-release/history-entry"
    sequence: int  # registry-wide, strictly increasing
    channel: str
    action: Literal["publish", "promote", "rollback"]
    from_build: str | None
    from_digest: str | None
    to_build: str
    to_digest: str
    who: str
    when: str
    reason: str
    gate_result_digest: str | None = None

    _digests = check_digest_fields("from_digest", "to_digest", "gate_result_digest")
