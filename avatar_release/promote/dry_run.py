"""``promote --dry-run`` / ``rollback --dry-run``: the decision, its evidence and what would move.

The same policy decides as for the real move, from the same stored evidence; nothing is written:
no history entry, no channel move, no signed statement, no release approval. A refusal is the
real refusal (exit 1 with its reason). Going to prod on a machine whose own release key the trust
policy names as an approver, the plan says that the real promotion would sign the approval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import NeedsApproval, Refusal
from ..records import CHANNELS, HistoryEntry, Manifest
from ..registry import Registry, Resolved
from ..trust.policy import TrustPolicy, load_policy
from ..trust.state_read import load_state
from .actions import _local_approver_key, _no_earlier, _undone_move
from .policy import Decision, check_gate_evidence, check_promotion, check_rollback_target
from .signed import SignedChannels

__all__ = ["MovePlan", "plan_promotion", "plan_rollback"]


@dataclass(frozen=True)
class MovePlan:
    action: str  # "promote" or "rollback"
    decision: Decision
    from_build: str | None  # where the channel points now
    signs_approval: bool = False  # prod: the real promotion would sign the release approval here
    undoes: HistoryEntry | None = None  # rollback: the move that brought the channel where it is

    @property
    def changes(self) -> bool:
        return self.from_build != self.decision.build_id

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "dry_run": True,
            "action": self.action,
            "channel": d.channel,
            "from": self.from_build,
            "to": d.build_id,
            "digest": d.digest,
            "would_change": self.changes,
            "gate_status": d.gate_status,
            "gate_result_digest": d.gate_result_digest,
            "approvals": list(d.approvals),
            "would_sign_approval": self.signs_approval,
            "undoes": self.undoes.model_dump(mode="json") if self.undoes else None,
        }

    def text(self) -> str:
        d = self.decision
        verb = "would promote" if self.action == "promote" else "would roll back"
        if not self.changes:
            return f"dry run: {d.channel} already points at {d.build_id}: nothing would change"
        lines = [
            f"dry run: {verb} {d.channel} {self.from_build or '(empty)'} -> {d.build_id}",
            f"  gate {d.gate_status} ({d.gate_result_digest})",
        ]
        if d.approvals:
            lines.append(f"  release approved by {', '.join(d.approvals)}")
        if self.signs_approval:
            lines.append("  the promotion would sign the release approval with this machine's release key")
        if self.undoes is not None:
            u = self.undoes
            lines.append(
                f"  undoes #{u.sequence} ({u.action} by {u.who} at {u.when[:19]}: "
                f"{u.from_build or '(empty)'} -> {u.to_build})"
            )
        lines.append("  nothing was written")
        return "\n".join(lines)


def _channels(registry: Registry) -> tuple[SignedChannels, TrustPolicy]:
    policy = load_policy()
    return SignedChannels(registry, load_state(registry, policy)), policy


def _decided(
    decide: Callable[[], Decision],
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    channel: str,
    policy: TrustPolicy,
    channels: SignedChannels,
    *,
    what: str,
    against_prod: bool,
) -> tuple[Decision, bool]:
    """The decision; where only a release approval is missing and this machine would sign it, the
    decision the real move makes after signing (and True)."""
    try:
        return decide(), False
    except NeedsApproval:
        if _local_approver_key(policy) is None:
            raise
        admitted = check_gate_evidence(
            registry,
            resolved,
            manifest,
            what=what,
            channel=channel,
            policy=policy,
            channels=channels,
            against_prod=against_prod,
        )
        return Decision(channel, resolved.build_id, resolved.digest, admitted.status, admitted.gate_result_digest), True


def plan_promotion(registry: Registry, ref: str, channel: str) -> MovePlan:
    channels, policy = _channels(registry)
    resolved, manifest = channels.resolve(ref)
    holder = channels.state.holder(channel) if channel in CHANNELS else None
    decision, signs = _decided(
        lambda: check_promotion(registry, resolved, manifest, channel, policy, channels=channels),
        registry,
        resolved,
        manifest,
        channel,
        policy,
        channels,
        what=f"promote {resolved.build_id} to {channel}",
        against_prod=True,
    )
    return MovePlan("promote", decision, holder.build_id if holder else None, signs_approval=signs)


def plan_rollback(registry: Registry, channel: str, *, to: str | None = None) -> MovePlan:
    channels, policy = _channels(registry)
    holder = channels.state.holder(channel) if channel in CHANNELS else None
    if holder is None:
        raise Refusal(f"rollback {channel}: the channel is empty, there is nothing to roll back")
    history = channels.moves(channel)
    undone = _undone_move(history, holder.manifest_digest)
    if to is None:
        if undone is None or undone.from_build is None:
            raise _no_earlier(history, holder.manifest_digest, channel)
        to = undone.from_build
    else:
        undone = None  # --to names the target: no one move is undone
    resolved, manifest = channels.resolve(to)
    decision, signs = _decided(
        lambda: check_rollback_target(registry, resolved, manifest, channel, policy, channels=channels),
        registry,
        resolved,
        manifest,
        channel,
        policy,
        channels,
        what=f"roll {channel} back to {resolved.build_id}",
        against_prod=False,
    )
    undoes = None
    if undone is not None:
        undoes = next(e for e in channels.history(channel) if e.sequence == undone.version)
    return MovePlan("rollback", decision, holder.build_id, signs_approval=signs, undoes=undoes)
