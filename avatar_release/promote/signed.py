"""The channels as the signed release state names them, in the shapes the promotion policy reads
(``ChannelState``, ``HistoryEntry``), and the evidence envelopes a move names by digest.

Decisions read channels only through :class:`SignedChannels`: a channel pointer, a history line or
an attestation index that someone wrote into the registry without the keys changes nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._digest import canonical_json, sha256_digest
from ..errors import IntegrityError, NotFoundError, Revoked, TrustError
from ..records import BlobRef, ChannelState, HistoryEntry, Manifest, MoveRecord
from ..registry import CHANNELS, Registry, Resolved, read_manifest
from ..trust.attest import open_envelope
from ..trust.evidence import attestation_refs
from ..trust.state_moves import history_entry
from ..trust.state_read import ReleaseState, moves

__all__ = ["SignedChannels", "evidence_ref"]


@dataclass
class SignedChannels:
    registry: Registry
    state: ReleaseState
    _moves: dict[str, list[MoveRecord]] = field(default_factory=dict)

    def resolve(self, ref: str) -> tuple[Resolved, Manifest]:
        """``ref`` read once: a channel name from the signed state (its build must be the very manifest the
        state signs), anything else (build id, digest) from the registry as content-addressed."""
        if ref not in CHANNELS:
            return read_manifest(self.registry, ref)
        holder = self.state.holder(ref)
        if holder is None:
            raise NotFoundError(f"channel {ref} is empty in the signed release state of {self.registry.uri}")
        resolved, manifest = read_manifest(self.registry, holder.build_id)
        if manifest.content_digest() != holder.manifest_digest:
            raise TrustError(
                f"channel {ref}: the signed state names {holder.build_id} with manifest "
                f"{holder.manifest_digest}, but this registry's {holder.build_id} is "
                f"{manifest.content_digest()}; the build was replaced under its id"
            )
        return Resolved(ref, resolved.build_id, resolved.digest, "channel"), manifest

    def get_channel(self, channel: str) -> ChannelState | None:
        holder = self.state.holder(channel)
        if holder is None:
            return None
        resolved, _ = self.resolve(channel)
        head = self.moves(channel)[-1]
        return ChannelState(
            channel=channel,
            build_id=holder.build_id,
            digest=resolved.digest,
            sequence=holder.version,
            updated_at=head.when,
        )

    def moves(self, channel: str) -> list[MoveRecord]:
        """The channel's signed moves, oldest first."""
        if channel not in self._moves:
            self._moves[channel] = moves(self.registry, self.state.holder(channel))
        return self._moves[channel]

    def history(self, channel: str) -> list[HistoryEntry]:
        """The signed moves as history entries (digests: the manifests' content digests)."""
        return [history_entry(m) for m in self.moves(channel)]

    def check_not_revoked(self, build_id: str, what: str) -> None:
        found = self.state.revocation(build_id)
        if found is not None:
            raise Revoked(
                f"{what}: {build_id} is revoked by {found.get('by', '?')} at {found.get('at', '?')} (signed "
                f"release state): {found.get('reason', '')}. A revoked build never moves or loads again; "
                "release a fixed build instead"
            )


def evidence_ref(registry: Registry, build_id: str, predicate_digest: str) -> BlobRef:
    """The stored envelope whose predicate has this digest (what verdicts and approvals are named by)."""
    for ref in reversed(attestation_refs(registry, build_id)):
        try:
            att = open_envelope(registry.get_blob(ref.digest, ref.size), f"attestation {ref.digest}")
        except (IntegrityError, NotFoundError):
            continue
        if sha256_digest(canonical_json(att.predicate)) == predicate_digest:
            return ref
    raise IntegrityError(f"{build_id}: the envelope of evidence {predicate_digest} is not in the registry")
