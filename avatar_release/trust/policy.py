"""The trust policy: which keys may sign which evidence. A file the promoter controls, never
read from the registry.

    schema_version = 1
    [keys]                       # name -> public key (PEM file, relative to this file)
    ci-gate  = "keys/ci-gate.pub"
    ana      = "keys/ana.pub"
    [gate]                       # target -> key names that may sign gate evidence ("*": any target)
    "tpu-v6e-8" = ["ci-gate"]
    [review]
    reviewers = ["ana"]          # who may answer blind reviews and decide them
    prod_approvals = 1           # approvals by distinct reviewers a reviewed build needs for prod
    [release]
    approvers = ["ana"]          # keys whose signed release approval (``avatar-release approve``) prod needs
    roles = 2                    # prod needs gate evidence AND an approval by another key (1: gate alone)
    [timestamps]
    validity_hours = 1           # how long a signed timestamp vouches (pods cap it too: --max-timestamp-age)

Where it is read from, in order: ``--trust-policy`` / ``AVATAR_RELEASE_TRUST_POLICY``; else the
user's own ``<config>/trust.toml``. On first use (no such file) a machine gets its own gate key,
reviewer key and release key under ``<config>/keys/`` and a local policy trusting exactly those
(this one machine holds every role), so the embedded default (compile -> gate -> promote on one
laptop) needs no key setup, while evidence
from any other machine's key, or unsigned, never promotes. CI and shared registries point
``AVATAR_RELEASE_TRUST_POLICY`` at a policy in the repository and take keys from secrets.
"""

from __future__ import annotations

import getpass
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .. import _atomic
from .._paths import config_dir
from ..errors import InputError
from .keys import (
    generate_keypair, key_id, load_private_key, load_public_key, refuse_loose_permissions, write_public_key,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["TrustPolicy", "LocalIdentity", "config_dir", "local_identity", "load_policy", "POLICY_SCHEMA_VERSION"]

POLICY_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class LocalIdentity:
    """This machine's own keys, made on first use: one signs gate evidence, one is its reviewer,
    one approves releases to prod (the second role prod needs; on one laptop, the same person)."""

    gate_key_path: Path
    reviewer_key_path: Path
    reviewer: str
    release_key_path: Path

    def gate_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.gate_key_path)

    def reviewer_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.reviewer_key_path)

    def release_key(self) -> Ed25519PrivateKey:
        return load_private_key(self.release_key_path)


def local_identity() -> LocalIdentity:
    """This machine's gate and reviewer keys (created 0600 on first use) and the local policy."""
    d = config_dir()
    keys = d / "keys"
    reviewer = os.environ.get("AVATAR_RELEASE_REVIEWER") or _user()
    ident = LocalIdentity(keys / "gate.key", keys / "reviewer.key", reviewer, keys / "release.key")
    for name in ("gate", "reviewer", "release"):
        if not (keys / f"{name}.key").is_file():
            try:
                generate_keypair(keys, name)
            except InputError:  # a concurrent first use made it: use theirs
                pass
        if not (keys / f"{name}.pub").is_file():  # a concurrent first use between its key and its .pub
            write_public_key(keys / f"{name}.key")
    policy = d / "trust.toml"
    if not policy.is_file():
        _atomic.write_text(policy, _local_policy_text(reviewer))
    else:
        _upgrade_local_policy(policy)
    return ident


_LOCAL_MARK = "# Made by avatar-release on first use"


def _upgrade_local_policy(path: Path) -> None:
    """A first-use policy made before prod needed a release approval gets this machine's release
    key as its approver (a policy someone wrote themselves is never touched)."""
    try:
        text = path.read_text()
    except OSError:
        return
    if text.startswith(_LOCAL_MARK) and "[release]" not in text:
        _atomic.write_text(path, text.rstrip("\n").replace('[gate]', 'local-release = "keys/release.pub"\n\n[gate]', 1)
                           + "\n\n" + _LOCAL_RELEASE)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "local"


def _local_policy_text(reviewer: str) -> str:
    return (
        f"{_LOCAL_MARK}: trusts this machine's own keys only.\n"
        "# Shared registries and CI: point AVATAR_RELEASE_TRUST_POLICY at a policy in your repository.\n"
        f"schema_version = {POLICY_SCHEMA_VERSION}\n\n"
        "[keys]\n"
        'local-gate = "keys/gate.pub"\n'
        f'{_toml_key(reviewer)} = "keys/reviewer.pub"\n'
        'local-release = "keys/release.pub"\n\n'
        "[gate]\n"
        '"*" = ["local-gate"]\n\n'
        "[review]\n"
        f"reviewers = [{_toml_str(reviewer)}]\n"
        "prod_approvals = 1\n\n"
        + _LOCAL_RELEASE
    )


# Prod takes gate evidence and a release approval by another key; on one laptop this machine's
# release key is that second key, and `promote --to prod` signs the approval with it.
_LOCAL_RELEASE = '[release]\napprovers = ["local-release"]\nroles = 2\n'



def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(s: str) -> str:
    return s if s.replace("-", "").replace("_", "").isalnum() else _toml_str(s)


