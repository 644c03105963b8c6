"""The signed release state as a decision reads it (promote, rollback, revoke, approve, ls).

Every file is verified from the root the trust policy names, in TUF's order: the root chain
(each version signed by its own keys and the previous version's), the timestamp, the snapshot it
names (length, hash, signatures), the top-level targets and every channel's metadata at exactly
the versions the snapshot names. Versions never go below what this machine has seen of the same
registry (kept under the state directory, keyed by the digest of the registry's first root), and
a versioned timestamp newer than ``timestamp.json`` means it was rolled back.

A writer does not demand an unexpired timestamp (it re-signs one on every write, and
``registry refresh`` exists for that); pods do (``trust.state_pod``).

A registry without any signed state is an error (exit 4), never an empty registry: ``registry
init`` makes a new one, ``registry upgrade`` signs the state an existing one holds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _atomic
from .._paths import state_dir
from ..errors import IntegrityError, NotFoundError, TrustError
from ..records import BlobRef, MoveRecord, parse_record
from ..registry import Registry
from .keys import key_id
from .policy import TrustPolicy
from .state_files import NAMESPACE, list_versions, public_key_of, tuf_key, versioned_name
from .state_roles import CHANNEL_ROLES, LISTED_ROLES, state_roles

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from tuf.api.metadata import Metadata

__all__ = [
    "StateMissing",
    "Holder",
    "ReleaseState",
    "load_state",
    "moves",
    "seen_path",
    "state_exists",
    "holder_of",
    "revocation_of",
    "delegated_keys",
    "MAX_MOVES",
]

MAX_MOVES = 1_000_000  # a chain longer than this is not a history, it is an attack on the reader


class StateMissing(TrustError):
    """The registry has no signed release state (exit 4: initialise or upgrade it)."""


@dataclass(frozen=True)
class Holder:
    """The build a channel's signed metadata names, and what its move carried."""

    channel: str
    build_id: str
    manifest_digest: str
    version: int  # the channel role's metadata version
    move: BlobRef
    evidence: tuple[BlobRef, ...]
    gate_result_digest: str | None


