"""A blind review's left/right order: drawn, committed and sealed when the review opens, opened
by the seal key's holder, revealed into the record at the decision.

The record holds ``order_commitment`` (sha256 over the order and a random 32-byte salt) and
``sealed_order`` (order and salt, sealed with this machine's review seal key, ``trust.seal``,
bound to the build, the gate result and the commitment).
"""

from __future__ import annotations

import json
import random
import secrets

from .._digest import canonical_json, sha256_digest
from ..errors import InputError, IntegrityError, TrustError
from ..records import GateResult, ReviewRecord, utcnow
from ..trust.seal import load_seal_key, seal, unseal
from .review_evidence import pairs_for

__all__ = ["new_review", "unseal_order", "preferred"]


def new_review(result: GateResult, result_digest: str, below: list[int], *, seed: int | None = None) -> ReviewRecord:
    """A sealed review of the frames below the band. ``seed`` makes the order reproducible
    (tests); without it the order comes from the OS's random source. Either way the record
    holds only a salted commitment and the sealed order."""
    if not below:
        raise InputError("nothing to review: no frame is below the band")
    below = pairs_for(below)
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    order = {"candidate_left": [rng.random() < 0.5 for _ in below], "salt": secrets.token_hex(32)}
    commitment = sha256_digest(canonical_json(order))
    key = load_seal_key()
    sealed = seal(key, canonical_json(order), _aad(result.build_id, result_digest, commitment))
    return ReviewRecord(
        build_id=result.build_id,
        build_digest=result.build_digest,
        gate_result_digest=result_digest,
        baseline_digest=result.baseline.digest if result.baseline else "",
        frames=list(below),
        order_commitment=commitment,
        sealed_order=sealed,
        seal_key_id=key.key_id,
        created_at=utcnow(),
    )


def unseal_order(review: ReviewRecord) -> tuple[list[bool], str | None]:
    """(per pair: is the candidate on the left?, the salt) — needs the seal key that sealed it.

    A version-1 record or a decided one carries the order itself. The opened order must match
    the commitment stored before the first answer, or this is a TrustError (tampered)."""
    if review.candidate_left is not None:
        return list(review.candidate_left), review.order_salt
    if not review.sealed_order or not review.order_commitment:
        raise IntegrityError(f"review of {review.build_id}: neither an order nor a sealed order is stored")
    key = load_seal_key()
    if review.seal_key_id != key.key_id:
        raise TrustError(
            f"review of {review.build_id}: its left/right order was sealed with review seal key "
            f"{review.seal_key_id}, this machine's is {key.key_id} ({key.path}); serve and decide the review "
            "on the machine that ran the gate, or point AVATAR_RELEASE_REVIEW_SEAL_KEY at that machine's key"
        )
    aad = _aad(review.build_id, review.gate_result_digest, review.order_commitment)
    try:
        doc = json.loads(unseal(key, review.sealed_order, aad))
    except (TrustError, ValueError):
        raise TrustError(
            f"review of {review.build_id}: the sealed order does not open under seal key {key.key_id} "
            "for this build, gate result and commitment (tampered, or moved from another review)"
        ) from None
    if sha256_digest(canonical_json(doc)) != review.order_commitment:
        raise TrustError(
            f"review of {review.build_id}: the sealed order does not match its commitment {review.order_commitment}"
        )
    left = doc["candidate_left"]
    if len(left) != len(review.frames):
        raise TrustError(
            f"review of {review.build_id}: sealed order has {len(left)} pairs, the review {len(review.frames)}"
        )
    return list(left), doc["salt"]


def preferred(choice: str, candidate_left: bool) -> str:
    """Which build an answer favoured, once the order is known: candidate, baseline or same."""
    if choice == "same":
        return "same"
    return "candidate" if (choice == "left") == candidate_left else "baseline"


def _aad(build_id: str, result_digest: str, commitment: str) -> bytes:
    # binds the ciphertext to its review: a sealed order copied into another record does not open
    return "\0".join(("avatar-release review order v1", build_id, result_digest, commitment)).encode()