@dataclass(frozen=True)
class TrustPolicy:
    path: Path
    keys: dict[str, Ed25519PublicKey]  # name -> public key
    gate: dict[str, list[str]]  # target or "*" -> key names
    reviewers: list[str]
    prod_approvals: int = 1
    key_names: dict[str, str] = field(default_factory=dict)  # key id -> name
    timestamp_hours: float = 1.0  # [timestamps] validity_hours: how long a signed timestamp vouches
    approvers: list[str] = field(default_factory=list)  # [release] approvers: who approves releases to prod
    roles: int = 2  # [release] roles: 2 = prod needs a release approval by a key other than the gate's

    def gate_keys(self, target: str) -> dict[str, Ed25519PublicKey]:
        """{key id: public key} allowed to sign gate evidence for ``target``."""
        names = self.gate.get(target, []) + self.gate.get("*", [])
        return {key_id(self.keys[n]): self.keys[n] for n in names}

    def reviewer_keys(self) -> dict[str, Ed25519PublicKey]:
        return {key_id(self.keys[n]): self.keys[n] for n in self.reviewers}

    def approver_keys(self) -> dict[str, Ed25519PublicKey]:
        """{key id: public key} whose signed release approval counts for prod."""
        return {key_id(self.keys[n]): self.keys[n] for n in self.approvers}

    def revoker_keys(self) -> dict[str, Ed25519PublicKey]:
        """Every key the policy names: a revocation can only hold a build back, so any role may sign one."""
        return {key_id(k): k for k in self.keys.values()}

    def name_of(self, kid: str) -> str:
        return self.key_names.get(kid, kid)

    def owns_name(self, name: object, key_ids: Iterable[str]) -> bool:
        """Whether this policy gives ``name`` to one of the keys that signed: the one signer check of
        reviewers and release approvers. A name written into signed evidence (or typed on the command
        line) proves nothing; the key that signs it does."""
        return isinstance(name, str) and name in {self.name_of(k) for k in key_ids}

    def describe(self) -> str:
        return str(self.path)


def load_policy(path: str | os.PathLike | None = None) -> TrustPolicy:
    """The policy from ``path``, ``AVATAR_RELEASE_TRUST_POLICY``, or this user's (made on first use)."""
    explicit = path or os.environ.get("AVATAR_RELEASE_TRUST_POLICY")
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise InputError(f"trust policy {p}: no such file (AVATAR_RELEASE_TRUST_POLICY / --trust-policy)")
    else:
        local_identity()
        p = config_dir() / "trust.toml"
    refuse_loose_permissions(p, "trust policy")
    try:
        doc = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"trust policy {p}: not readable TOML ({e})") from None
    if doc.get("schema_version") != POLICY_SCHEMA_VERSION:
        raise InputError(f"trust policy {p}: schema_version {doc.get('schema_version')!r}, this avatar-release "
                         f"reads {POLICY_SCHEMA_VERSION}")
    unknown = set(doc) - {"schema_version", "keys", "gate", "review", "release", "timestamps"}
    if unknown:
        raise InputError(f"trust policy {p}: unknown section(s) {sorted(unknown)}; expected keys, gate, review, "
                         "release, timestamps")
    keys: dict[str, Ed25519PublicKey] = {}
    for name, rel in (doc.get("keys") or {}).items():
        kp = Path(rel) if os.path.isabs(rel) else p.parent / rel
        keys[name] = load_public_key(kp)
    gate = {t: list(v) for t, v in (doc.get("gate") or {}).items()}
    review = doc.get("review") or {}
    reviewers = list(review.get("reviewers", []))
    release = doc.get("release") or {}
    approvers = list(release.get("approvers", []))
    for where, names in [*((f"gate.{t}", v) for t, v in gate.items()), ("review.reviewers", reviewers),
                         ("release.approvers", approvers)]:
        missing = [n for n in names if n not in keys]
        if missing:
            raise InputError(f"trust policy {p}: {where} names {missing}, which [keys] does not define")
    approvals = review.get("prod_approvals", 1)
    if not isinstance(approvals, int) or approvals < 1:
        raise InputError(f"trust policy {p}: review.prod_approvals must be a positive integer, got {approvals!r}")
    roles = release.get("roles", 2)
    if roles not in (1, 2) or isinstance(roles, bool):
        raise InputError(f"trust policy {p}: release.roles must be 2 (prod needs gate evidence and a release "
                         f"approval by another key) or 1 (gate evidence alone), got {roles!r}")
    hours = doc.get("timestamps", {}).get("validity_hours", 1.0)
    if not isinstance(hours, (int, float)) or isinstance(hours, bool) or not 0 < hours <= 24 * 7:
        raise InputError(f"trust policy {p}: timestamps.validity_hours must be a number of hours in (0, 168], "
                         f"got {hours!r}")
    return TrustPolicy(path=p, keys=keys, gate=gate, reviewers=reviewers, prod_approvals=approvals,
                       key_names={key_id(k): n for n, k in keys.items()}, timestamp_hours=float(hours),
                       approvers=approvers, roles=roles)
