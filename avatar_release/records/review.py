"""The blind frame-by-frame review of a build whose output fell below the similarity band.

Changelog of ``avatar-release/review`` (``REVIEW_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version.
"""

from __future__ import annotations

from typing import Literal

from ._base import Record

__all__ = ["REVIEW_SCHEMA_VERSION", "ReviewAnswer", "ReviewDecision", "ReviewRecord"]

REVIEW_SCHEMA_VERSION = 1


class ReviewAnswer(Record):
    pair: int  # index into ReviewRecord.frames
    choice: Literal["left", "right", "same"]  # which side looks better, or no visible difference
    preferred: Literal["baseline", "candidate", "same"]  # resolved by the server, never shown
    at: str


class ReviewDecision(Record):
    decision: Literal["approved", "rejected"]
    reviewer: str
    note: str
    at: str


class ReviewRecord(Record):
    """A blind frame-by-frame review of a build whose output fell below the band."""

    kind: Literal["avatar-release/review"] = "avatar-release/review"
    schema_version: int = REVIEW_SCHEMA_VERSION
    build_id: str
    build_digest: str
    gate_result_digest: str
    baseline_digest: str
    seed: int  # drew the left/right order
    frames: list[int]  # global frame indices under review
    candidate_left: list[bool]  # per pair: is the candidate on the left?
    answers: list[ReviewAnswer] = []
    decision: ReviewDecision | None = None
    created_at: str

    @property
    def complete(self) -> bool:
        return {a.pair for a in self.answers} >= set(range(len(self.frames)))
