"""Promotion policy: what may enter each channel, decided from stored evidence only.

    dev      any compiled build
    staging  a build whose latest *signed* gate result from a comparison with the build in prod
             *now* passed (or whose blind review a reviewer the trust policy names approved,
             signed), for this very build's manifest digest, gated in an environment that matches
             the build's target, by a key the policy trusts for that target; with prod empty (the
             first release), its latest signed result, whatever it was compared with
    prod     only the build that is in staging now: no skipping; the same comparison with prod
             now (prod moved since the gate: re-gate); a reviewed build needs the policy's
             ``prod_approvals`` distinct reviewers; and (``[release] roles = 2``, the default) a
             signed release approval of that very gate result by an approver the policy names,
             with a key other than the one that signed the gate evidence (``promote.approvals``)
    rollback a promotion to a build the channel's *signed* history held before: the same evidence and
             (prod) release approval; the newest signed verdict of any comparison decides, but a
             signed failing verdict against the build in prod now blocks it until a newer pass
    never    a build with a signed revocation (``avatar-release revoke``), into any channel

Which build each channel holds, and what it held before, come from the signed release state only
(``promote.signed.SignedChannels``): never from the registry's plain pointers or history.

Before any key is chosen, the manifest's platform is checked against the spec of the target it
names (a relabelled build gets no key's trust), and a gate result that names its target spec's
digest must name the spec in force. Where the trust policy has ``[gate_inputs]``, the band, target
spec and lever list a verdict names must be ones it pins (``trust.policy.GateInputPins``).

A decision carries its evidence (the gate result digest, the statuses it read), so a refusal
can say exactly why, and a promotion records which gate result let it through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from ..errors import InputError, Refusal, SpecError
from ..gates import (
    SignedVerdict,
    compared_with,
    describe_comparison,
    effective_status,
    review_outcome,
    signed_verdicts,
    unpinned_inputs,
    verdict_status,
)
from ..gates.compile_gate import load_compile_gate
from ..machine import Machine, diff_machines
from ..records import ChannelState, Manifest
from ..registry import CHANNELS, Registry, Resolved
from ..specs import TargetSpec, load_target
from ..trust.policy import TrustPolicy, load_policy
from ..trust.revocation import check_not_revoked
from .approvals import check_release_roles
from .signed import SignedChannels

__all__ = ["Decision", "Admitted", "check_promotion", "check_rollback_target", "check_gate_evidence"]


@dataclass(frozen=True)
class Decision:
    channel: str
    build_id: str
    digest: str
    gate_status: str  # what effective_status said ("ungated" for dev promotions of ungated builds)
    gate_result_digest: str | None
    approvals: tuple[str, ...] = ()  # prod: the release approvals that counted ("name (digest)")
    approval_digests: tuple[str, ...] = ()  # ... and their predicates' digests (the envelopes a move names)


@dataclass(frozen=True)
class Admitted:
    """Gate evidence that lets a build through: its status and the signed verdict that decided."""

    status: str  # "passed" or "approved"
    gate_result_digest: str
    verdict: SignedVerdict


def _check_channel(channel: str) -> None:
    if channel not in CHANNELS:
        raise InputError(f"unknown channel {channel!r}: expected one of {', '.join(CHANNELS)}")


# Where a build was gated must match what it was built for on these fields (platform_version may
# differ between a topology build and the live chip; jax is not in the executable).
GATE_MACHINE_FIELDS = ("backend", "device_kind", "device_count", "jaxlib", "cpu_features")


def check_gate_evidence(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    *,
    what: str,
    channels: SignedChannels,
    channel: str = "staging",
    policy: TrustPolicy | None = None,
    against_prod: bool = True,
) -> Admitted:
    """The deciding signed verdict when the build's *signed* gate evidence lets it through.

    Only attestations whose signature verifies under a key the trust policy names for the
    build's target (gate results) or for reviewing (review decisions), made for exactly this
    build's manifest digest, count; they are ordered by their signed ``created_at``. Unsigned
    records (written before signed evidence, or by hand) are still listed by ``ls`` but never promote.

    ``against_prod`` (promotions): while prod holds another build, only verdicts from a comparison
    with that build count, the newest deciding; a comparison with nothing (``--baseline none``) or
    with a build prod has since left asks for a re-gate. Prod empty: the newest verdict decides (the
    first release). Rollbacks pass False: the newest verdict of any comparison decides, except that
    a failing verdict against the build in prod now stands until a newer one against it passes.
    """
    policy = policy or load_policy()
    fix = f"run `avatar-release gate {resolved.build_id}`"
    target = _check_target_scope(manifest, what)
    channels.check_not_revoked(resolved.build_id, what)
    check_not_revoked(registry, resolved.build_id, manifest.content_digest(), policy.revoker_keys(), what=what)
    verdicts, rejected = signed_verdicts(registry, resolved.build_id, manifest, policy)
    shown_status, shown, _ = effective_status(registry, resolved.build_id)
    if not verdicts:
        why = "; ".join(r.reason for r in rejected[-3:])
        _refuse_ungated(registry, resolved, manifest, policy, what, fix, bool(rejected) or shown is not None, why)
    prod = channels.get_channel("prod")
    other_prod = prod if prod is not None and prod.digest != resolved.digest else None
    verdict = _deciding(verdicts, other_prod, resolved, what, against_prod)
    _check_target_digest(verdict, target, what, fix)
    _check_gate_inputs(verdict, policy, what, fix)
    approvals = policy.prod_approvals if channel == "prod" else 1
    status = verdict_status(
        registry,
        resolved.build_id,
        verdict,
        manifest,
        policy,
        approvals=approvals,
        rejected_unsigned=shown_status == "rejected",
    )
    if status not in ("passed", "approved"):
        _refuse_status(registry, resolved, manifest, policy, verdict, status, approvals, other_prod, what, fix)
    _check_gated_machine(resolved, manifest, verdict, what)
    return Admitted(status, verdict.digest, verdict)


def _check_gated_machine(resolved: Resolved, manifest: Manifest, verdict: SignedVerdict, what: str) -> None:
    """The deciding verdict was gated on the machine the build targets (GATE_MACHINE_FIELDS)."""
    diff = diff_machines(
        Machine.of_build(manifest), Machine.of_environment(verdict.result.environment), fields=GATE_MACHINE_FIELDS
    )
    if diff:
        raise Refusal(
            f"{what}: {resolved.build_id} was gated in an environment that does not match its target "
            f"({diff.inline('build', 'gated on')}); output gates must run on matching hardware"
        )


def _refuse_ungated(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    policy: TrustPolicy,
    what: str,
    fix: str,
    has_evidence: bool,
    why: str,
) -> NoReturn:
    """No signed verdict counts: say whether there is foreign evidence, a compile gate only, or nothing."""
    if has_evidence:
        raise Refusal(
            f"{what}: {resolved.build_id} has gate evidence, but none signed by a key the trust policy "
            f"{policy.path} accepts for target {manifest.target} "
            f"({why or 'no attestation was stored with it'}). Unsigned or foreign evidence "
            f"never promotes; {fix} with a trusted gate key"
        )
    _refuse_compile_gate_only(registry, resolved, manifest, what, fix)
    raise Refusal(f"{what}: {resolved.build_id} has never been gated; {fix} first")


def _deciding(
    verdicts: list[SignedVerdict], other_prod: ChannelState | None, resolved: Resolved, what: str, against_prod: bool
) -> SignedVerdict:
    """The verdict that decides (see :func:`check_gate_evidence` on ``against_prod``)."""
    relevant = compared_with(verdicts, other_prod.digest) if other_prod is not None else []
    if not against_prod:
        if relevant and relevant[-1].result.status == "failed":
            return relevant[-1]  # a signed failure against prod now stands until a newer pass against it
        return verdicts[-1]
    if other_prod is None:
        return verdicts[-1]
    if not relevant:
        seen = "; ".join(sorted({describe_comparison(v) for v in verdicts}))
        raise Refusal(
            f"{what}: prod holds {other_prod.build_id} now, and no signed gate result of {resolved.build_id} "
            f"compares with it (its results: {seen}). A comparison with nothing proves determinism only "
            f"and never promotes past a prod that exists; gate it against prod: "
            f"avatar-release gate {resolved.build_id}"
        )
    return relevant[-1]


def _refuse_status(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    policy: TrustPolicy,
    verdict: SignedVerdict,
    status: str,
    approvals: int,
    other_prod: ChannelState | None,
    what: str,
    fix: str,
) -> NoReturn:
    """The deciding verdict does not let the build through: say why and what to do."""
    why = ""
    if status == "needs-review":
        outcome = review_outcome(
            registry, resolved.build_id, verdict.result, verdict.digest, manifest.content_digest(), policy, approvals
        )
        why = f" (signed review evidence that does not count: {outcome.why()})" if outcome.ignored else ""
    extra = {
        "needs-review": f"{why}; answer its blind review (avatar-release review {resolved.build_id} --serve) "
        "and approve it",
        "rejected": "; a rejected build is never promoted",
        "failed": f"; see the gate report, or {fix} again after fixing it",
    }.get(status, "")
    against = f", {describe_comparison(verdict)}" if other_prod is not None else ""
    raise Refusal(
        f"{what}: the latest signed gate result of {resolved.build_id} is {status!r} ({verdict.digest}{against}){extra}"
    )


def _check_target_digest(verdict: SignedVerdict, target: TargetSpec, what: str, fix: str) -> None:
    """A verdict that names its target spec's digest vouches for that spec only."""
    named = verdict.result.target_spec_digest
    if named is not None and named != target.digest():
        raise Refusal(
            f"{what}: the gate result {verdict.digest} was made under target spec {target.name} "
            f"{named}, but the spec in force is {target.digest()} (the target was redefined since); {fix}"
        )


