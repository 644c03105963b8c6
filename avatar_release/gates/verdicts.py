"""Signed verdicts: the gate results of a build that a trust policy accepts, in signed order.

Everything that decides from a gate result reads it from here, never from the unsigned results
index: a baseline's frame hashes and frames (``gate``), and what promotion and rollback let
through (``promote.policy``). Verdicts are ordered by ``created_at``, a field inside the signed
predicate, so reordering the unsigned attestation index changes nothing. Each verdict says what it
was compared with (``GateResult.baseline``: a build digest, or None for ``--baseline none``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import GateResult, Manifest
from ..registry import Registry
from ..trust.evidence import Rejected, verified
from ..trust.policy import TrustPolicy, UnpinnedInput
from .review_evidence import review_outcome

__all__ = [
    "SignedVerdict",
    "signed_verdicts",
    "compared_with",
    "describe_comparison",
    "verdict_status",
    "unpinned_inputs",
]


@dataclass(frozen=True)
class SignedVerdict:
    result: GateResult  # the signed predicate, parsed
    digest: str  # digest of the predicate's canonical bytes: what reviews and promotions name
    key_ids: tuple[str, ...] = ()  # the trusted keys whose signatures verified (the gate role)

    @property
    def baseline_digest(self) -> str | None:
        return self.result.baseline.digest if self.result.baseline is not None else None


def signed_verdicts(
    registry: Registry, build_id: str, manifest: Manifest, policy: TrustPolicy
) -> tuple[list[SignedVerdict], list[Rejected]]:
    """Every gate result of ``build_id`` signed by a key ``policy`` trusts for the build's target, made
    for exactly this manifest, oldest first by its signed ``created_at``; and the rejected envelopes."""
    good, rejected = verified(
        registry,
        build_id,
        kind="gate-result",
        trusted=policy.gate_keys(manifest.target),
        subject_digest=manifest.content_digest(),
    )
    verdicts = [SignedVerdict(GateResult.model_validate(att.predicate), digest, att.key_ids) for att, digest in good]
    verdicts = [v for v in verdicts if v.result.build_id == build_id]
    verdicts.sort(key=lambda v: v.result.created_at)
    return verdicts, rejected


def compared_with(verdicts: list[SignedVerdict], baseline_digest: str | None) -> list[SignedVerdict]:
    """The verdicts from comparisons with that build (None: with nothing), in signed order."""
    return [v for v in verdicts if v.baseline_digest == baseline_digest]


def describe_comparison(v: SignedVerdict) -> str:
    b = v.result.baseline
    return "compared with nothing (--baseline none)" if b is None else f"compared with {b.build_id}"


def verdict_status(
    registry: Registry,
    build_id: str,
    verdict: SignedVerdict,
    manifest: Manifest,
    policy: TrustPolicy,
    *,
    approvals: int,
    rejected_unsigned: bool,
) -> str:
    """What a signed verdict lets through: its status, a needs-review decided by signed reviewer
    decisions, and 'rejected' whenever the build was rejected (a rejection is final; honouring an
    unsigned one can only hold a build back)."""
    if rejected_unsigned:
        return "rejected"
    if verdict.result.status == "needs-review":
        return review_outcome(
            registry, build_id, verdict.result, verdict.digest, manifest.content_digest(), policy, approvals
        ).status
    return verdict.result.status


def unpinned_inputs(result: GateResult, policy: TrustPolicy) -> list[UnpinnedInput]:
    """The project files ``result`` was decided by that the policy's ``[gate_inputs]`` does not allow:
    its target spec, and where the band judged (not skipped: tier 2, not bit-exact) the band and the
    lever list that sent it there."""
    band_gate = result.gate("similarity-band")
    return policy.gate_inputs.unpinned(
        target=result.target,
        target_spec=result.target_spec_digest,
        band=result.band_judged_by(),
        levers=result.levers_digest,
        band_judged=band_gate is not None and band_gate.status != "skipped",
    )
