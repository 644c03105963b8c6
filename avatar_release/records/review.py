"""The blind frame-by-frame review of a build whose output fell below the similarity band.

Changelog of ``avatar-release/review`` (``REVIEW_SCHEMA_VERSION``):
  * 1 (2026-11-29): first version (stored example: tests/data/review.v1.json).
  * 2 (2026-12-01): the left/right order is sealed until the decision: ``order_commitment``
    (sha256 over the order and a random salt), ``sealed_order`` (the order and salt, encrypted
    with the gate machine's review seal key, ``seal_key_id``); ``candidate_left`` and
    ``order_salt`` are empty until the decision reveals them, ``seed`` is no longer written.
    Answers name their ``reviewer`` and the digest of their signed attestation (``evidence``);
    ``preferred`` is resolved only at the decision. A decision lists the ``answers`` (digests
    of the signed answers it counted) and the ``order_commitment`` it revealed. Version-1
    records (order in the clear) are still read: every field added has a default.
"""

from __future__ import annotations

from typing import Literal

from ._base import Record

__all__ = ["REVIEW_SCHEMA_VERSION", "ReviewAnswer", "ReviewDecision", "ReviewRecord"]

REVIEW_SCHEMA_VERSION = 2


class ReviewAnswer(Record):
    pair: int  # index into ReviewRecord.frames
    choice: Literal["left", "right", "same"]  # which side looks better, or no visible difference
    # resolved from the order at the decision (v1: by the server at once); None while sealed
    preferred: Literal["baseline", "candidate", "same"] | None = None
    at: str
    reviewer: str | None = None  # v2: who answered (their key signed the answer); v1: nobody recorded
    evidence: str | None = None  # v2: sha256 of the signed answer's predicate (attestations/<build>)


class ReviewDecision(Record):
    decision: Literal["approved", "rejected"]
    reviewer: str
    note: str
    at: str
    answers: list[str] = []  # v2: the signed answers counted (predicate digests), pair order
    order_commitment: str | None = None  # v2: the commitment whose order this decision revealed


class ReviewRecord(Record):
    """A blind frame-by-frame review of a build whose output fell below the band."""

    kind: Literal["avatar-release/review"] = "avatar-release/review"
    schema_version: int = REVIEW_SCHEMA_VERSION
    build_id: str
    build_digest: str
    gate_result_digest: str
    baseline_digest: str
    seed: int | None = None  # v1 only: drew the order in the clear
    frames: list[int]  # global frame indices under review
    # v2: sha256 over canonical JSON {"candidate_left": [...], "salt": hex}; binds the order before any answer
    order_commitment: str | None = None
    sealed_order: str | None = None  # v2: base64(nonce + AES-GCM ciphertext) of that JSON
    seal_key_id: str | None = None  # v2: which review seal key can open it
    candidate_left: list[bool] | None = None  # per pair: is the candidate on the left? v2: only once decided
    order_salt: str | None = None  # v2: revealed with the order, so anyone can check the commitment
    answers: list[ReviewAnswer] = []
    decision: ReviewDecision | None = None
    created_at: str

    @property
    def complete(self) -> bool:
        """Every pair has an answer in this record (display only: decisions count signed answers)."""
        return {a.pair for a in self.answers} >= set(range(len(self.frames)))

    @property
    def sealed(self) -> bool:
        """The order is not in this record (a v2 review before its decision)."""
        return self.candidate_left is None