def holder_of(md: Metadata, channel: str) -> Holder | None:
    target = md.signed.targets.get(f"{channel}/build")
    if target is None:
        return None
    c = target.custom if isinstance(target.custom, dict) else {}
    try:
        return Holder(
            channel,
            str(c["build_id"]),
            "sha256:" + target.hashes["sha256"],
            md.signed.version,
            BlobRef(**c["move"]),
            tuple(BlobRef(**e) for e in c.get("evidence") or ()),
            c.get("gate_result_digest"),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise IntegrityError(
            f"release state: {channel}'s metadata v{md.signed.version} names its build without "
            f"the fields avatar-release writes ({e})"
        ) from None


def revocation_of(md: Metadata, build_id: str) -> dict[str, Any] | None:
    """The signed revocation of ``build_id`` in the revoked role's metadata (its ``custom``), or None."""
    target = md.signed.targets.get(f"revoked/{build_id}")
    if target is None:
        return None
    return dict(target.custom) if isinstance(target.custom, dict) else {}


def delegated_keys(targets: Metadata, role: str) -> tuple[dict[str, Ed25519PublicKey], int]:
    """({our key id: public key}, threshold) of a role the top-level targets delegates."""
    d = targets.signed.delegations
    if d is None or d.roles is None or role not in d.roles:
        raise IntegrityError(f"release state: the top-level targets delegates no role {role!r}")
    r = d.roles[role]
    keys = {}
    for kid in r.keyids:
        pub = public_key_of(d.keys[kid])
        keys[key_id(pub)] = pub
    return keys, r.threshold


@dataclass
class ReleaseState:
    registry_id: str  # sha256 of the registry's first root: the same registry wherever it is copied
    root: Metadata
    timestamp: Metadata
    snapshot: Metadata
    targets: Metadata
    roles: dict[str, Metadata]  # dev, staging, prod, revoked, evidence
    bytes_read: int = 0
    names: dict[str, str] = field(default_factory=dict)  # role -> the file read

    def holder(self, channel: str) -> Holder | None:
        return holder_of(self.roles[channel], channel)

    def revocation(self, build_id: str) -> dict[str, Any] | None:
        return revocation_of(self.roles["revoked"], build_id)

    def evidence(self, build_id: str) -> list[BlobRef]:
        """Every envelope about ``build_id`` the evidence role lists, in the order they were listed."""
        prefix = f"evidence/{build_id}/"
        out = []
        for path, target in self.roles["evidence"].signed.targets.items():
            if path.startswith(prefix):
                c = target.custom if isinstance(target.custom, dict) else {}
                out.append(
                    (
                        int(c.get("n", 0)),
                        BlobRef(
                            digest="sha256:" + target.hashes["sha256"],
                            size=target.length,
                            media_type=str(c.get("media_type", "")),
                        ),
                    )
                )
        return [ref for _, ref in sorted(out, key=lambda x: x[0])]

    def keys(self, role: str) -> tuple[dict[str, Ed25519PublicKey], int]:
        return delegated_keys(self.targets, role)

    @property
    def sequence(self) -> int:
        """Registry-wide, strictly increasing with every change of any channel or revocation."""
        return int(self.snapshot.signed.version)


def state_exists(registry: Registry) -> bool:
    return registry.get_record(NAMESPACE, versioned_name("root", 1)) is not None


def seen_path(registry_id: str) -> Path:
    return state_dir() / "release-state" / f"{registry_id.removeprefix('sha256:')[:32]}.json"


def _parse(data: bytes, name: str) -> Metadata:
    from tuf.api.metadata import Metadata

    try:
        return Metadata.from_bytes(data)
    except Exception as e:  # noqa: BLE001 - python-tuf raises several kinds for malformed metadata
        raise IntegrityError(f"release state: {name} is not TUF metadata ({str(e)[:200]})") from None


def _verify(delegator: Any, role: str, md: Metadata, name: str) -> None:
    from tuf.api.exceptions import UnsignedMetadataError

    try:
        delegator.verify_delegate(role, md.signed_bytes, md.signatures)
    except (UnsignedMetadataError, ValueError) as e:
        raise TrustError(
            f"release state: {name} is not signed by the {role} role's threshold of keys ({e}); it was "
            "tampered with, or written by keys the root does not name"
        ) from None
    if md.signed.type != ("targets" if role not in ("root", "timestamp", "snapshot") else role):
        raise TrustError(f"release state: {name} is {md.signed.type} metadata, expected {role}")


def _missing(registry: Registry) -> StateMissing:
    if registry.list_channels() or registry.history():
        return StateMissing(
            f"registry {registry.uri} has channels but no signed release state: decisions read only signed state. "
            "Sign the state it holds now, once, with the root keys of your trust policy: avatar-release registry "
            "upgrade"
        )
    return StateMissing(
        f"registry {registry.uri} has no signed release state; initialise it once with the root keys "
        "of your trust policy: avatar-release registry init"
    )


class _Reader:
    """One verification of a registry's state: each file read once, its bytes counted."""

    def __init__(self, registry: Registry, seen: dict[str, int]):
        self.registry, self.seen, self.total = registry, seen, 0

    def read(self, name: str, what: str, *, required: bool = True) -> bytes | None:
        data = self.registry.get_record(NAMESPACE, name)
        if data is None and required:
            raise TrustError(
                f"release state: {name} ({what}) is missing from the registry; the signed state was "
                "damaged or partly deleted: restore the release-state records from a copy "
                "(avatar-release copy) or a backup"
            )
        self.total += len(data or b"")
        return data

    def root_chain(self, first: bytes) -> Metadata:
        """The newest root, each version signed by its own keys and the previous version's."""
        root = _parse(first, "1.root.json")
        _verify(root.signed, "root", root, "1.root.json")
        version = 1
        while (data := self.read(versioned_name("root", version + 1), "root", required=False)) is not None:
            name = versioned_name("root", version + 1)
            new = _parse(data, name)
            _verify(root.signed, "root", new, name)
            _verify(new.signed, "root", new, name)
            if new.signed.version != version + 1:
                raise TrustError(f"release state: {name} says it is version {new.signed.version}")
            root, version = new, version + 1
        _check_not_older("root", version, self.seen)
        return root

    def timestamp(self, root: Metadata) -> Metadata:
        ts = _parse(self.read("timestamp.json", "timestamp") or b"", "timestamp.json")
        _verify(root.signed, "timestamp", ts, "timestamp.json")
        newest = list_versions(self.registry)
        if newest.get("timestamp", 0) > ts.signed.version:
            raise TrustError(
                f"release state: timestamp.json is version {ts.signed.version}, but the registry holds "
                f"timestamp version {newest['timestamp']}: the timestamp was rolled back; restore the "
                "newest (or, if you hold the online key, avatar-release registry refresh signs a newer one)"
            )
        _check_not_older("timestamp", ts.signed.version, self.seen)
        return ts

    def snapshot(self, root: Metadata, ts: Metadata) -> Metadata:
        meta = ts.signed.snapshot_meta
        name = versioned_name("snapshot", meta.version)
        data = self.read(name, "the snapshot the timestamp names") or b""
        try:
            meta.verify_length_and_hashes(data)
        except Exception:  # noqa: BLE001 - LengthOrHashMismatchError
            raise TrustError(
                f"release state: {name} is not the snapshot the timestamp signs (length or hash differ)"
            ) from None
        snap = _parse(data, name)
        _verify(root.signed, "snapshot", snap, name)
        if snap.signed.version != meta.version:
            raise TrustError(f"release state: {name} says it is version {snap.signed.version}")
        _check_not_older("snapshot", snap.signed.version, self.seen)
        return snap

    def role(self, snap: Metadata, role: str, delegator: Any) -> Metadata:
        """A targets role at exactly the version, length and hash the snapshot names."""
        m = snap.signed.meta.get(f"{role}.json")
        if m is None:
            raise TrustError(f"release state: the snapshot names no {role} metadata")
        name = versioned_name(role, m.version)
        data = self.read(name, f"{role} at the version the snapshot names") or b""
        if m.hashes or m.length:
            try:
                m.verify_length_and_hashes(data)
            except Exception:  # noqa: BLE001 - LengthOrHashMismatchError
                raise TrustError(
                    f"release state: {name} is not the file the snapshot signs (length or hash differ): "
                    "a file mixed in from another copy or registry"
                ) from None
        md = _parse(data, name)
        _verify(delegator, role, md, name)
        if md.signed.version != m.version:
            raise TrustError(f"release state: {name} says it is version {md.signed.version}: a mixed state")
        _check_not_older(role, m.version, self.seen)
        return md


def load_state(
    registry: Registry, policy: TrustPolicy, *, remember: bool = True, pin_root: bool = True
) -> ReleaseState:
    """The verified signed state (see the module's note), or TrustError / StateMissing (exit 4).
    ``pin_root`` False (key rotation only): the registry's newest root need not name the policy's root keys."""
    first = registry.get_record(NAMESPACE, versioned_name("root", 1))
    if first is None:
        raise _missing(registry)
    registry_id = "sha256:" + hashlib.sha256(first).hexdigest()
    r = _Reader(registry, _load_seen(registry_id))
    r.total = len(first)
    root = r.root_chain(first)
    if pin_root:
        _check_root_keys(root, policy, registry)
    ts = r.timestamp(root)
    snap = r.snapshot(root, ts)
    targets = r.role(snap, "targets", root.signed)
    roles = {name: r.role(snap, name, targets.signed) for name in (*CHANNEL_ROLES, *LISTED_ROLES)}
    state = ReleaseState(registry_id, root, ts, snap, targets, roles, r.total)
    if remember:
        _remember(registry_id, state)
    return state


def _check_root_keys(root: Metadata, policy: TrustPolicy, registry: Registry) -> None:
    """The registry's newest root must be the one the promoter's policy names: its root keys."""
    want = {tuf_key(k).keyid for k in state_roles(policy).root.keys.values()}
    have = set(root.signed.roles["root"].keyids)
    if want != have:
        raise TrustError(
            f"release state of {registry.uri}: its root (v{root.signed.version}) names other root keys "
            f"than the trust policy {policy.path}. Use the trust policy this registry was initialised "
            "with (AVATAR_RELEASE_TRUST_POLICY=FILE: your team's, usually in its repository); if you "
            "rotated the root keys, sign a new root with the old ones (avatar-release registry rotate)"
        )


def _load_seen(registry_id: str) -> dict[str, int]:
    p = seen_path(registry_id)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        raise TrustError(
            f"the release state this machine saw ({p}) is unreadable; restore it, or delete it to trust "
            "the registry's state as it is now"
        ) from None
    return {k: int(v) for k, v in doc.get("versions", {}).items()} if isinstance(doc, dict) else {}


def _check_not_older(role: str, version: int, seen: dict[str, int]) -> None:
    if version < seen.get(role, 0):
        raise TrustError(
            f"release state: {role} is version {version}, older than the version {seen[role]} this "
            "machine has already seen: the registry's signed state was rolled back. Nothing was "
            "decided; restore the newest state (a copy or a backup of the registry)"
        )


def _remember(registry_id: str, state: ReleaseState) -> None:
    versions = {
        "root": state.root.signed.version,
        "timestamp": state.timestamp.signed.version,
        "snapshot": state.snapshot.signed.version,
        "targets": state.targets.signed.version,
        **{r: md.signed.version for r, md in state.roles.items()},
    }
    seen = _load_seen(registry_id)
    if all(seen.get(k) == v for k, v in versions.items()):
        return
    merged = {k: max(v, seen.get(k, 0)) for k, v in versions.items()}
    _atomic.write_json(seen_path(registry_id), {"registry_id": registry_id, "versions": merged})


def moves(registry: Registry, holder: Holder | None) -> list[MoveRecord]:
    """The channel's moves, oldest first, read back along the chain from the signed newest one:
    every blob is fetched by digest, so the signed metadata authenticates each."""
    out: list[MoveRecord] = []
    ref = holder.move if holder else None
    while ref is not None:
        if len(out) >= MAX_MOVES:
            raise IntegrityError(
                f"release state: {holder.channel if holder else '?'}'s history is longer than {MAX_MOVES} moves"
            )
        try:
            data = registry.get_blob(ref.digest, ref.size)
        except NotFoundError:
            raise TrustError(
                f"release state: move record {ref.digest} of {holder.channel if holder else '?'} is "
                "missing from the registry; restore it from a copy"
            ) from None
        rec = parse_record(MoveRecord, data, where=f"move record {ref.digest}")
        if holder is not None and rec.channel != holder.channel:
            raise TrustError(
                f"release state: move record {ref.digest} is a move of {rec.channel}, inside {holder.channel}'s history"
            )
        out.append(rec)
        ref = rec.previous
    out.reverse()
    return out
