"""Signed evidence in the registry: every attestation about a build, stored as a blob and listed
in the record ``attestations/<build id>``; and the verified view a promoter reads.

The index itself is unsigned (anyone who can write the registry can edit it): it only says where
to look. Each envelope is verified against the trust policy on every read; an envelope that
does not verify is reported, never used. In a registry with a signed release state every
envelope is also listed in its evidence role when it is stored, and readers take that list too:
an envelope removed from the index still counts. (Where the storing process held no key of the
state's online roles the envelope is stored unlisted, with a warning.)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._digest import canonical_json, sha256_digest
from ..errors import IntegrityError, TrustError
from ..records import BlobRef
from ..records.stored import ATTESTATIONS, parse_attestations_index, render_attestations_index
from ..registry import Registry
from .attest import ENVELOPE_MEDIA_TYPE, PREDICATE_TYPES, Attestation, attest, open_envelope, verify_envelope
from .keys import load_private_key
from .policy import load_policy, local_identity
from .state_files import NAMESPACE as STATE_NAMESPACE
from .state_read import ReleaseState, load_state, state_exists
from .state_write import record_evidence

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "store_attestation",
    "attestation_refs",
    "read_attestations",
    "verified",
    "Rejected",
    "gate_signing_key",
    "sign_and_store",
]


def gate_signing_key() -> Ed25519PrivateKey:
    """The key that signs gate evidence here: ``AVATAR_RELEASE_GATE_KEY`` (a PEM file: CI takes it
    from a secret), else this machine's own gate key (made on first use)."""
    path = os.environ.get("AVATAR_RELEASE_GATE_KEY")
    return load_private_key(path) if path else local_identity().gate_key()


def store_attestation(registry: Registry, build_id: str, envelope: bytes) -> BlobRef:
    ref = BlobRef(digest=registry.put_blob(envelope), size=len(envelope), media_type=ENVELOPE_MEDIA_TYPE)

    def add(old: bytes | None) -> bytes:
        refs = parse_attestations_index(old, f"registry record {ATTESTATIONS.name}/{build_id}")
        return render_attestations_index(refs if ref in refs else [*refs, ref])

    registry.update_record(ATTESTATIONS.name, build_id, add)
    return ref


def sign_and_store(
    registry: Registry,
    private_key: Ed25519PrivateKey,
    *,
    kind: str,
    build_id: str,
    subject_digest: str,
    predicate: dict[str, Any],
) -> BlobRef:
    """Sign, store and index an envelope; in a registry with a signed release state, also list it in
    the evidence role (signed with the keys this process holds: the signing key among them)."""
    envelope = attest(private_key, kind=kind, build_id=build_id, subject_digest=subject_digest, predicate=predicate)
    ref = store_attestation(registry, build_id, envelope)
    if state_exists(registry):
        policy = load_policy()
        try:
            record_evidence(registry, policy, build_id=build_id, envelope=ref, kind=kind, given=(private_key,))
        except TrustError as e:
            # Stored and indexed, but not listed: hiding it from the index would hide it. Say so.
            sys.stderr.write(
                f"warning: {kind} evidence {ref.digest} of {build_id} is stored but not listed in the "
                f"signed release state ({e})\n"
            )
    return ref


def attestation_refs(registry: Registry, build_id: str) -> list[BlobRef]:
    """The build's envelopes: its attestation index, and every one the signed release state's
    evidence role lists that the index lacks (an index edited to hide one hides nothing)."""
    refs = parse_attestations_index(
        registry.get_record(ATTESTATIONS.name, build_id), f"registry record {ATTESTATIONS.name}/{build_id}"
    )
    listed = _listed(registry, build_id)
    return refs + [r for r in listed if r.digest not in {x.digest for x in refs}]


# (registry's first root, timestamp.json) -> the state they verified to, within one process
_VERIFIED: dict[tuple[bytes, bytes], ReleaseState] = {}


def _listed(registry: Registry, build_id: str) -> list[BlobRef]:
    first = registry.get_record(STATE_NAMESPACE, "1.root.json")
    ts = registry.get_record(STATE_NAMESPACE, "timestamp.json") if first is not None else None
    if first is None or ts is None:
        return []
    key = (first, ts)
    state = _VERIFIED.get(key)
    if state is None:
        try:
            state = load_state(registry, load_policy(), remember=False)
        except TrustError:
            return []  # a state this policy does not trust lists nothing (a decision refuses it first)
        _VERIFIED.clear()
        _VERIFIED[key] = state
    return state.evidence(build_id)


def read_attestations(registry: Registry, build_id: str) -> list[tuple[BlobRef, bytes]]:
    return [(ref, registry.get_blob(ref.digest, ref.size)) for ref in attestation_refs(registry, build_id)]


@dataclass(frozen=True)
class Rejected:
    """An envelope that was found but not accepted, and why (for refusal messages)."""

    digest: str
    reason: str


def verified(
    registry: Registry, build_id: str, *, kind: str, trusted: dict[str, Ed25519PublicKey], subject_digest: str
) -> tuple[list[tuple[Attestation, str]], list[Rejected]]:
    """Every envelope of ``kind`` about this build that verifies under ``trusted`` keys for
    ``subject_digest``: [(attestation, digest of its predicate's canonical bytes)], plus the
    rejected ones with their reasons. Envelopes of other kinds are skipped silently."""
    good: list[tuple[Attestation, str]] = []
    bad: list[Rejected] = []
    for ref, data in read_attestations(registry, build_id):
        where = f"attestation {ref.digest}"
        try:
            if open_envelope(data, where).predicate_type != PREDICATE_TYPES[kind]:
                continue
            att = verify_envelope(data, where, trusted=trusted, kind=kind, subject_digest=subject_digest)
        except (TrustError, IntegrityError) as e:
            bad.append(Rejected(ref.digest, str(e)))
            continue
        good.append((att, sha256_digest(canonical_json(att.predicate))))
    return good, bad
