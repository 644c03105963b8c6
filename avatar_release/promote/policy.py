"""Promotion policy: what may enter each channel, decided from stored evidence only.

    dev      any compiled build
    staging  a build whose latest gate result passed (or whose blind review approved it), for
             this very build digest, gated in an environment that matches the build's target
    prod     only the build that is in staging now: no skipping
    rollback to a build that passed its gates and was in that channel before

A decision carries its evidence (the gate result digest, the statuses it read), so a refusal
can say exactly why, and a promotion records which gate result let it through.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError, Refusal
from ..machine import Machine, diff_machines
from ..records import Manifest
from ..registry import CHANNELS, Resolved

__all__ = ["Decision", "check_promotion", "check_rollback_target", "check_gate_evidence"]


@dataclass(frozen=True)
class Decision:
    channel: str
    build_id: str
    digest: str
    gate_status: str  # what effective_status said ("ungated" for dev promotions of ungated builds)
    gate_result_digest: str | None


def _check_channel(channel: str) -> None:
    if channel not in CHANNELS:
        raise InputError(f"unknown channel {channel!r}: expected one of {', '.join(CHANNELS)}")


# Where a build was gated must match what it was built for on these fields (platform_version may
# differ between a topology build and the live chip; jax is not in the executable).
GATE_MACHINE_FIELDS = ("backend", "device_kind", "device_count", "jaxlib", "cpu_features")


def check_gate_evidence(registry, resolved: Resolved, manifest: Manifest, *, what: str) -> tuple[str, str]:
    """(status, gate result digest) when the build's gates let it through; Refusal otherwise."""
    from ..gates import effective_status

    status, result, digest = effective_status(registry, resolved.build_id)
    fix = f"run `avatar-release gate {resolved.build_id}`"
    if result is None:
        from ..gates.compile_gate import load_compile_gate

        compiled = load_compile_gate(registry, resolved.build_id)
        if compiled is not None:
            p = manifest.platform
            raise Refusal(f"{what}: {resolved.build_id} has only a compile gate ({compiled.status}), which proves what "
                          f"holds without hardware; output gates need a run on {p.backend}: {p.device_kind} x "
                          f"{p.device_count} first ({fix} on such a host). CPU-only evidence never promotes past dev")
        raise Refusal(f"{what}: {resolved.build_id} has never been gated; {fix} first")
    if status not in ("passed", "approved"):
        extra = {"needs-review": f"; answer its blind review (avatar-release review {resolved.build_id} --serve) "
                                 "and approve it",
                 "rejected": "; a rejected build is never promoted",
                 "failed": f"; see the gate report, or {fix} again after fixing it"}.get(status, "")
        raise Refusal(f"{what}: the latest gate result of {resolved.build_id} is {status!r} ({digest}){extra}")
    if result.build_digest != resolved.digest:
        raise Refusal(f"{what}: gate result {digest} is for build digest {result.build_digest}, "
                      f"not {resolved.digest}; {fix}")
    diff = diff_machines(Machine.of_build(manifest), Machine.of_environment(result.environment),
                         fields=GATE_MACHINE_FIELDS)
    if diff:
        raise Refusal(f"{what}: {resolved.build_id} was gated in an environment that does not match its target "
                      f"({diff.inline('build', 'gated on')}); output gates must run on matching hardware")
    return status, digest


def check_promotion(registry, resolved: Resolved, manifest: Manifest, channel: str) -> Decision:
    _check_channel(channel)
    what = f"promote {resolved.build_id} to {channel}"
    if channel == "dev":
        from ..gates import effective_status

        status, _, digest = effective_status(registry, resolved.build_id)
        if status == "rejected":
            raise Refusal(f"{what}: the build was rejected in blind review; it never moves again")
        return Decision(channel, resolved.build_id, resolved.digest, status, digest)
    status, digest = check_gate_evidence(registry, resolved, manifest, what=what)
    if channel == "prod":
        staging = registry.get_channel("staging")
        if staging is None or staging.digest != resolved.digest:
            now = staging.build_id if staging else "empty"
            raise Refusal(f"{what}: only the build in staging may go to prod (staging is {now}); "
                          f"promote it to staging first: avatar-release promote {resolved.build_id} --to staging")
    return Decision(channel, resolved.build_id, resolved.digest, status, digest)


def check_rollback_target(registry, resolved: Resolved, manifest: Manifest, channel: str) -> Decision:
    _check_channel(channel)
    what = f"roll {channel} back to {resolved.build_id}"
    been_there = any(e.to_digest == resolved.digest for e in registry.history(channel))
    if not been_there:
        raise Refusal(f"{what}: {resolved.build_id} was never in {channel}; that is a promotion, not a rollback")
    status, digest = check_gate_evidence(registry, resolved, manifest, what=what)
    return Decision(channel, resolved.build_id, resolved.digest, status, digest)