def _check_gate_inputs(verdict: SignedVerdict, policy: TrustPolicy, what: str, fix: str) -> None:
    """The band, target spec and lever list that decided the verdict must be ones the trust policy's
    ``[gate_inputs]`` pins: project files can otherwise lower a verdict."""
    unpinned = unpinned_inputs(verdict.result, policy)
    if unpinned:
        raise Refusal(
            f"{what}: the gate result {verdict.digest} was decided by project files the trust policy {policy.path} "
            f"does not pin: {'; '.join(u.describe() for u in unpinned)}. Only pinned files decide a verdict that "
            f"promotes; {fix} with the pinned files in place (`avatar-release gate inputs` prints the digests of "
            "the files in force), or, if these files are to be trusted, add their digests to [gate_inputs] in "
            "the trust policy"
        )


# The backends a target spec's platform names (jax calls the CUDA backend "cuda" or "gpu").
_BACKENDS = {"cpu": ("cpu",), "tpu": ("tpu",), "gpu": ("gpu", "cuda")}


def _check_target_scope(manifest: Manifest, what: str) -> TargetSpec:
    """Keys are chosen by the manifest's target name, a label anyone can write: first check that
    the program is what that target spec declares (backend, device count, mesh, topology)."""
    try:
        tgt = load_target(manifest.target)
    except SpecError as e:
        raise Refusal(
            f"{what}: cannot check that the build is a {manifest.target} program, so no key may vouch for it ({e})"
        ) from None
    p = manifest.platform
    wrong = []
    if p.backend not in _BACKENDS.get(tgt.platform, (tgt.platform,)):
        wrong.append(f"backend {p.backend} (target {tgt.name} declares {tgt.platform})")
    if p.device_count != tgt.device_count:
        wrong.append(f"{p.device_count} devices (declared {tgt.device_count})")
    if (list(p.mesh_axes), list(p.mesh_shape)) != (list(tgt.mesh_axes), list(tgt.mesh_shape)):
        wrong.append(
            f"mesh {dict(zip(p.mesh_axes, p.mesh_shape))} (declared {dict(zip(tgt.mesh_axes, tgt.mesh_shape))})"
        )
    if tgt.topology is not None and p.topology != tgt.topology:
        wrong.append(f"topology {p.topology} (declared {tgt.topology})")
    if wrong:
        raise Refusal(
            f"{what}: the manifest says target {manifest.target}, but the program is not one: "
            f"{'; '.join(wrong)}. A relabelled build gets no key's trust; compile it for the target"
        )
    return tgt


