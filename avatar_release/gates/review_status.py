"""What ``avatar-release review BUILD`` shows: counts while the review is open, the order once decided."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import NotFoundError
from ..records import ReviewAnswer, ReviewRecord
from ..registry import Registry
from ..trust.policy import TrustPolicy, load_policy
from .review_evidence import review_subject, signed_answers, unsigned_in_record
from .store import load_review

__all__ = ["ReviewStatus", "review_status"]


@dataclass(frozen=True)
class ReviewStatus:
    """What ``avatar-release review BUILD`` shows: counts only while the review is open (no
    order, no resolved preferences); the decision, the order and each answer once decided."""

    review: ReviewRecord
    signed: dict[int, ReviewAnswer]  # verified answers, by pair
    unsigned: int  # answers the record lists that no verified signature backs

    @property
    def state(self) -> str:
        if self.review.decision is not None:
            return self.review.decision.decision
        return "answered, awaiting decision" if len(self.signed) == len(self.review.frames) else "open"

    def _by_reviewer(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.signed.values():
            assert a.reviewer is not None  # signed_answers names the reviewer the signed answer names
            out[a.reviewer] = out.get(a.reviewer, 0) + 1
        return out

    def as_json(self) -> dict[str, Any]:
        r = self.review
        doc = {
            "build_id": r.build_id,
            "state": self.state,
            "pairs": len(r.frames),
            "answered": len(self.signed),
            "answered_by": self._by_reviewer(),
            "unsigned_answers_ignored": self.unsigned,
            "frames": r.frames,
            "gate_result_digest": r.gate_result_digest,
            "order_commitment": r.order_commitment,
            "order": None,
            "decision": None,
        }
        if r.decision is None:
            return doc  # sealed: nothing that tells the sides apart
        doc["decision"] = r.decision.model_dump(mode="json")
        if r.candidate_left is not None:
            doc["order"] = {"candidate_left": r.candidate_left, "salt": r.order_salt}
            doc["answers"] = [a.model_dump(mode="json") for a in r.answers]
            doc["preferences"] = {
                k: sum(a.preferred == k for a in r.answers) for k in ("candidate", "baseline", "same")
            }
        return doc

    def text(self) -> str:
        r, n = self.review, len(self.review.frames)
        who = ", ".join(f"{k} {v}" for k, v in sorted(self._by_reviewer().items())) or "nobody yet"
        ignored = f"; {self.unsigned} unsigned answer(s) in the record ignored" if self.unsigned else ""
        if r.decision is None:
            return (
                f"{r.build_id}: review {self.state}; {len(self.signed)}/{n} pairs answered, signed ({who})"
                f"{ignored}; which side is the candidate stays sealed until the decision"
            )
        d = r.decision
        head = f"{r.build_id}: review {d.decision} by {d.reviewer} at {d.at}; {len(self.signed)}/{n} pairs answered"
        if r.candidate_left is None:
            return head + f"{ignored}; the order could not be opened when it was decided (still sealed)"
        prefs = self.as_json()["preferences"]
        lines = [
            head + f" (candidate preferred {prefs['candidate']}, baseline {prefs['baseline']}, "
            f"no difference {prefs['same']}){ignored}"
        ]
        answers = {a.pair: a for a in r.answers}
        for k, frame in enumerate(r.frames):
            side = "left" if r.candidate_left[k] else "right"
            a = answers.get(k)
            said = f"{a.choice} -> {a.preferred} ({a.reviewer})" if a else "unanswered"
            lines.append(f"  pair {k:>2} frame {frame:>4}: candidate on the {side}; {said}")
        return "\n".join(lines)


def review_status(registry: Registry, build_id: str, *, policy: TrustPolicy | None = None) -> ReviewStatus:
    """The review of ``build_id`` with its answers re-verified under ``policy`` (default: the one in force)."""
    review = load_review(registry, build_id)
    if review is None:
        raise NotFoundError(f"no review for {build_id}: only a gate that ends in needs-review opens one")
    signed = signed_answers(registry, review, policy or load_policy(), review_subject(registry, build_id))
    return ReviewStatus(review, signed, unsigned_in_record(review, signed))
