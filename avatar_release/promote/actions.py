"""Promote and roll back: a policy decision, then one compare-and-swap of the channel pointer.

Nothing is uploaded or rewritten: a promotion moves a pointer and appends one history entry.
The channel's position is read once, the policy decides against that, and the move only
succeeds if the channel is still where it was read (otherwise ConflictError, nothing changed).
Repeating a promotion is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..errors import Refusal
from ..machine import who
from ..records import CHANNELS, HistoryEntry
from ..registry import Resolved, publish_to_dev, read_manifest
from ..trust.policy import load_policy
from ..trust.statements import (
    publish_statement, publish_timestamp, read_statement, sign, sign_timestamp, signed_digest,
)
from .policy import Decision, check_promotion, check_rollback_target

__all__ = ["MoveResult", "promote", "publish_to_dev", "rollback", "actor", "sign_channel", "refresh_timestamp"]


def actor() -> str:
    """Who is acting (environment.who): AVATAR_RELEASE_ACTOR, else user@host."""
    return who()


@dataclass
class MoveResult:
    decision: Decision
    entry: HistoryEntry | None  # None: the channel already pointed there (no-op)
    previous: str | None  # build id the channel pointed at before
    statement: object = None  # trust.statements.SignedStatement when a signing key was given

    @property
    def changed(self) -> bool:
        return self.entry is not None

    def to_json(self) -> dict:
        return {"channel": self.decision.channel, "build_id": self.decision.build_id,
                "digest": self.decision.digest, "changed": self.changed, "previous": self.previous,
                "gate_status": self.decision.gate_status, "gate_result_digest": self.decision.gate_result_digest,
                "entry": self.entry.model_dump(mode="json") if self.entry else None,
                "statement": self.statement.model_dump(mode="json") if self.statement else None}


def sign_channel(registry, channel: str, signing_key, *, valid_days: float = 30.0, who: str | None = None):
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


def refresh_timestamp(registry, channel: str, signing_key, *, valid_hours: float | None = None):
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


def _maybe_sign(registry, result: "MoveResult", signing_key, valid_days: float) -> "MoveResult":
    if signing_key is None:
        return result

    current = read_statement(registry, result.decision.channel)
    state = registry.get_channel(result.decision.channel)
    if result.changed or current is None or current.payload.sequence != state.sequence:
        result.statement = sign_channel(registry, result.decision.channel, signing_key, valid_days=valid_days)
    else:
        result.statement = current  # a repeated promotion re-uses the valid statement
    return result


def promote(registry, ref: str, channel: str, *, reason: str = "", who: str | None = None,
            signing_key=None, valid_days: float = 30.0) -> MoveResult:
    resolved, manifest = read_manifest(registry, ref)
    current = registry.get_channel(channel) if channel in CHANNELS else None
    decision = check_promotion(registry, resolved, manifest, channel)
    return _move(registry, resolved, decision, current, "promote", who, reason or f"promote to {channel}",
                 signing_key, valid_days)


def rollback(registry, channel: str, *, to: str | None = None, reason: str = "", who: str | None = None,
             signing_key=None, valid_days: float = 30.0) -> MoveResult:
    current = registry.get_channel(channel) if channel in CHANNELS else None
    if to is None:
        if current is None:
            raise Refusal(f"rollback {channel}: the channel is empty, there is nothing to roll back")
        previous = _previous_build(registry, channel, current.digest)
        if previous is None:
            raise Refusal(f"rollback {channel}: no earlier build in its history; name one with --to BUILD")
        to = previous
    resolved, manifest = read_manifest(registry, to)
    decision = check_rollback_target(registry, resolved, manifest, channel)
    return _move(registry, resolved, decision, current, "rollback", who, reason or f"rollback {channel}",
                 signing_key, valid_days)


def _move(registry, resolved, decision: Decision, current, action: str, who: str | None, reason: str,
          signing_key, valid_days: float) -> MoveResult:
    """The one compare-and-swap: against where the channel was when the policy decided."""
    entry = registry.move_channel(
        decision.channel, resolved, expected_digest=current.digest if current else None, action=action,
        who=who or actor(), reason=reason, gate_result_digest=decision.gate_result_digest,
    )
    return _maybe_sign(registry, MoveResult(decision, entry, current.build_id if current else None),
                       signing_key, valid_days)


def _previous_build(registry, channel: str, current_digest: str) -> str | None:
    """The digest the channel pointed at before the move that brought it to its current build."""
    for e in reversed(registry.history(channel)):
        if e.to_digest == current_digest and e.from_digest and e.from_digest != current_digest:
            return e.from_digest
    return None
