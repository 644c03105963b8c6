"""Promote and roll back: a policy decision, then one compare-and-swap of the channel pointer.

Nothing is uploaded or rewritten: a promotion moves a pointer and appends one history entry.
The channel's position is read once, the policy decides against that, and the move only
succeeds if the channel is still where it was read (otherwise ConflictError, nothing changed).
Repeating a promotion is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..errors import NeedsApproval, Refusal
from ..machine import who
from ..records import CHANNELS, ChannelState, HistoryEntry, SignedStatement
from ..registry import Registry, Resolved, publish_to_dev, read_manifest
from ..trust import key_id
from ..trust.policy import TrustPolicy, load_policy, local_identity
from ..trust.revocation import Revocation, revoke
from ..trust.statements import (
    PromotionStatement, SignedTimestamp, publish_statement, publish_timestamp, read_statement, sign, sign_timestamp,
    signed_digest,
)
from .approvals import Approval, sign_approval
from .policy import Decision, check_gate_evidence, check_promotion, check_rollback_target

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["MoveResult", "promote", "publish_to_dev", "rollback", "actor", "sign_channel", "refresh_timestamp",
           "approve", "revoke_build"]


def actor() -> str:
    """Who is acting (environment.who): AVATAR_RELEASE_ACTOR, else user@host."""
    return who()


@dataclass
class MoveResult:
    decision: Decision
    entry: HistoryEntry | None  # None: the channel already pointed there (no-op)
    previous: str | None  # build id the channel pointed at before
    # the channel's signed statement when a signing key was given (a version-1 one only when a repeated
    # promotion re-uses one signed before 2026-12-01)
    statement: PromotionStatement | SignedStatement | None = None
    approved_here: Approval | None = None  # prod: the approval this machine's release key signed for it

    @property
    def changed(self) -> bool:
        return self.entry is not None

    def to_json(self) -> dict[str, Any]:
        return {"channel": self.decision.channel, "build_id": self.decision.build_id,
                "digest": self.decision.digest, "changed": self.changed, "previous": self.previous,
                "gate_status": self.decision.gate_status, "gate_result_digest": self.decision.gate_result_digest,
                "approvals": list(self.decision.approvals),
                "approved_here": self.approved_here.to_json() if self.approved_here else None,
                "entry": self.entry.model_dump(mode="json") if self.entry else None,
                "statement": self.statement.model_dump(mode="json") if self.statement else None}


def sign_channel(registry: Registry, channel: str, signing_key: Ed25519PrivateKey, *, valid_days: float = 30.0,
                 who: str | None = None) -> PromotionStatement:
    """Sign and publish the statement for where ``channel`` points now (its state's sequence).

    The statement binds the build's manifest content digest, not this store's digest for it, so
    it stays valid wherever the build is copied (an OCI registry's digests differ from a
    directory store's)."""
    state = registry.get_channel(channel)
    if state is None:
        raise Refusal(f"sign {channel}: the channel is empty")
    st = sign(signing_key, build_id=state.build_id, build_digest=signed_digest(registry, state.digest), channel=channel,
              sequence=state.sequence, who=who or actor(), validity=timedelta(days=valid_days))
    publish_statement(registry, st)
    refresh_timestamp(registry, channel, signing_key)
    return st


def refresh_timestamp(registry: Registry, channel: str, signing_key: Ed25519PrivateKey, *,
                      valid_hours: float | None = None) -> SignedTimestamp:
    """Re-sign the short-lived timestamp of ``channel``'s newest signed move (run on a schedule)."""
    st = read_statement(registry, channel)
    state = registry.get_channel(channel)
    if st is None or state is None:
        raise Refusal(f"refresh {channel}: no signed statement to vouch for; promote with --sign-key first")
    p = st.payload
    # a version-1 statement may bind this store's digest; a version-2 one binds the content digest
    if p.sequence != state.sequence or p.build_digest not in (state.digest, signed_digest(registry, state.digest)):
        raise Refusal(f"refresh {channel}: the channel points at {state.build_id} (#{state.sequence}) but the signed "
                      f"statement names {p.build_id} (#{p.sequence}); sign the channel first (keys sign {channel})")
    # The promoter's trust policy says how long a timestamp vouches (default an hour).
    validity = timedelta(hours=valid_hours if valid_hours else load_policy().timestamp_hours)
    ts = sign_timestamp(signing_key, channel=channel, sequence=p.sequence, build_id=p.build_id,
                        build_digest=p.build_digest, validity=validity)
    publish_timestamp(registry, ts)
    return ts


def _maybe_sign(registry: Registry, result: MoveResult, signing_key: Ed25519PrivateKey | None,
                valid_days: float) -> MoveResult:
    if signing_key is None:
        return result

    current = read_statement(registry, result.decision.channel)
    state = registry.get_channel(result.decision.channel)
    if result.changed or current is None or state is None or current.payload.sequence != state.sequence:
        result.statement = sign_channel(registry, result.decision.channel, signing_key, valid_days=valid_days)
    else:
        result.statement = current  # a repeated promotion re-uses the valid statement
    return result


def promote(registry: Registry, ref: str, channel: str, *, reason: str = "", who: str | None = None,
            signing_key: Ed25519PrivateKey | None = None, valid_days: float = 30.0) -> MoveResult:
    """Move ``channel`` to ``ref`` if the policy allows it. Going to prod without a release
    approval that counts, this machine's own release key signs one when the trust policy names it
    an approver (the first-use identity on one laptop holds both roles); otherwise NeedsApproval."""
    resolved, manifest = read_manifest(registry, ref)
    current = registry.get_channel(channel) if channel in CHANNELS else None
    policy = load_policy()
    approved_here = None
    try:
        decision = check_promotion(registry, resolved, manifest, channel, policy)
    except NeedsApproval:
        key = _local_approver_key(policy)
        if key is None:
            raise
        admitted = check_gate_evidence(registry, resolved, manifest, what=f"approve {resolved.build_id}",
                                       channel="prod", policy=policy)
        approved_here = sign_approval(registry, resolved.build_id, manifest, admitted.verdict, policy, key,
                                      note="signed by promote with this machine's release key")
        decision = check_promotion(registry, resolved, manifest, channel, policy)
    result = _move(registry, resolved, decision, current, "promote", who, reason or f"promote to {channel}",
                   signing_key, valid_days)
    result.approved_here = approved_here
    return result


def _local_approver_key(policy: TrustPolicy) -> Ed25519PrivateKey | None:
    """This machine's release key when the policy names it an approver (else None)."""
    path = local_identity().release_key_path
    if not path.is_file():
        return None
    key = local_identity().release_key()
    return key if key_id(key.public_key()) in policy.approver_keys() else None


def approve(registry: Registry, ref: str, *, private_key: Ed25519PrivateKey | None = None, approver: str | None = None,
            note: str = "") -> Approval:
    """Sign a release approval of the gate result that lets ``ref`` into prod now (with this
    machine's release key unless ``private_key`` is given)."""
    resolved, manifest = read_manifest(registry, ref)
    policy = load_policy()
    admitted = check_gate_evidence(registry, resolved, manifest, what=f"approve {resolved.build_id} for prod",
                                   channel="prod", policy=policy)
    key = private_key or local_identity().release_key()
    return sign_approval(registry, resolved.build_id, manifest, admitted.verdict, policy, key, approver=approver,
                         note=note)


def revoke_build(registry: Registry, ref: str, *, reason: str, private_key: Ed25519PrivateKey | None = None
                 ) -> Revocation:
    """Sign a revocation of ``ref`` (with this machine's release key unless ``private_key`` is given).
    The key must be one the trust policy names, or promotion would not count it: refused before
    anything is stored."""
    resolved, manifest = read_manifest(registry, ref)
    policy = load_policy()
    key = private_key or local_identity().release_key()
    kid = key_id(key.public_key())
    if kid not in policy.revoker_keys():
        raise Refusal(f"revoke {resolved.build_id}: key {kid} is not named by the trust policy {policy.path}, so "
                      "promotion would not count its revocation; sign with a key the policy names (--key)")
    return revoke(registry, resolved.build_id, manifest.content_digest(), key, reason=reason, by=actor())


def rollback(registry: Registry, channel: str, *, to: str | None = None, reason: str = "", who: str | None = None,
             signing_key: Ed25519PrivateKey | None = None, valid_days: float = 30.0) -> MoveResult:
    current = registry.get_channel(channel) if channel in CHANNELS else None
    if to is None:
        if current is None:
            raise Refusal(f"rollback {channel}: the channel is empty, there is nothing to roll back")
        undone = _undone_move(registry, channel, current.digest)
        if undone is None or undone.from_digest is None:
            raise _no_earlier(registry, channel, current.digest)
        to = undone.from_digest
    resolved, manifest = read_manifest(registry, to)
    decision = check_rollback_target(registry, resolved, manifest, channel)
    return _move(registry, resolved, decision, current, "rollback", who, reason or f"rollback {channel}",
                 signing_key, valid_days)


def _move(registry: Registry, resolved: Resolved, decision: Decision, current: ChannelState | None,
          action: Literal["promote", "rollback"], who: str | None, reason: str,
          signing_key: Ed25519PrivateKey | None, valid_days: float) -> MoveResult:
    """The one compare-and-swap: against where the channel was when the policy decided."""
    entry = registry.move_channel(
        decision.channel, resolved, expected_digest=current.digest if current else None, action=action,
        who=who or actor(), reason=reason, gate_result_digest=decision.gate_result_digest,
    )
    return _maybe_sign(registry, MoveResult(decision, entry, current.build_id if current else None),
                       signing_key, valid_days)


def _undone_move(registry: Registry, channel: str, current_digest: str) -> HistoryEntry | None:
    """The move a plain ``rollback`` undoes: the newest promote (or publish) that brought the channel
    to its current build from another one that was never itself rolled back from. A rollback is
    never undone by the next rollback (that would re-deploy the build just rolled back: name it
    with ``--to`` for that); a second rollback goes one step further back instead."""
    history = registry.history(channel)
    rolled_back = {e.from_digest for e in history if e.action == "rollback" and e.from_digest}
    for e in reversed(history):
        if e.to_digest == current_digest and e.action != "rollback" and e.from_digest \
                and e.from_digest != current_digest and e.from_digest not in rolled_back:
            return e
    return None


def _no_earlier(registry: Registry, channel: str, current_digest: str) -> Refusal:
    """Why a plain rollback has nowhere to go, naming the builds only ``--to`` may bring back."""
    gone = [e.from_build for e in registry.history(channel) if e.action == "rollback" and e.from_build
            and e.from_digest != current_digest]
    hint = (f"; rolled back from before: {', '.join(dict.fromkeys(gone))} (bring one back with --to BUILD)"
            if gone else "")
    return Refusal(f"rollback {channel}: no earlier build in its history to go back to{hint}; name one with "
                   "--to BUILD")
