"""What counts in a blind review: the rules the review commands and the promotion policy share.

Written once so that what ``review --approve`` checks before it signs is exactly what promotion
re-checks from the signed evidence alone (the CLI's checks are a courtesy; these decide):

  answer     signed by a reviewer the trust policy names, with that reviewer's own key, about
             this gate result and this review's order commitment, for a pair of this review and
             its frame; the first per pair counts (answers are final).
  approval   a signed ``approved`` decision by a named reviewer (the signer owns the name) about
             this gate result, naming the review's order commitment, for a review whose pairs are
             the frames the *signed* gate result put below the band, listing a counted answer on
             every pair. A review record with pairs dropped, or a decision with no answers, counts
             for nothing.
  rejection  a signed ``rejected`` decision by a named reviewer about this gate result (no
             answers needed: a rejection can only hold a build back).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..errors import IntegrityError
from ..records import GateResult, ReviewAnswer, ReviewRecord
from ..records.gate import SimilarityBandDetails
from ..registry import Registry, read_manifest
from ..trust.attest import Attestation
from ..trust.evidence import verified
from ..trust.policy import TrustPolicy
from .store import load_review

__all__ = [
    "MAX_PAIRS",
    "CHOICES",
    "pairs_for",
    "review_subject",
    "owns_name",
    "signer_gap",
    "ANOTHER_RESULT",
    "signed_answers",
    "unsigned_in_record",
    "ReviewOutcome",
    "review_outcome",
]

MAX_PAIRS = 24
CHOICES = ("left", "right", "same")


def pairs_for(below: list[int]) -> list[int]:
    """The frames a review shows for these frames below the band: all, or ``MAX_PAIRS`` evenly spread."""
    below = list(below)
    if len(below) > MAX_PAIRS:
        idx = np.linspace(0, len(below) - 1, num=MAX_PAIRS).round().astype(int)
        below = [below[i] for i in sorted(set(idx.tolist()))]
    return below


def review_subject(registry: Registry, build_id: str) -> str:
    """The build's store-independent manifest digest: what review evidence is signed about."""
    return read_manifest(registry, build_id)[1].content_digest()


def owns_name(policy: TrustPolicy, reviewer: object, key_ids: Iterable[str]) -> bool:
    """Whether the policy gives ``reviewer`` to one of these keys (:meth:`TrustPolicy.owns_name`)."""
    return policy.owns_name(reviewer, key_ids)


ANOTHER_RESULT = "it is about another gate result"


def signer_gap(att: Attestation, policy: TrustPolicy, gate_result_digest: str) -> str | None:
    """Why a verified review attestation does not speak for this gate result (None: it does).

    The one signer check of answers and decisions: it is about ``gate_result_digest`` (else
    ``ANOTHER_RESULT``), and the reviewer it names owns a key that signed it."""
    p = att.predicate
    if p.get("gate_result_digest") != gate_result_digest:
        return ANOTHER_RESULT
    if not owns_name(policy, p.get("reviewer"), att.key_ids):
        return f"names reviewer {p.get('reviewer')!r}, whose key did not sign it"
    return None


def signed_answers(
    registry: Registry, review: ReviewRecord, policy: TrustPolicy, subject: str
) -> dict[int, ReviewAnswer]:
    """{pair: answer} from answer attestations that count (see the module's rules)."""
    good, _ = verified(
        registry, review.build_id, kind="review-answer", trusted=policy.reviewer_keys(), subject_digest=subject
    )
    out: dict[int, ReviewAnswer] = {}
    for att, digest in good:
        p = att.predicate
        pair = p.get("pair")
        if (
            signer_gap(att, policy, review.gate_result_digest) is not None
            or p.get("order_commitment") != review.order_commitment
            or not isinstance(pair, int)
            or isinstance(pair, bool)
            or not 0 <= pair < len(review.frames)
            or p.get("frame") != review.frames[pair]
            or p.get("choice") not in CHOICES
            or pair in out
        ):
            continue  # another review, a name the key does not belong to, or a pair already answered
        out[pair] = ReviewAnswer(
            pair=pair, choice=p["choice"], at=str(p.get("at", "")), reviewer=p["reviewer"], evidence=digest
        )
    return out


def unsigned_in_record(review: ReviewRecord, signed: dict[int, ReviewAnswer]) -> int:
    """Answers the record lists that no verified attestation backs (written by hand, or v1)."""
    return sum(1 for a in review.answers if a.pair not in signed or signed[a.pair].evidence != a.evidence)


@dataclass(frozen=True)
class ReviewOutcome:
    status: str  # "approved", "rejected" or "needs-review"
    approvers: tuple[str, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)  # why signed decisions did not count

    def why(self) -> str:
        return "; ".join(self.ignored[-3:])


def _below(result: GateResult) -> list[int] | None:
    try:
        band = result.evidence(SimilarityBandDetails)
    except IntegrityError:
        return None  # malformed band evidence puts no frame below the band
    return list(band.frames_below) if band is not None and band.frames_below is not None else None


def review_outcome(
    registry: Registry,
    build_id: str,
    result: GateResult,
    gate_result_digest: str,
    subject_digest: str,
    policy: TrustPolicy,
    approvals: int,
) -> ReviewOutcome:
    """What the signed review evidence about this gate result says, re-verified from scratch."""
    decisions, _ = verified(
        registry, build_id, kind="review-decision", trusted=policy.reviewer_keys(), subject_digest=subject_digest
    )
    review = load_review(registry, build_id)
    approvers: set[str] = set()
    ignored: list[str] = []
    for att, _ in decisions:
        p = att.predicate
        gap = signer_gap(att, policy, gate_result_digest)
        if gap == ANOTHER_RESULT:
            continue  # about another gate result of this build
        if gap is not None:
            ignored.append(f"a decision {gap}")
            continue
        if p.get("decision") == "rejected":
            return ReviewOutcome("rejected", (str(p["reviewer"]),))
        if p.get("decision") != "approved":
            continue
        why = _approval_gap(registry, review, p, result, gate_result_digest, subject_digest, policy)
        if why:
            ignored.append(f"approval by {p['reviewer']}: {why}")
        else:
            approvers.add(p["reviewer"])
    status = "approved" if len(approvers) >= approvals else "needs-review"
    if status == "needs-review" and approvers:
        ignored.append(f"{len(approvers)} of the {approvals} distinct approvals the trust policy asks for")
    return ReviewOutcome(status, tuple(sorted(approvers)), tuple(ignored))


def _approval_gap(
    registry: Registry,
    review: ReviewRecord | None,
    decision: dict,
    result: GateResult,
    gate_result_digest: str,
    subject: str,
    policy: TrustPolicy,
) -> str | None:
    """Why a signed approval does not count (None: it does)."""
    if review is None or review.gate_result_digest != gate_result_digest:
        return "no review record for this gate result"
    if decision.get("order_commitment") != review.order_commitment:
        return "it names another review (order commitment differs)"
    below = _below(result)
    if below is None or review.frames != pairs_for(below):
        return "the review's pairs are not the frames the signed gate result put below the band"
    answers = signed_answers(registry, review, policy, subject)
    missing = [k for k in range(len(review.frames)) if k not in answers]
    if missing:
        return f"{len(missing)} of {len(review.frames)} pairs carry no signed answer by a named reviewer"
    listed = set(decision.get("answers") or [])
    unlisted = [k for k, a in answers.items() if a.evidence not in listed]
    if unlisted:
        return f"it does not list the signed answers of pairs {unlisted[:8]}"
    return None