def _refuse_compile_gate_only(registry: Registry, resolved: Resolved, manifest: Manifest, what: str, fix: str) -> None:
    compiled = load_compile_gate(registry, resolved.build_id)
    if compiled is not None:
        p = manifest.platform
        raise Refusal(
            f"{what}: {resolved.build_id} has only a compile gate ({compiled.status}), which proves what "
            f"holds without hardware; output gates need a run on {p.backend}: {p.device_kind} x "
            f"{p.device_count} first ({fix} on such a host). CPU-only evidence never promotes past dev"
        )


def check_promotion(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    channel: str,
    policy: TrustPolicy | None = None,
    *,
    channels: SignedChannels,
) -> Decision:
    _check_channel(channel)
    what = f"promote {resolved.build_id} to {channel}"
    if channel == "dev":
        status, _, digest = effective_status(registry, resolved.build_id)
        if status == "rejected":
            raise Refusal(f"{what}: the build was rejected in blind review; it never moves again")
        channels.check_not_revoked(resolved.build_id, what)
        check_not_revoked(
            registry, resolved.build_id, manifest.content_digest(), (policy or load_policy()).revoker_keys(), what=what
        )
        return Decision(channel, resolved.build_id, resolved.digest, status, digest)
    policy = policy or load_policy()
    admitted = check_gate_evidence(
        registry, resolved, manifest, what=what, channel=channel, policy=policy, channels=channels
    )
    approvals: tuple[str, ...] = ()
    counted: list = []
    if channel == "prod":
        staging = channels.get_channel("staging")
        if staging is None or staging.digest != resolved.digest:
            now = staging.build_id if staging else "empty"
            raise Refusal(
                f"{what}: only the build in staging may go to prod (staging is {now}); "
                f"promote it to staging first: avatar-release promote {resolved.build_id} --to staging"
            )
        counted = check_release_roles(registry, resolved.build_id, manifest, admitted.verdict, policy, what=what)
        approvals = tuple(a.describe() for a in counted)
    return Decision(
        channel,
        resolved.build_id,
        resolved.digest,
        admitted.status,
        admitted.gate_result_digest,
        approvals,
        tuple(a.digest for a in counted),
    )


