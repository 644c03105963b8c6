"""Revocations: a signed "never again" about one build, honoured by promotion, rollback and pods.

``avatar-release revoke BUILD --reason TEXT`` signs a ``revocation`` attestation (predicate:
build id, reason, who, when) about the build's manifest content digest and stores it with the
build's other evidence. It is final: there is no un-revoke (compile the same source again and it
is a new build, or the same digest: revoked too, since the subject is the manifest).

Who counts: a revocation can only hold a build back, so the bar is "a key we know", never "the
right role":
  * the promotion policy counts one signed by any key its trust policy names (``[keys]``);
  * a pod with a trust key counts one signed by that key (the key that signs its channel's
    statements); a pod without a trust key verifies nothing signed, so it honours any revocation
    envelope that parses (someone who can write the registry can already move its channel).

The limit is the one every attestation has (``trust.evidence``): someone with write access to the
registry can hide a revocation from the unsigned attestation list; they can never forge one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError, IntegrityError, Revoked, TrustError
from ..records import utcnow
from ..registry import Registry
from .attest import PREDICATE_TYPES, open_envelope, verify_envelope
from .evidence import read_attestations, sign_and_store

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["Revocation", "revoke", "revocations", "check_not_revoked"]


@dataclass(frozen=True)
class Revocation:
    build_id: str
    reason: str
    by: str
    at: str
    key_ids: tuple[str, ...]  # who signed it (empty: opened by a pod that trusts no key)
    envelope_digest: str

    def describe(self) -> str:
        signed = f", signed by {', '.join(self.key_ids)}" if self.key_ids else ""
        return f"revoked by {self.by} at {self.at}{signed}: {self.reason}"

    def to_json(self) -> dict:
        return {
            "build_id": self.build_id,
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
            "key_ids": list(self.key_ids),
            "envelope": self.envelope_digest,
        }


def revoke(
    registry: Registry, build_id: str, subject_digest: str, private_key: Ed25519PrivateKey, *, reason: str, by: str
) -> Revocation:
    """Sign and store a revocation of ``build_id`` (manifest content digest ``subject_digest``)."""
    reason = reason.strip()
    if not reason:
        raise InputError("revoke: --reason TEXT is required (it is shown to everyone the revocation refuses)")
    predicate = {"build_id": build_id, "reason": reason, "revoked_by": by, "at": utcnow()}
    ref = sign_and_store(
        registry, private_key, kind="revocation", build_id=build_id, subject_digest=subject_digest, predicate=predicate
    )
    return Revocation(build_id, reason, by, predicate["at"], (), ref.digest)


def revocations(
    registry: Registry, build_id: str, subject_digest: str | None, trusted: dict[str, Ed25519PublicKey] | None
) -> list[Revocation]:
    """The revocations of this build that count: verified under ``trusted`` ({key id: public key}),
    or, with ``trusted`` None, every one that parses (see the module's note). Oldest first.
    ``subject_digest`` None (listing, display only) skips the manifest check."""
    out = []
    for ref, data in read_attestations(registry, build_id):
        where = f"attestation {ref.digest}"
        try:
            opened = open_envelope(data, where)
            if opened.predicate_type != PREDICATE_TYPES["revocation"]:
                continue
            att = (
                opened
                if trusted is None
                else verify_envelope(data, where, trusted=trusted, kind="revocation", subject_digest=subject_digest)
            )
        except (TrustError, IntegrityError):
            continue  # not a revocation we can count; it never lets anything through either
        if (subject_digest is not None and att.subject_digest != subject_digest) or att.predicate.get(
            "build_id"
        ) != build_id:
            continue
        p = att.predicate
        out.append(
            Revocation(
                build_id,
                str(p.get("reason", "")),
                str(p.get("revoked_by", "?")),
                str(p.get("at", "")),
                att.key_ids,
                ref.digest,
            )
        )
    return sorted(out, key=lambda r: r.at)


def check_not_revoked(
    registry: Registry, build_id: str, subject_digest: str, trusted: dict[str, Ed25519PublicKey] | None, *, what: str
) -> None:
    """Raise ``Revoked`` (exit 1) naming who revoked the build, when and why."""
    found = revocations(registry, build_id, subject_digest, trusted)
    if found:
        raise Revoked(
            f"{what}: {build_id} is {found[0].describe()}. A revoked build never moves or loads again; "
            "release a fixed build instead"
        )
