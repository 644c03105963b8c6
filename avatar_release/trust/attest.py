"""Signed evidence about one build: an in-toto Statement in a DSSE envelope, signed with Ed25519.

Envelopes are made by securesystemslib's DSSE implementation (PAE, signatures by key id).
They are verified here with ``cryptography``'s Ed25519 over the same PAE: importing
securesystemslib's signer package costs a serving pod 130 ms (it imports boto3 when that is
installed, for its AWS signer), over a quarter of a cold load; a test checks both verifiers
agree on good, tampered, foreign-key and unsigned envelopes. The payload is an in-toto v1 Statement whose subject is the build, named by its id and its
store-independent manifest digest (sha256 over the canonical manifest bytes: the same in a
directory store and in an OCI registry, where the registry's own digest is of the OCI manifest
that wraps it), and whose predicate is the record itself (a gate result, a gate shard's partial
evidence, a compile gate, a review answer or decision, a promotion statement).

Whoever can write to the registry can store any bytes, but cannot make an envelope verify
under a key they do not hold: the promotion policy reads only predicates whose envelope
verifies under a key the trust policy (a file the promoter controls) names for that role.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._digest import canonical_json, hex_of
from ..errors import IntegrityError, TrustError
from .keys import key_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from securesystemslib.signer import CryptoSigner

__all__ = [
    "PAYLOAD_TYPE",
    "STATEMENT_TYPE",
    "PREDICATE_TYPES",
    "ENVELOPE_MEDIA_TYPE",
    "Attestation",
    "attest",
    "open_envelope",
    "verify_envelope",
]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
_PREFIX = "https://avatar-release.dev/attestations/"
# record kind -> predicate type, versioned with the record (records/*.py changelogs)
PREDICATE_TYPES = {
    "gate-result": _PREFIX + "gate-result/v1",
    "gate-shard": _PREFIX + "gate-shard/v1",
    "compile-gate": _PREFIX + "compile-gate/v1",
    "review-answer": _PREFIX + "review-answer/v1",
    "review-decision": _PREFIX + "review-decision/v1",
    "promotion": _PREFIX + "promotion/v1",
    "timestamp": _PREFIX + "timestamp/v1",
    "release-approval": _PREFIX + "release-approval/v1",
    "revocation": _PREFIX + "revocation/v1",
}


@dataclass(frozen=True)
class Attestation:
    """A verified (or merely opened) statement: who signed what about which build."""

    predicate_type: str
    build_id: str
    subject_digest: str  # "sha256:<hex>" of the manifest
    predicate: dict[str, Any]
    key_ids: tuple[str, ...]  # the keys whose signatures verified (empty when only opened)


def _signer(private_key: Ed25519PrivateKey) -> CryptoSigner:
    # Lazy (heavy): securesystemslib loads only when evidence is signed or read.
    from securesystemslib.signer import CryptoSigner, SSlibKey

    public = SSlibKey.from_crypto(private_key.public_key(), keyid=key_id(private_key.public_key()))
    return CryptoSigner(private_key, public)


def attest(
    private_key: Ed25519PrivateKey, *, kind: str, build_id: str, subject_digest: str, predicate: dict[str, Any]
) -> bytes:
    """Sign ``predicate`` about one build; returns the envelope as canonical JSON bytes."""
    # Lazy (heavy): securesystemslib loads only when evidence is signed or read.
    from securesystemslib.dsse import Envelope

    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": build_id, "digest": {"sha256": hex_of(subject_digest)}}],
        "predicateType": PREDICATE_TYPES[kind],
        "predicate": predicate,
    }
    env = Envelope(payload=canonical_json(statement), payload_type=PAYLOAD_TYPE, signatures={})
    env.sign(_signer(private_key))
    return canonical_json(env.to_dict())


def _parse(data: bytes, where: str) -> tuple[str, bytes, list[tuple[str, bytes]], Attestation]:
    """(payload type, payload bytes, [(key id, signature bytes)], statement) of an envelope."""
    try:
        doc = json.loads(data)
        payload_type = doc["payloadType"]
        payload = base64.b64decode(doc["payload"], validate=True)
        sigs = [(str(s.get("keyid", "")), base64.b64decode(s["sig"], validate=True)) for s in doc["signatures"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise IntegrityError(f"{where}: not a DSSE envelope ({type(e).__name__}: {e})") from None
    if payload_type != PAYLOAD_TYPE:
        raise IntegrityError(f"{where}: payload type {payload_type!r}, expected {PAYLOAD_TYPE!r}")
    try:
        st = json.loads(payload)
        subject = st["subject"][0]
        att = Attestation(
            predicate_type=st["predicateType"],
            build_id=subject["name"],
            subject_digest="sha256:" + subject["digest"]["sha256"],
            predicate=st["predicate"],
            key_ids=(),
        )
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise IntegrityError(f"{where}: not an in-toto Statement ({type(e).__name__}: {e})") from None
    if st.get("_type") != STATEMENT_TYPE or not isinstance(att.predicate, dict):
        raise IntegrityError(f"{where}: not an in-toto v1 Statement")
    return payload_type, payload, sigs, att


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what each signature covers."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def open_envelope(data: bytes, where: str) -> Attestation:
    """Read an envelope WITHOUT checking its signatures (for display; never for a decision)."""
    return _parse(data, where)[3]


def verify_envelope(
    data: bytes, where: str, *, trusted: dict[str, Ed25519PublicKey], kind: str, subject_digest: str | None = None
) -> Attestation:
    """Verify an envelope against ``trusted`` public keys ({key id: key}) and return its statement.

    Refuses (TrustError) an envelope with no signature by a trusted key, a predicate of another
    kind, or a subject other than ``subject_digest``; each refusal names the envelope, the key
    ids found and what was expected.
    """
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.exceptions import InvalidSignature

    payload_type, payload, sigs, att = _parse(data, where)
    found = sorted({k for k, _ in sigs})
    if not trusted:
        raise TrustError(f"{where}: no key is trusted for {kind} evidence; the trust policy names none")
    message = pae(payload_type, payload)
    accepted = set()
    for kid, sig in sigs:
        key = trusted.get(kid)
        if key is None:
            continue
        try:
            key.verify(sig, message)
            accepted.add(kid)
        except InvalidSignature:
            continue
    if not accepted:
        raise TrustError(
            f"{where}: no valid signature by a trusted key (signed by {', '.join(found) or 'nobody'}; "
            f"the trust policy accepts {', '.join(sorted(trusted))} for {kind} evidence)"
        )
    if att.predicate_type != PREDICATE_TYPES[kind]:
        raise TrustError(f"{where}: predicate type {att.predicate_type!r}, expected {PREDICATE_TYPES[kind]!r}")
    if subject_digest is not None and att.subject_digest != subject_digest:
        raise TrustError(f"{where}: signed for build {att.build_id} ({att.subject_digest}), expected {subject_digest}")
    return Attestation(att.predicate_type, att.build_id, att.subject_digest, att.predicate, tuple(sorted(accepted)))
