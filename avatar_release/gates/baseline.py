"""The baseline a candidate is compared with: named by ``--baseline``, its newest verdict that the
trust policy accepts, rendered on this machine's environment and on the candidate's gate set
(step 1 of a gate, ``steps.check_inputs``); and a build's status as promotion sees it."""

from __future__ import annotations

from ..errors import EnvironmentMismatch, InputError, Refusal
from ..machine import Machine, diff_machines
from ..records import BaselineRef, EnvironmentRecord, GateResult, GateSetRecord, Manifest
from ..registry import CHANNELS, Registry, Resolved, read_manifest
from ..trust.policy import load_policy
from .requests_of import gate_set_hint
from .store import latest_result, load_review
from .verdicts import signed_verdicts, verdict_status

__all__ = ["effective_status", "resolve_baseline"]


def effective_status(registry: Registry, build_id: str) -> tuple[str, GateResult | None, str | None]:
    """What promotion sees: 'passed', 'approved', 'rejected', 'needs-review', 'failed' or 'ungated'."""
    latest = latest_result(registry, build_id)
    if latest is None:
        return "ungated", None, None
    result, digest = latest
    review = load_review(registry, build_id)
    if review is not None and review.decision is not None and review.decision.decision == "rejected":
        return "rejected", result, digest  # a rejection is final, whatever came later
    if (
        result.status == "needs-review"
        and review is not None
        and review.decision is not None
        and review.gate_result_digest == digest
    ):
        return review.decision.decision, result, digest
    return result.status, result, digest


def resolve_baseline(
    registry: Registry, baseline: str, resolved: Resolved, env: EnvironmentRecord, gs: GateSetRecord
) -> tuple[BaselineRef | None, Manifest | None, GateResult | None]:
    """The baseline named by ``--baseline``, refused unless it passed, here, on this gate set."""
    if baseline == "none":
        return None, None, None
    if baseline in CHANNELS and registry.get_channel(baseline) is None:
        raise InputError(
            f"--baseline {baseline}: channel {baseline} is empty in {registry.uri}. Gate a first build "
            "with --baseline none, or name a gated build with --baseline BUILD"
        )
    b_resolved, b_manifest = read_manifest(registry, baseline)
    if b_resolved.digest == resolved.digest:
        raise InputError(
            f"--baseline {baseline} is {b_resolved.build_id}, the candidate itself; "
            "use --baseline none to re-gate a build on its own"
        )
    b_result, b_digest = _verified_baseline(registry, b_resolved, b_manifest)
    if b_result.environment.fingerprint != env.fingerprint:
        diff = diff_machines(
            Machine.of_environment(b_result.environment), Machine.of_environment(env), cpu_features="equal"
        )
        raise EnvironmentMismatch(
            f"baseline {b_resolved.build_id} was gated in environment {b_result.environment.fingerprint}, this "
            f"machine is {env.fingerprint} ({diff.inline('baseline', 'here')}); hashes only compare within one "
            f"environment. Re-gate the baseline here (avatar-release gate {b_resolved.build_id} --baseline none) "
            "or gate on a matching machine",
            diff.differences,
        )
    if b_result.gate_set.digest != gs.digest:
        raise Refusal(
            f"baseline {b_resolved.build_id} was gated on gate set {b_result.gate_set.name} "
            f"v{b_result.gate_set.version} ({b_result.gate_set.digest}), the candidate's is {gs.digest}; "
            + gate_set_hint(b_result.gate_set, b_resolved.build_id, gs, resolved.build_id)
        )
    return (
        BaselineRef(build_id=b_resolved.build_id, digest=b_resolved.digest, gate_result_digest=b_digest),
        b_manifest,
        b_result,
    )


def _verified_baseline(registry: Registry, b_resolved: Resolved, b_manifest: Manifest) -> tuple[GateResult, str]:
    """The baseline's newest gate result that the trust policy accepts (signed by a key trusted for the
    baseline's target, for its manifest digest, newest by the signed time), and its digest: its frame
    hashes and frames are what the candidate is compared with. Unsigned records never are."""
    policy = load_policy()
    verdicts, rejected = signed_verdicts(registry, b_resolved.build_id, b_manifest, policy)
    fix = f"avatar-release gate {b_resolved.build_id} --baseline none"
    if not verdicts:
        why = f" ({'; '.join(r.reason for r in rejected[-2:])})" if rejected else ""
        raise Refusal(
            f"baseline {b_resolved.build_id} has no gate result signed by a key the trust policy "
            f"{policy.path} accepts for target {b_manifest.target}{why}; a baseline's frames are read only "
            f"from verified evidence. Gate it first: {fix}"
        )
    newest = verdicts[-1]
    status = verdict_status(
        registry,
        b_resolved.build_id,
        newest,
        b_manifest,
        policy,
        approvals=1,
        rejected_unsigned=effective_status(registry, b_resolved.build_id)[0] == "rejected",
    )
    if status not in ("passed", "approved"):
        raise Refusal(
            f"baseline {b_resolved.build_id} did not pass its gates (its newest signed result is "
            f"{status!r}, {newest.digest}); choose a baseline that passed"
        )
    return newest.result, newest.digest