def check_rollback_target(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    channel: str,
    policy: TrustPolicy | None = None,
    *,
    channels: SignedChannels,
) -> Decision:
    """A rollback is a promotion to a build the channel held before (its signed history says so):
    the same evidence, approvals and revocation checks, except that the build need not be in
    staging, and the newest verdict of any comparison decides unless a verdict against prod now failed."""
    _check_channel(channel)
    what = f"roll {channel} back to {resolved.build_id}"
    policy = policy or load_policy()
    subject = manifest.content_digest()
    been_there = any(m.manifest_digest == subject for m in channels.moves(channel))
    if not been_there:
        raise Refusal(
            f"{what}: {resolved.build_id} was never in {channel} (by its signed history); that is a "
            "promotion, not a rollback"
        )
    if channel == "dev":
        channels.check_not_revoked(resolved.build_id, what)
        check_not_revoked(registry, resolved.build_id, subject, policy.revoker_keys(), what=what)
        status, _, digest = effective_status(registry, resolved.build_id)
        if status == "rejected":
            raise Refusal(f"{what}: the build was rejected in blind review; it never moves again")
        return Decision(channel, resolved.build_id, resolved.digest, status, digest)
    admitted = check_gate_evidence(
        registry, resolved, manifest, what=what, channel=channel, policy=policy, against_prod=False, channels=channels
    )
    counted = []
    if channel == "prod":
        counted = check_release_roles(registry, resolved.build_id, manifest, admitted.verdict, policy, what=what)
    return Decision(
        channel,
        resolved.build_id,
        resolved.digest,
        admitted.status,
        admitted.gate_result_digest,
        tuple(a.describe() for a in counted),
        tuple(a.digest for a in counted),
    )
