"""What a serving pod checks before it trusts a channel: TUF's client workflow (``tuf.ngclient``)
from a pinned root, over the registry (any backend), then the evidence prod demands.

    pinned root -> newer roots (each signed by the one before) -> timestamp (unexpired) ->
    snapshot (the version and hash the timestamp signs) -> targets -> the channel's metadata
    (the version the snapshot names) -> the build it names, and the revoked role's word on it

The metadata the pod has trusted is kept in its state directory (``AVATAR_RELEASE_STATE_DIR``,
one folder per pinned root): no version may ever go below it, so a registry rolled back or
frozen (old files written back) is refused, and an expired timestamp (nobody re-signed it) is
refused as stale. For prod the pod also verifies, by digest from the signed metadata, the
build's gate evidence under the gate role's keys and, when the root says prod needs two roles,
a release approval of that very gate result under the approver role's keys by a key that did
not sign the gate result: no single key makes a pod run an ungated build.

What a poll reads: ``timestamp.json`` and a root version that is not there; the snapshot and
the channel's metadata only when they changed. None of it grows with the channel's history.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._digest import canonical_json, sha256_digest
from .._paths import state_dir
from ..errors import IntegrityError, NotFoundError, TrustError
from ..records import BlobRef
from ..registry import Registry
from .attest import PREDICATE_TYPES, open_envelope, verify_envelope
from .state_files import META_URL, PROD_ROLES_FIELD, registry_fetcher
from .state_read import StateMissing, delegated_keys, holder_of, revocation_of

if TYPE_CHECKING:
    from tuf.api.metadata import Metadata

__all__ = ["PinnedRoot", "VerifiedChannel", "StateExpired", "verify_channel_state", "load_pinned_root"]


class StateExpired(TrustError):
    """The signed state's timestamp (or another role) expired: nobody re-signed it, or it is frozen."""


@dataclass(frozen=True)
class PinnedRoot:
    """A pod's trust anchor: the root metadata it was deployed with, and where it keeps what it trusted."""

    data: bytes
    path: str  # for messages

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def metadata_dir(self) -> Path:
        d = state_dir() / "pod-trust" / self.digest.removeprefix("sha256:")[:32]
        d.mkdir(parents=True, exist_ok=True)
        return d


def load_pinned_root(path: str | Path) -> PinnedRoot:
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TrustError(
            f"trust root {p}: cannot read it ({e.strerror}); copy the registry's root metadata there "
            "(avatar-release registry root --out FILE)"
        ) from None
    from tuf.api.metadata import Metadata, Root

    try:
        md = Metadata[Root].from_bytes(data)
        if md.signed.type != "root":
            raise ValueError(f"it is {md.signed.type} metadata")
    except Exception as e:  # noqa: BLE001 - python-tuf raises several kinds for malformed metadata
        raise TrustError(f"trust root {p}: not TUF root metadata ({str(e)[:160]})") from None
    return PinnedRoot(data, str(p))


@dataclass(frozen=True)
class VerifiedChannel:
    channel: str
    build_id: str
    manifest_digest: str
    version: int  # the channel role's metadata version
    sequence: int  # the snapshot's version: registry-wide, increasing with every move
    expires: str  # when the timestamp that vouched for it expires (UTC)
    evidence: tuple[str, ...]  # what prod's evidence check accepted ("gate-result by KEY", ...)
    revoked: dict[str, Any] | None = None  # the signed revocation of the build, if there is one

    def to_json(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "build_id": self.build_id,
            "manifest_digest": self.manifest_digest,
            "version": self.version,
            "sequence": self.sequence,
            "expires": self.expires,
            "evidence": list(self.evidence),
            "revoked": self.revoked,
        }


def _updater(registry: Registry, root: PinnedRoot) -> Any:
    from tuf.ngclient import Updater

    return Updater(str(root.metadata_dir()), META_URL, fetcher=registry_fetcher(registry), bootstrap=root.data)


def _trusted(root: PinnedRoot, role: str) -> Metadata:
    """A role's metadata as the client verified and kept it (after ``refresh``)."""
    from tuf.api.metadata import Metadata

    return Metadata.from_bytes((root.metadata_dir() / f"{role}.json").read_bytes())


