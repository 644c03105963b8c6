"""Signed evidence in the registry: every attestation about a build, stored as a blob and listed
in the record ``attestations/<build id>``; and the verified view a promoter reads.

The list itself is unsigned (anyone who can write the registry can edit it): it only says where
to look. Each envelope is verified against the trust policy on every read; an envelope that
does not verify is reported, never used. What the list cannot prevent: someone with write access
hiding a newer envelope. They can make evidence disappear, never appear.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._digest import canonical_json, sha256_digest
from ..errors import IntegrityError, TrustError
from ..records import BlobRef
from ..records.stored import ATTESTATIONS, parse_attestations_index, render_attestations_index
from ..registry import Registry
from .attest import ENVELOPE_MEDIA_TYPE, PREDICATE_TYPES, Attestation, attest, open_envelope, verify_envelope
from .keys import load_private_key
from .policy import local_identity

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["store_attestation", "attestation_refs", "read_attestations", "verified", "Rejected", "gate_signing_key",
           "sign_and_store"]


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


def sign_and_store(registry: Registry, private_key: Ed25519PrivateKey, *, kind: str, build_id: str,
                   subject_digest: str, predicate: dict[str, Any]) -> BlobRef:
    envelope = attest(private_key, kind=kind, build_id=build_id, subject_digest=subject_digest, predicate=predicate)
    return store_attestation(registry, build_id, envelope)


def attestation_refs(registry: Registry, build_id: str) -> list[BlobRef]:
    return parse_attestations_index(registry.get_record(ATTESTATIONS.name, build_id),
                                    f"registry record {ATTESTATIONS.name}/{build_id}")


def read_attestations(registry: Registry, build_id: str) -> list[tuple[BlobRef, bytes]]:
    return [(ref, registry.get_blob(ref.digest, ref.size)) for ref in attestation_refs(registry, build_id)]


@dataclass(frozen=True)
class Rejected:
    """An envelope that was found but not accepted, and why (for refusal messages)."""

    digest: str
    reason: str


def verified(registry: Registry, build_id: str, *, kind: str, trusted: dict[str, Ed25519PublicKey], subject_digest: str
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
