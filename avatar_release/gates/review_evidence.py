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

from dataclasses import dataclass, field

import numpy as np

from ..records import GateResult, ReviewAnswer, ReviewRecord
from ..trust.evidence import verified
from ..trust.policy import TrustPolicy
from .store import load_review

__all__ = ["MAX_PAIRS", "CHOICES", "pairs_for", "signed_answers", "ReviewOutcome", "review_outcome"]

MAX_PAIRS = 24
CHOICES = ("left", "right", "same")


def pairs_for(below: list[int]) -> list[int]:
    """The frames a review shows for these frames below the band: all, or ``MAX_PAIRS`` evenly spread."""
    below = list(below)
    if len(below) > MAX_PAIRS:
        idx = np.linspace(0, len(below) - 1, num=MAX_PAIRS).round().astype(int)
        below = [below[i] for i in sorted(set(idx.tolist()))]
    return below


def signed_answers(registry, review: ReviewRecord, policy: TrustPolicy, subject: str) -> dict[int, ReviewAnswer]:
    """{pair: answer} from answer attestations that count (see the module's rules)."""
    good, _ = verified(registry, review.build_id, kind="review-answer", trusted=policy.reviewer_keys(),
                       subject_digest=subject)
    out: dict[int, ReviewAnswer] = {}
    for att, digest in good:
        p = att.predicate
        pair = p.get("pair")
        if (p.get("gate_result_digest") != review.gate_result_digest
                or p.get("order_commitment") != review.order_commitment
                or p.get("reviewer") not in {policy.name_of(k) for k in att.key_ids}
                or not isinstance(pair, int) or isinstance(pair, bool) or not 0 <= pair < len(review.frames)
                or p.get("frame") != review.frames[pair] or p.get("choice") not in CHOICES or pair in out):
            continue  # another review, a name the key does not belong to, or a pair already answered
        out[pair] = ReviewAnswer(pair=pair, choice=p["choice"], at=str(p.get("at", "")), reviewer=p["reviewer"],
                                 evidence=digest)
    return out


@dataclass(frozen=True)
class ReviewOutcome:
    status: str  # "approved", "rejected" or "needs-review"
    approvers: tuple[str, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)  # why signed decisions did not count

    def why(self) -> str:
        return "; ".join(self.ignored[-3:])


def _below(result: GateResult) -> list[int] | None:
    band = result.gate("similarity-band")
    below = band.details.get("frames_below") if band is not None else None
    return list(below) if isinstance(below, list) else None


def review_outcome(registry, build_id: str, result: GateResult, gate_result_digest: str, subject_digest: str,
                   policy: TrustPolicy, approvals: int) -> ReviewOutcome:
    """What the signed review evidence about this gate result says, re-verified from scratch."""
    decisions, _ = verified(registry, build_id, kind="review-decision", trusted=policy.reviewer_keys(),
                            subject_digest=subject_digest)
    review = load_review(registry, build_id)
    approvers: set[str] = set()
    ignored: list[str] = []
    for att, _ in decisions:
        p = att.predicate
        if p.get("gate_result_digest") != gate_result_digest:
            continue  # about another gate result of this build
        if p.get("reviewer") not in {policy.name_of(k) for k in att.key_ids}:
            ignored.append(f"a decision names reviewer {p.get('reviewer')!r}, whose key did not sign it")
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


def _approval_gap(registry, review: ReviewRecord | None, decision: dict, result: GateResult, gate_result_digest: str,
                  subject: str, policy: TrustPolicy) -> str | None:
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