def verify_channel_state(registry: Registry, channel: str, root: PinnedRoot) -> VerifiedChannel:
    """The build ``channel`` names in the signed state, checked as the module says (its signed
    revocation, if any, is returned: the caller refuses to load it or flags the build it serves);
    TrustError (exit 4), StateExpired, StateMissing or NotFoundError (an empty channel)."""
    from tuf.api import exceptions as tx

    where = f"channel {channel} of {registry.uri}"
    try:
        up = _updater(registry, root)
        up.refresh()
        target = up.get_targetinfo(f"{channel}/build")
    except tx.ExpiredMetadataError as e:
        raise StateExpired(
            f"{where}: the signed release state expired ({e}): nobody re-signed its timestamp, or "
            "the registry is frozen (old files written back). Run `avatar-release registry refresh` "
            "on a schedule well within [state] timestamp_minutes"
        ) from None
    except tx.BadVersionNumberError as e:
        raise TrustError(
            f"{where}: the signed release state is older than what this pod already trusted ({e}): "
            "the registry was rolled back; nothing from it is loaded"
        ) from None
    except tx.DownloadHTTPError as e:
        raise StateMissing(
            f"{where}: the signed release state is missing ({e}); the registry was never initialised "
            "or its state was deleted (avatar-release registry init / upgrade)"
        ) from None
    except (tx.RepositoryError, tx.DownloadError) as e:
        raise TrustError(
            f"{where}: the signed release state does not verify from the pinned root {root.path} "
            f"({type(e).__name__}: {e})"
        ) from None
    except ValueError as e:  # the bootstrap root itself
        raise TrustError(f"{where}: the pinned root {root.path} is not valid root metadata ({e})") from None
    if target is None:
        raise NotFoundError(f"{where}: the signed state names no build for {channel} (the channel is empty)")
    channel_md = _trusted(root, channel)
    holder = holder_of(channel_md, channel)
    assert holder is not None  # the target was found in this very metadata
    up.get_targetinfo("revoked/-")  # loads the revoked role through the client (verified, versions checked)
    revoked = revocation_of(_trusted(root, "revoked"), holder.build_id)
    targets = _trusted(root, "targets")
    evidence: tuple[str, ...] = ()
    if channel == "prod":
        needs = targets.signed.unrecognized_fields.get(PROD_ROLES_FIELD, ["gate", "approver"])
        evidence = _check_prod_evidence(
            registry, targets, holder.build_id, holder.manifest_digest, holder.evidence, needs, where
        )
    ts = _trusted(root, "timestamp")
    snap = _trusted(root, "snapshot")
    return VerifiedChannel(
        channel,
        holder.build_id,
        holder.manifest_digest,
        holder.version,
        snap.signed.version,
        _iso(ts.signed.expires),
        evidence,
        revoked,
    )


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_prod_evidence(
    registry: Registry,
    targets: Metadata,
    build_id: str,
    manifest_digest: str,
    refs: tuple[BlobRef, ...],
    needs: list[str],
    where: str,
) -> tuple[str, ...]:
    """The gate result (gate role) and release approval (approver role, another key) that the
    channel's signed metadata names for this build, each verified here."""
    gate: tuple[Any, str] | None = None
    approvals: list[tuple[BlobRef, bytes]] = []
    for ref in refs:
        try:
            data = registry.get_blob(ref.digest, ref.size)
            kind = open_envelope(data, f"evidence {ref.digest}").predicate_type
        except (NotFoundError, IntegrityError):
            raise TrustError(
                f"{where}: evidence {ref.digest} named by the signed state is missing or damaged"
            ) from None
        if kind == PREDICATE_TYPES["gate-result"] and "gate" in needs:
            keys, threshold = delegated_keys(targets, "gate")
            att = verify_envelope(
                data, f"gate evidence {ref.digest}", trusted=keys, kind="gate-result", subject_digest=manifest_digest
            )
            status = att.predicate.get("status")
            if len(att.key_ids) < threshold or att.predicate.get("build_id") != build_id or status == "failed":
                raise TrustError(
                    f"{where}: the gate evidence {ref.digest} does not let {build_id} into prod (status "
                    f"{status!r}, {len(att.key_ids)} of {threshold} gate signatures)"
                )
            gate = (att, sha256_digest(canonical_json(att.predicate)))
        elif kind == PREDICATE_TYPES["release-approval"]:
            approvals.append((ref, data))
    accepted = []
    if "gate" in needs:
        if gate is None:
            raise TrustError(
                f"{where}: the signed state names no gate evidence for {build_id}; prod needs the gate "
                "role's signed verdict, so a pod never runs an ungated build whatever key moved prod"
            )
        accepted.append(f"gate-result by {', '.join(gate[0].key_ids)}")
    if "approver" in needs:
        accepted.append(_release_approval(targets, build_id, manifest_digest, approvals, gate, where))
    return tuple(accepted)


def _release_approval(
    targets: Metadata,
    build_id: str,
    manifest_digest: str,
    approvals: list[tuple[BlobRef, bytes]],
    gate: tuple[Any, str] | None,
    where: str,
) -> str:
    """The first release approval (approver role) of the verified gate result, by a key other
    than the gate's -> what was accepted; TrustError when none qualifies."""
    keys, threshold = delegated_keys(targets, "approver")
    for ref, data in approvals:
        att = verify_envelope(
            data,
            f"release approval {ref.digest}",
            trusted=keys,
            kind="release-approval",
            subject_digest=manifest_digest,
        )
        own = gate is not None and set(att.key_ids) & set(gate[0].key_ids)
        if (
            len(att.key_ids) >= threshold
            and not own
            and gate is not None
            and att.predicate.get("gate_result_digest") == gate[1]
        ):
            return f"release-approval by {', '.join(att.key_ids)}"
    raise TrustError(
        f"{where}: the signed state names no release approval of {build_id}'s gate result by an "
        "approver key other than the gate's; prod needs both roles"
    )
