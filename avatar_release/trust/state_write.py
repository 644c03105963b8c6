"""Writing the signed release state: initialise a registry, sign an existing one's state, record a
channel move or a revocation, refresh the timestamp, rotate keys.

Every change is one commit in TUF's order: the changed roles' new files (new versions, never
overwritten), a new snapshot naming them, then ``timestamp.json`` swapped only if it still has
the version this command read (a concurrent promoter is a ConflictError and the change is not
visible), then a versioned copy of that timestamp (so a later ``timestamp.json`` rolled back to an
older one is seen). Files left by a command that died before its swap are never named by any
timestamp; the next command numbers its files past them.

What the policy decided is not re-checked here: ``promote`` decides, this signs.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, InputError, Refusal, TrustError
from ..records import MOVE_MEDIA_TYPE, BlobRef, MoveRecord, utcnow
from ..registry import Registry
from .policy import TrustPolicy
from .state_files import (
    PROD_ROLES_FIELD,
    list_versions,
    put_new,
    swap_timestamp,
    to_bytes,
    tuf_key,
    tuf_signer,
    versioned_name,
)
from .state_read import Holder, ReleaseState, load_state, state_exists
from .state_roles import CHANNEL_ROLES, LISTED_ROLES, RoleKeys, StateRoles, held_keys, signers_for, state_roles

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from tuf.api.metadata import Metadata

__all__ = [
    "init_state",
    "upgrade_state",
    "record_move",
    "record_revocation",
    "record_evidence",
    "refresh_state",
    "rotate_state",
    "LONG_LIVED",
    "HistoryItem",
]

LONG_LIVED = timedelta(days=365)  # root, targets, channel roles, snapshot (each re-signed when it changes)
_RENEW_SNAPSHOT = timedelta(days=30)  # refresh re-signs a snapshot this close to its expiry


def _expires(delta: timedelta) -> datetime:
    return (datetime.now(UTC) + delta).replace(microsecond=0)


def _sign(signed: Any, keys: Iterable[Ed25519PrivateKey]) -> Metadata:
    from tuf.api.metadata import Metadata

    md = Metadata(signed)
    for key in keys:
        md.sign(tuf_signer(key), append=True)
    return md


def _root(roles: StateRoles, version: int, registry_nonce: str) -> Any:
    from tuf.api.metadata import Root

    root = Root(
        version=version,
        expires=_expires(LONG_LIVED),
        consistent_snapshot=True,
        unrecognized_fields={"x-avatar-release": {"registry": registry_nonce}},
    )
    for top, rk in (
        ("root", roles.root),
        ("targets", roles.root),
        ("snapshot", roles.online),
        ("timestamp", roles.online),
    ):
        for pub in rk.keys.values():
            root.add_key(tuf_key(pub), top)
        root.roles[top].threshold = rk.threshold
    return root


def _targets(roles: StateRoles, version: int) -> Any:
    from tuf.api.metadata import DelegatedRole, Delegations, Key, Targets

    keys: dict[str, Key] = {}
    delegated = {}
    for rk in roles.delegated():
        tks = [tuf_key(pub) for pub in rk.keys.values()]
        keys.update({k.keyid: k for k in tks})
        delegated[rk.role] = DelegatedRole(rk.role, [k.keyid for k in tks], rk.threshold, True, [f"{rk.role}/*"])
    return Targets(
        version=version,
        expires=_expires(LONG_LIVED),
        delegations=Delegations(keys, delegated),
        unrecognized_fields={PROD_ROLES_FIELD: list(roles.prod_requires)},
    )


def _empty(version: int) -> Any:
    from tuf.api.metadata import Targets

    return Targets(version=version, expires=_expires(LONG_LIVED))


class _Commit:
    """One change of the state: new role files, a snapshot naming them, the timestamp swapped."""

    def __init__(
        self,
        registry: Registry,
        roles: StateRoles,
        held: dict[str, Ed25519PrivateKey],
        what: str,
        base: ReleaseState | None,
    ):
        self.registry, self.roles, self.held, self.what, self.base = registry, roles, held, what, base
        self.newest = list_versions(registry)
        self.files: dict[str, tuple[int, bytes]] = {}  # role -> (version, bytes) written by this commit

    def next_version(self, role: str, current: int) -> int:
        return max(current, self.newest.get(role, 0)) + 1

    def sign(self, role: str, signed: Any, rk: RoleKeys) -> Metadata:
        return _sign(signed, signers_for(rk, self.held, what=self.what))

    def put(self, role: str, md: Metadata) -> None:
        data = to_bytes(md)
        put_new(self.registry, versioned_name(role, md.signed.version), data)
        self.files[role] = (md.signed.version, data)

    def finish(self, *, timestamp_minutes: float) -> None:
        from tuf.api.metadata import MetaFile, Snapshot

        meta = dict(self.base.snapshot.signed.meta) if self.base else {}
        for role, (version, data) in self.files.items():
            if role != "root":  # version, length and hash: a same-numbered file from elsewhere is refused
                meta[f"{role}.json"] = MetaFile(
                    version=version, length=len(data), hashes={"sha256": hashlib.sha256(data).hexdigest()}
                )
        base_snap = self.base.snapshot.signed.version if self.base else 0
        snap = Snapshot(version=self.next_version("snapshot", base_snap), expires=_expires(LONG_LIVED), meta=meta)
        self.put("snapshot", self.sign("snapshot", snap, self.roles.online))
        self._timestamp(timestamp_minutes)

    def _timestamp(self, minutes: float) -> None:
        from tuf.api.metadata import MetaFile, Timestamp

        if "snapshot" in self.files:
            version, data = self.files["snapshot"]
            snap_meta = MetaFile(version=version, length=len(data), hashes={"sha256": hashlib.sha256(data).hexdigest()})
        else:
            assert self.base is not None
            snap_meta = self.base.timestamp.signed.snapshot_meta
        base_ts = self.base.timestamp.signed.version if self.base else None
        ts = Timestamp(
            version=self.next_version("timestamp", base_ts or 0),
            expires=_expires(timedelta(minutes=minutes)),
            snapshot_meta=snap_meta,
        )
        md = self.sign("timestamp", ts, self.roles.online)
        data = to_bytes(md)
        swap_timestamp(self.registry, data, base_ts)
        put_new(self.registry, versioned_name("timestamp", ts.version), data)


def _policy_roles(policy: TrustPolicy, given: Sequence[Ed25519PrivateKey]) -> tuple[StateRoles, dict[str, Any]]:
    return state_roles(policy), held_keys(policy, given)


def init_state(registry: Registry, policy: TrustPolicy, *, given: Sequence[Ed25519PrivateKey] = ()) -> ReleaseState:
    """Sign a first state: root, targets delegating every channel, empty channels, no revocations."""
    if state_exists(registry):
        raise Refusal(
            f"registry {registry.uri} already has a signed release state; `registry init` runs once "
            "(rotate keys with `avatar-release registry rotate`)"
        )
    roles, held = _policy_roles(policy, given)
    c = _Commit(registry, roles, held, f"initialise the release state of {registry.uri}", None)
    root = c.sign("root", _root(roles, 1, secrets.token_hex(16)), roles.root)
    c.put("root", root)
    c.put("targets", c.sign("targets", _targets(roles, 1), roles.root))
    for role in (*CHANNEL_ROLES, *LISTED_ROLES):
        c.put(role, c.sign(role, _empty(1), roles.of(role)))
    c.finish(timestamp_minutes=roles.timestamp_minutes)
    return load_state(registry, policy)


class HistoryItem:
    """One move as an unsigned registry recorded it (what ``upgrade`` signs)."""

    def __init__(
        self,
        channel: str,
        action: str,
        build_id: str,
        manifest_digest: str,
        who: str,
        when: str,
        reason: str,
        from_build: str | None,
        from_manifest_digest: str | None,
        gate_result_digest: str | None,
    ):
        self.channel, self.action, self.build_id, self.manifest_digest = channel, action, build_id, manifest_digest
        self.who, self.when, self.reason, self.from_build = who, when, reason, from_build
        self.from_manifest_digest, self.gate_result_digest = from_manifest_digest, gate_result_digest


def upgrade_state(
    registry: Registry,
    policy: TrustPolicy,
    history: dict[str, list[HistoryItem]],
    revoked: list[dict[str, Any]],
    *,
    given: Sequence[Ed25519PrivateKey] = (),
) -> ReleaseState:
    """Initialise, then sign what an unsigned registry holds: each channel's history as its chain of
    moves (the newest is where it points) and its verified revocations. The operator vouches for it."""
    if state_exists(registry):
        raise Refusal(f"registry {registry.uri} already has a signed release state; nothing to upgrade")
    state = init_state(registry, policy, given=given)
    for channel in CHANNEL_ROLES:
        items = history.get(channel) or []
        for item in items:
            state, _ = record_move(
                registry,
                policy,
                state,
                channel,
                action="upgrade",
                build_id=item.build_id,
                manifest_digest=item.manifest_digest,
                manifest_size=0,
                who=item.who,
                reason=f"upgrade: {item.action} at {item.when}: {item.reason}".strip(),
                gate_result_digest=item.gate_result_digest,
                evidence=(),
                given=given,
            )
    for r in revoked:
        state = record_revocation(registry, policy, state, given=given, **r)
    return state


def _target(channel: str, manifest_digest: str, manifest_size: int, custom: dict[str, Any]) -> Any:
    from tuf.api.metadata import TargetFile

    return TargetFile(
        length=max(manifest_size, 0),
        hashes={"sha256": manifest_digest.removeprefix("sha256:")},
        path=f"{channel}/build",
        unrecognized_fields={"custom": custom},
    )


def record_move(
    registry: Registry,
    policy: TrustPolicy,
    state: ReleaseState,
    channel: str,
    *,
    action: str,
    build_id: str,
    manifest_digest: str,
    manifest_size: int,
    who: str,
    reason: str,
    gate_result_digest: str | None,
    evidence: Sequence[BlobRef],
    given: Sequence[Ed25519PrivateKey] = (),
) -> tuple[ReleaseState, MoveRecord]:
    """Sign ``channel``'s move to the build: its move record (naming the previous one), the channel's
    new metadata, snapshot and timestamp. ``state``: what the decision read (the swap is against it)."""
    if channel not in CHANNEL_ROLES:
        raise InputError(f"unknown channel {channel!r}: expected one of {', '.join(CHANNEL_ROLES)}")
    roles, held = _policy_roles(policy, given)
    c = _Commit(registry, roles, held, f"{action} {build_id} into {channel}", state)
    prev: Holder | None = state.holder(channel)
    version = c.next_version(channel, state.roles[channel].signed.version)
    rec = MoveRecord(
        channel=channel,
        action=action,
        version=version,
        build_id=build_id,
        manifest_digest=manifest_digest,
        from_build=prev.build_id if prev else None,
        from_manifest_digest=prev.manifest_digest if prev else None,
        who=who,
        when=utcnow(),
        reason=reason,
        gate_result_digest=gate_result_digest,
        evidence=list(evidence),
        previous=prev.move if prev else None,
    )
    data = rec.to_json_bytes()
    move = BlobRef(digest=registry.put_blob(data), size=len(data), media_type=MOVE_MEDIA_TYPE)
    custom = {
        "build_id": build_id,
        "move": move.model_dump(mode="json"),
        "evidence": [e.model_dump(mode="json") for e in evidence],
        "gate_result_digest": gate_result_digest,
    }
    t = _empty(version)
    t.targets = {f"{channel}/build": _target(channel, manifest_digest, manifest_size, custom)}
    c.put(channel, c.sign(channel, t, roles.channels[channel]))
    c.finish(timestamp_minutes=roles.timestamp_minutes)
    return load_state(registry, policy), rec


def record_revocation(
    registry: Registry,
    policy: TrustPolicy,
    state: ReleaseState,
    *,
    build_id: str,
    manifest_digest: str,
    envelope: BlobRef,
    reason: str,
    by: str,
    at: str,
    given: Sequence[Ed25519PrivateKey] = (),
) -> ReleaseState:
    """Add a signed revocation of ``build_id`` to the revoked role (once: a second is a no-op)."""
    if state.revocation(build_id) is not None:
        return state
    from tuf.api.metadata import TargetFile

    roles, held = _policy_roles(policy, given)
    c = _Commit(registry, roles, held, f"revoke {build_id}", state)
    old = state.roles["revoked"].signed
    t = _empty(c.next_version("revoked", old.version))
    t.targets = dict(old.targets)
    t.targets[f"revoked/{build_id}"] = TargetFile(
        length=envelope.size,
        hashes={"sha256": envelope.digest.removeprefix("sha256:")},
        path=f"revoked/{build_id}",
        unrecognized_fields={
            "custom": {
                "build_id": build_id,
                "manifest_digest": manifest_digest,
                "reason": reason,
                "by": by,
                "at": at,
                "evidence": [envelope.model_dump(mode="json")],
            }
        },
    )
    c.put("revoked", c.sign("revoked", t, roles.revoked))
    c.finish(timestamp_minutes=roles.timestamp_minutes)
    return load_state(registry, policy)


def refresh_state(registry: Registry, policy: TrustPolicy, *, given: Sequence[Ed25519PrivateKey] = ()) -> ReleaseState:
    """A new timestamp (and a new snapshot when its own expiry is near): run it on a schedule well
    within ``[state] timestamp_minutes``, or following pods turn not-ready when it expires."""
    state = load_state(registry, policy)
    roles, held = _policy_roles(policy, given)
    c = _Commit(registry, roles, held, f"refresh the release state of {registry.uri}", state)
    if state.snapshot.signed.expires - datetime.now(UTC) < _RENEW_SNAPSHOT:
        c.finish(timestamp_minutes=roles.timestamp_minutes)
    else:
        c._timestamp(roles.timestamp_minutes)
    return load_state(registry, policy)


def rotate_state(
    registry: Registry,
    policy: TrustPolicy,
    old_root: Sequence[Ed25519PrivateKey],
    *,
    given: Sequence[Ed25519PrivateKey] = (),
) -> ReleaseState:
    """Move the state to the keys the policy names now: a new root signed by the old root keys and the
    new ones, a new targets delegating to the new keys, every channel and the revocations re-signed."""
    state = load_state(registry, policy, pin_root=False)  # the policy may name the new root keys already
    roles, held = _policy_roles(policy, given)
    c = _Commit(registry, roles, held, f"rotate the keys of {registry.uri}", state)
    old = state.root.signed
    new_root = _root(roles, old.version + 1, old.unrecognized_fields.get("x-avatar-release", {}).get("registry", ""))
    md = c.sign("root", new_root, roles.root)
    for key in old_root:
        md.sign(tuf_signer(key), append=True)
    try:
        old.verify_delegate("root", md.signed_bytes, md.signatures)
    except Exception:  # noqa: BLE001 - UnsignedMetadataError
        raise TrustError(
            f"rotate: the new root must also be signed by {old.roles['root'].threshold} of the current "
            "root keys; give them with --old-root-key KEY"
        ) from None
    c.put("root", md)
    c.put(
        "targets",
        c.sign("targets", _targets(roles, c.next_version("targets", state.targets.signed.version)), roles.root),
    )
    for role in (*CHANNEL_ROLES, *LISTED_ROLES):
        old_md = state.roles[role].signed
        t = _empty(c.next_version(role, old_md.version))
        t.targets = dict(old_md.targets)
        c.put(role, c.sign(role, t, roles.of(role)))
    c.finish(timestamp_minutes=roles.timestamp_minutes)
    return load_state(registry, policy)


def record_evidence(
    registry: Registry,
    policy: TrustPolicy,
    *,
    build_id: str,
    envelope: BlobRef,
    kind: str,
    given: Sequence[Ed25519PrivateKey] = (),
    attempts: int = 5,
) -> ReleaseState:
    """List a stored envelope in the evidence role (once), so that removing it from the build's
    attestation index hides nothing. Retried against a concurrent writer (a gate's result is worth
    more than the race)."""
    from tuf.api.metadata import TargetFile

    path = f"evidence/{build_id}/{envelope.digest.removeprefix('sha256:')}"
    for attempt in range(attempts):
        state = load_state(registry, policy)
        old = state.roles["evidence"].signed
        if path in old.targets:
            return state
        roles, held = _policy_roles(policy, given)
        c = _Commit(registry, roles, held, f"list {kind} evidence of {build_id}", state)
        t = _empty(c.next_version("evidence", old.version))
        t.targets = dict(old.targets)
        t.targets[path] = TargetFile(
            length=envelope.size,
            hashes={"sha256": envelope.digest.removeprefix("sha256:")},
            path=path,
            unrecognized_fields={
                "custom": {"build_id": build_id, "kind": kind, "media_type": envelope.media_type, "n": len(old.targets)}
            },
        )
        try:
            c.put("evidence", c.sign("evidence", t, roles.evidence))
            c.finish(timestamp_minutes=roles.timestamp_minutes)
        except ConflictError:
            if attempt == attempts - 1:
                raise
            continue
        return load_state(registry, policy)
    raise ConflictError(f"release state: could not list evidence of {build_id} after {attempts} tries")
