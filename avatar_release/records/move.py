"""One move of a channel, as the signed release state keeps it: a content-addressed blob that names
the move before it, so the channel's signed metadata (which names its newest move by digest)
authenticates the channel's whole history through the chain.

Changelog of ``avatar-release/move`` (``MOVE_SCHEMA_VERSION``):
  * 1 (2026-12-05): first version.
"""

from __future__ import annotations

from typing import Literal

from ._base import BlobRef, Record, check_digest_fields

__all__ = ["MOVE_SCHEMA_VERSION", "MOVE_MEDIA_TYPE", "MoveRecord"]

MOVE_SCHEMA_VERSION = 1
MOVE_MEDIA_TYPE = "application/vnd.avatar-release.move.v1+json"


class MoveRecord(Record):
    schema_version: int = MOVE_SCHEMA_VERSION
    kind: Literal["avatar-release/move"] = "avatar-release/move"
    channel: str
    # publish: compile pointed dev at a new build; upgrade: the state an unsigned registry had when
    # it was first signed (`registry upgrade`), taken as its operator vouched for it
    action: Literal["publish", "promote", "rollback", "upgrade"]
    version: int  # the channel role's metadata version this move made
    build_id: str
    manifest_digest: str  # the build manifest's content digest (the same in every store)
    from_build: str | None = None
    from_manifest_digest: str | None = None
    who: str
    when: str
    reason: str = ""
    gate_result_digest: str | None = None  # the signed verdict that let the build in (None: dev)
    evidence: list[BlobRef] = []  # the envelopes that decided: the gate result, prod's release approvals
    previous: BlobRef | None = None  # the channel's move before this one (None: its first)

    _digests = check_digest_fields("manifest_digest", "from_manifest_digest", "gate_result_digest")
