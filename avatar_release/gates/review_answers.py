"""Who may sign review evidence, and the signed blind answers.

Every answer is an attestation (kind ``review-answer``) signed with the answering reviewer's
key, naming the reviewer, the pair, the frame, the choice, the gate result and the order
commitment. A reviewer the trust policy does not name, or a key that is not theirs, is refused
before anything is stored. The answers listed in the review record are a mirror for display,
rebuilt from the signed ones on each write.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._digest import canonical_json, sha256_digest
from ..errors import InputError, NotFoundError, Refusal
from ..records import REVIEW_SCHEMA_VERSION, ReviewAnswer, ReviewRecord, utcnow
from ..registry import Registry
from ..trust import key_id, load_private_key
from ..trust.evidence import sign_and_store
from ..trust.policy import TrustPolicy, load_policy, local_identity
from .review_evidence import CHOICES, owns_name, review_subject, signed_answers
from .store import load_review, save_review

if TYPE_CHECKING:  # only for annotations: cryptography loads when a key is used
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    Signer = Ed25519PrivateKey | str | os.PathLike[str] | None

__all__ = ["reviewer_signer", "record_answer", "save_answers"]


def reviewer_signer(
    reviewer: str | None, signer: Signer, policy: TrustPolicy | None, *, what: str
) -> tuple[Ed25519PrivateKey, str, TrustPolicy]:
    """(private key, reviewer name, policy) once the policy names ``reviewer`` with that key.

    ``reviewer`` defaults to this machine's reviewer, ``signer`` (a private key or its path) to
    its reviewer key: a name typed on the command line proves nothing, the signature does. The
    key is checked as the evidence it signs will be (``review_evidence.owns_name``)."""
    policy = policy or load_policy()
    reviewer = (reviewer or local_identity().reviewer).strip()
    if reviewer not in policy.reviewers:
        raise Refusal(
            f"reviewer {reviewer!r} is not named by the trust policy {policy.path} (reviewers: "
            f"{', '.join(policy.reviewers) or 'none'}); add them under [review] with their public key"
        )
    key = _load_signer(signer) or local_identity().reviewer_key()
    have = key_id(key.public_key())
    if not owns_name(policy, reviewer, (have,)):
        raise Refusal(
            f"reviewer {reviewer!r}: the trust policy {policy.path} knows them by key "
            f"{key_id(policy.keys[reviewer])}, but this {what} would be signed with {have}; sign with "
            "their key (--reviewer-key)"
        )
    return key, reviewer, policy


def _load_signer(signer: Signer) -> Ed25519PrivateKey | None:
    """A private key, a path to one (``--reviewer-key``), or None (this machine's reviewer key)."""
    if signer is None or not isinstance(signer, (str, os.PathLike)):
        return signer
    return load_private_key(signer)


def save_answers(
    registry: Registry, review: ReviewRecord, answers: dict[int, ReviewAnswer], **update: Any
) -> ReviewRecord:
    """Store ``review`` with its answer mirror rebuilt from ``answers`` (and ``update`` applied)."""
    review = review.model_copy(
        update={"schema_version": REVIEW_SCHEMA_VERSION, "answers": [answers[k] for k in sorted(answers)], **update}
    )
    save_review(registry, review)
    return review


def record_answer(
    registry: Registry,
    build_id: str,
    pair: int,
    choice: str,
    *,
    reviewer: str | None = None,
    signer: Signer = None,
    policy: TrustPolicy | None = None,
) -> ReviewRecord:
    """Record one blind answer, signed by ``reviewer`` (default: this machine's reviewer) with
    ``signer`` (their private key or its path; default: this machine's reviewer key).

    Refuses a reviewer the trust policy does not name or a key that is not theirs, and a second
    answer to a pair that already has a signed one. ``preferred`` stays empty until the decision.
    Callers that answer from several threads serialise their calls (the review server does).
    """
    key, reviewer, policy = reviewer_signer(reviewer, signer, policy, what="answer")
    review = load_review(registry, build_id)
    if review is None:
        raise NotFoundError(f"no review open for {build_id}")
    if review.decision is not None:
        raise Refusal(f"review of {build_id} was already decided ({review.decision.decision})")
    if not isinstance(pair, int) or isinstance(pair, bool) or not 0 <= pair < len(review.frames):
        raise InputError(f"pair {pair!r}: expected 0..{len(review.frames) - 1}")
    if choice not in CHOICES:
        raise InputError(f"choice {choice!r}: expected left, right or same")
    subject = review_subject(registry, build_id)
    signed = signed_answers(registry, review, policy, subject)
    if pair in signed:
        raise Refusal(f"pair {pair} was already answered (by {signed[pair].reviewer}); answers are final")
    predicate = {
        "build_id": build_id,
        "gate_result_digest": review.gate_result_digest,
        "order_commitment": review.order_commitment,
        "pair": pair,
        "frame": review.frames[pair],
        "choice": choice,
        "reviewer": reviewer,
        "at": utcnow(),
    }
    sign_and_store(registry, key, kind="review-answer", build_id=build_id, subject_digest=subject, predicate=predicate)
    signed[pair] = ReviewAnswer(
        pair=pair,
        choice=choice,
        at=predicate["at"],
        reviewer=reviewer,
        evidence=sha256_digest(canonical_json(predicate)),
    )
    return save_answers(registry, review, signed)
