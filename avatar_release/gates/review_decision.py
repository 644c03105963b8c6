"""The decision on a blind review: approved or rejected, signed by a reviewer the policy names.

Approval needs a signed answer on every pair and records the digests of the answers it counted.
The decision reveals the order and salt into the record (and resolves each answer's
``preferred``), so anyone can check them against the commitment made before the first answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError, NotFoundError, Refusal, TrustError
from ..records import ReviewAnswer, ReviewDecision, ReviewRecord, utcnow
from ..registry import Registry
from ..trust.evidence import sign_and_store
from ..trust.policy import TrustPolicy
from .review_answers import reviewer_signer, save_answers
from .review_evidence import review_subject, signed_answers, unsigned_in_record
from .review_order import preferred, unseal_order
from .store import latest_result, load_review

if TYPE_CHECKING:
    from .review_answers import Signer

__all__ = ["decide"]


def decide(
    registry: Registry,
    build_id: str,
    *,
    approve: bool,
    reviewer: str | None,
    note: str,
    signer: Signer = None,
    policy: TrustPolicy | None = None,
) -> ReviewRecord:
    """Record the final decision on a build that needs review, signed by the reviewer.

    ``reviewer`` must be named by the trust policy (``policy``, default: the one in force) and
    ``signer`` (a private key or its path; default: this machine's own reviewer key) must be
    that reviewer's key. Approval needs a signed answer by a reviewer the policy names on every
    pair; the decision lists the digests of the answers it counted. The order is revealed into
    the record (and each answer's ``preferred`` resolved): approval needs the seal key to do
    that; a rejection is recorded even where the order cannot be opened.
    """
    if not reviewer or not reviewer.strip():
        raise InputError("--reviewer NAME is required with --approve or --reject: the person deciding")
    review, digest = _decidable(registry, build_id)
    key, reviewer, policy = reviewer_signer(reviewer, signer, policy, what="decision")
    subject = review_subject(registry, build_id)
    signed = signed_answers(registry, review, policy, subject)
    if approve:
        _require_every_pair(review, signed, policy)
    try:
        order, salt = unseal_order(review)
    except TrustError:
        if approve:
            raise
        order, salt = None, None  # a rejection can only hold a build back: record it anyway
    if order is not None:
        signed = {k: a.model_copy(update={"preferred": preferred(a.choice, order[k])}) for k, a in signed.items()}
    decision = ReviewDecision(
        decision="approved" if approve else "rejected",
        reviewer=reviewer,
        note=note,
        at=utcnow(),
        answers=[signed[k].evidence for k in sorted(signed)],
        order_commitment=review.order_commitment,
    )
    sign_and_store(
        registry,
        key,
        kind="review-decision",
        build_id=build_id,
        subject_digest=subject,
        predicate={"build_id": build_id, "gate_result_digest": digest, **decision.model_dump(mode="json")},
    )
    return save_answers(
        registry,
        review,
        signed,
        decision=decision,
        **({"candidate_left": order, "order_salt": salt} if order is not None else {}),
    )


def _decidable(registry: Registry, build_id: str) -> tuple[ReviewRecord, str]:
    """(the open review, the latest gate result's digest) when the build can be decided now."""
    latest = latest_result(registry, build_id)
    if latest is None:
        raise NotFoundError(f"build {build_id} has no gate result; run `avatar-release gate {build_id}` first")
    result, digest = latest
    review = load_review(registry, build_id)
    if review is None or result.status != "needs-review":
        raise Refusal(
            f"build {build_id}: its latest gate result is {result.status!r}; only a build that "
            "needs review can be approved or rejected"
        )
    if review.decision is not None:
        d = review.decision
        raise Refusal(f"build {build_id} was already {d.decision} by {d.reviewer} at {d.at}; decisions are final")
    if review.gate_result_digest != digest:
        raise Refusal(
            f"the open review is for gate result {review.gate_result_digest}, the latest is {digest}; "
            f"re-run `avatar-release gate {build_id}`"
        )
    return review, digest


def _require_every_pair(review: ReviewRecord, signed: dict[int, ReviewAnswer], policy: TrustPolicy) -> None:
    n = len(review.frames)
    missing = [k for k in range(n) if k not in signed]
    if not missing:
        return
    unsigned = unsigned_in_record(review, signed)
    listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    raise Refusal(
        f"build {review.build_id}: {len(missing)} of {n} blind pairs unanswered (no answer signed by a reviewer "
        f"the trust policy {policy.path} names: pairs {listed})"
        + (f"; {unsigned} answer(s) in the review record carry no valid signature and do not count" if unsigned else "")
        + f". Answer them first (avatar-release review {review.build_id} --serve), then approve"
    )
