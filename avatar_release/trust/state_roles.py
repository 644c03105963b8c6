"""Who signs each role of the signed release state, from the trust policy; and which of their
private keys this process holds.

The roles (TUF's, https://theupdateframework.github.io/specification/latest/):

    root        keys and thresholds of every role below    [state] root, else the release approvers
    targets     delegates a role to each channel           the root keys
    dev, staging, prod
                which build the channel names, its evidence, its previous move
                                                           [state.channels], else gate keys + approvers
    revoked     the builds that never move or load again   every key the policy names
    evidence    every signed envelope stored about a build (gate results, approvals, reviews), by
                digest: one hidden from a build's attestation index still counts
                                                           every key the policy names
    snapshot    the version of every role's metadata       [state] online, else gate keys + approvers
    timestamp   the snapshot's digest, short-lived         the same online keys
    gate, approver
                key lists only (no metadata of their own): whose gate evidence and release approval
                a pod demands before it runs a prod build  the policy's gate keys and approvers

Private keys come from, in order: the keys a command is given (``--sign-key``), the files named
by ``AVATAR_RELEASE_STATE_KEYS`` (``os.pathsep``-separated) and ``AVATAR_RELEASE_GATE_KEY``, and
this machine's first-use keys. Only those the policy names are used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError, TrustError
from .keys import key_id, load_private_key
from .policy import TrustPolicy, local_identity

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "RoleKeys",
    "StateRoles",
    "state_roles",
    "held_keys",
    "signers_for",
    "STATE_KEYS_ENV",
    "CHANNEL_ROLES",
    "TOP_ROLES",
    "LISTED_ROLES",
]

STATE_KEYS_ENV = "AVATAR_RELEASE_STATE_KEYS"
CHANNEL_ROLES = ("dev", "staging", "prod")
TOP_ROLES = ("root", "targets", "snapshot", "timestamp")
LISTED_ROLES = ("revoked", "evidence")  # lists any key the policy names may add to


@dataclass(frozen=True)
class RoleKeys:
    """A role's keys ({our key id: public key}), its threshold, and the policy's names for them."""

    role: str
    keys: dict[str, Ed25519PublicKey]
    threshold: int
    names: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.role} ({self.threshold} of {', '.join(self.names) or 'no keys'})"


@dataclass(frozen=True)
class StateRoles:
    root: RoleKeys
    online: RoleKeys  # snapshot and timestamp
    channels: dict[str, RoleKeys]
    revoked: RoleKeys
    evidence: RoleKeys
    gate: RoleKeys
    approver: RoleKeys
    timestamp_minutes: float
    prod_requires: tuple[str, ...]  # whose evidence a pod demands for prod: gate (and approver: two roles)

    def delegated(self) -> list[RoleKeys]:
        """The roles the top-level targets delegates, in order."""
        return [*(self.channels[c] for c in CHANNEL_ROLES), self.revoked, self.evidence, self.gate, self.approver]

    def of(self, role: str) -> RoleKeys:
        """A role with metadata of its own below targets: a channel, revoked or evidence."""
        return self.channels.get(role) or {"revoked": self.revoked, "evidence": self.evidence}[role]


def _role(policy: TrustPolicy, role: str, names: Iterable[str], threshold: int = 1) -> RoleKeys:
    unique = tuple(dict.fromkeys(names))
    return RoleKeys(role, {key_id(policy.keys[n]): policy.keys[n] for n in unique}, threshold, unique)


def state_roles(policy: TrustPolicy) -> StateRoles:
    s = policy.state
    gate_names = [n for names in policy.gate.values() for n in names]
    movers = [*gate_names, *policy.approvers]
    root = s.root or tuple(policy.approvers) or tuple(gate_names)
    if not root:
        raise InputError(
            f"trust policy {policy.path}: no key can be the release state's root: name one in "
            "[state] root (or [release] approvers)"
        )
    channels = {c: _role(policy, c, s.channels.get(c) or movers) for c in CHANNEL_ROLES}
    return StateRoles(
        root=_role(policy, "root", root, s.root_threshold if s.root else 1),
        online=_role(policy, "online", s.online or movers),
        channels=channels,
        revoked=_role(policy, "revoked", policy.keys),
        evidence=_role(policy, "evidence", policy.keys),
        gate=_role(policy, "gate", gate_names),
        approver=_role(policy, "approver", policy.approvers),
        timestamp_minutes=s.timestamp_minutes,
        prod_requires=("gate", "approver") if policy.roles == 2 else ("gate",),
    )


def held_keys(policy: TrustPolicy, given: Iterable[Ed25519PrivateKey] = ()) -> dict[str, Ed25519PrivateKey]:
    """{our key id: private key} of every key this process holds that the policy names."""
    named = {key_id(k) for k in policy.keys.values()}
    found: dict[str, Ed25519PrivateKey] = {}

    def add(key: Ed25519PrivateKey) -> None:
        kid = key_id(key.public_key())
        if kid in named:
            found.setdefault(kid, key)

    for key in given:
        add(key)
    for path in [
        *filter(None, os.environ.get(STATE_KEYS_ENV, "").split(os.pathsep)),
        os.environ.get("AVATAR_RELEASE_GATE_KEY", ""),
    ]:
        if path:
            add(load_private_key(path))
    ident = local_identity()
    for own in (ident.release_key_path, ident.gate_key_path, ident.reviewer_key_path):
        if own.is_file():
            add(load_private_key(own))
    return found


def signers_for(role: RoleKeys, held: dict[str, Ed25519PrivateKey], *, what: str) -> list[Ed25519PrivateKey]:
    """The held keys of ``role`` (all of them, at least its threshold), or TrustError naming what is missing."""
    mine = [held[k] for k in role.keys if k in held]
    if len(mine) < role.threshold:
        raise TrustError(
            f"{what}: the {role.describe()} role needs {role.threshold} signature(s) and this process "
            f"holds {len(mine)} of its keys; give one with --sign-key KEY or {STATE_KEYS_ENV}=KEY[:KEY]"
        )
    return mine
