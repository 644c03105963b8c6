"""The baseline a candidate is compared with: named by ``--baseline``, its newest verdict that the
trust policy accepts, rendered on this machine's environment and on the candidate's gate set
(step 1 of a gate, ``steps.check_inputs``); and a build's status as promotion sees it."""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import EnvironmentMismatch, InputError, Refusal
from ..machine import Machine, diff_machines
from ..records import BaselineRef, EnvironmentRecord, GateResult, GateSetRecord, Manifest
from ..registry import CHANNELS, Registry, Resolved, read_manifest
from ..trust.policy import load_policy
from .gateset import gate_set
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
    # said only in a refusal (it renders the baseline's gate set's inputs to compare requests)
    regate = functools.partial(_regate_command, b_resolved.build_id, b_manifest, gs, resolved.build_id)
    b_result, b_digest = _verified_baseline(registry, b_resolved, b_manifest, gs, regate)
    if b_result.environment.fingerprint != env.fingerprint:
        diff = diff_machines(
            Machine.of_environment(b_result.environment), Machine.of_environment(env), cpu_features="equal"
        )
        raise EnvironmentMismatch(
            f"baseline {b_resolved.build_id} was gated in environment {b_result.environment.fingerprint}, this "
            f"machine is {env.fingerprint} ({diff.inline('baseline', 'here')}); hashes only compare within one "
            f"environment. Re-gate the baseline here ({regate()}) or gate on a matching machine",
            diff.differences,
        )
    if b_result.gate_set.digest != gs.digest:
        raise Refusal(
            f"baseline {b_resolved.build_id} was gated on gate set {b_result.gate_set.name} "
            f"v{b_result.gate_set.version} ({b_result.gate_set.digest}), the candidate's is {gs.digest}; "
            + _gate_set_hint(b_result.gate_set, gs, regate())
        )
    return (
        BaselineRef(build_id=b_resolved.build_id, digest=b_resolved.digest, gate_result_digest=b_digest),
        b_manifest,
        b_result,
    )


def _requests(gs: GateSetRecord) -> list[tuple[int, int, int]]:
    return [(r.image_variant, r.audio_variant, r.seed) for r in gs.requests]


def _regate_command(build_id: str, manifest: Manifest, gs: GateSetRecord, candidate_id: str) -> str:
    """The command that gates the baseline on the candidate's gate set: on its own requests, or, where
    the candidate's differ (its spec's [gate] table changed), on the candidate's (``--requests-of``)."""
    same = _requests(gate_set(manifest)) == _requests(gs)
    return f"avatar-release gate {build_id} --baseline none" + ("" if same else f" --requests-of {candidate_id}")


def _gate_set_hint(base: GateSetRecord, gs: GateSetRecord, regate: str) -> str:
    """Why the baseline's verdict is on another gate set, and the command that fixes it."""
    if _requests(base) == _requests(gs):
        return f"re-gate the baseline with this version of avatar-release ({regate})"
    return (
        f"the baseline rendered requests {[r.name for r in base.requests]} (seed {base.requests[0].seed}), the "
        f"candidate renders {[r.name for r in gs.requests]} (seed {gs.requests[0].seed}): each build records "
        "the requests of its spec's [gate] table, or the pipeline's gate_requests, when it is compiled. "
        f"Re-gate the baseline on the candidate's: {regate}"
    )


def _verified_baseline(
    registry: Registry, b_resolved: Resolved, b_manifest: Manifest, gs: GateSetRecord, fix: Callable[[], str]
) -> tuple[GateResult, str]:
    """The baseline's newest gate result on the candidate's gate set (else its newest) that the trust
    policy accepts (signed by a key trusted for the baseline's target, for its manifest digest, newest
    by the signed time), and its digest: its frame hashes and frames are what the candidate is
    compared with. Unsigned records never are. A verdict on another gate set (the baseline re-gated
    on its own requests after ``--requests-of``) does not hide the one on this gate set."""
    policy = load_policy()
    verdicts, rejected = signed_verdicts(registry, b_resolved.build_id, b_manifest, policy)
    if not verdicts:
        why = f" ({'; '.join(r.reason for r in rejected[-2:])})" if rejected else ""
        raise Refusal(
            f"baseline {b_resolved.build_id} has no gate result signed by a key the trust policy "
            f"{policy.path} accepts for target {b_manifest.target}{why}; a baseline's frames are read only "
            f"from verified evidence. Gate it first: {fix()}"
        )
    newest = ([v for v in verdicts if v.result.gate_set.digest == gs.digest] or verdicts)[-1]
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
