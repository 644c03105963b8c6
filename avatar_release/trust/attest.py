"""Signed evidence about one build: an in-toto Statement in a DSSE envelope, signed with Ed25519.

The envelope is securesystemslib's DSSE implementation (PAE, signatures by key id); the
payload is an in-toto v1 Statement whose subject is the build, named by its id and its
store-independent manifest digest (sha256 over the canonical manifest bytes: the same in a
directory store and in an OCI registry, where the registry's own digest is of the OCI manifest
that wraps it), and whose predicate is the record itself (a gate result, a compile gate, a
review answer or decision, a promotion statement).

Whoever can write to the registry can store any bytes, but cannot make an envelope verify
under a key they do not hold: the promotion policy reads only predicates whose envelope
verifies under a key the trust policy (a file the promoter controls) names for that role.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._digest import canonical_json, hex_of
from ..errors import IntegrityError, TrustError
from .keys import key_id

__all__ = ["PAYLOAD_TYPE", "STATEMENT_TYPE", "PREDICATE_TYPES", "ENVELOPE_MEDIA_TYPE", "Attestation", "attest",
           "open_envelope", "verify_envelope"]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
_PREFIX = "https://avatar-release.dev/attestations/"
# record kind -> predicate type, versioned with the record (records/*.py changelogs)
PREDICATE_TYPES = {
    "gate-result": _PREFIX + "gate-result/v1",
    "compile-gate": _PREFIX + "compile-gate/v1",
    "review-answer": _PREFIX + "review-answer/v1",
    "review-decision": _PREFIX + "review-decision/v1",
    "promotion": _PREFIX + "promotion/v1",
    "timestamp": _PREFIX + "timestamp/v1",
}


@dataclass(frozen=True)
class Attestation:
    """A verified (or merely opened) statement: who signed what about which build."""

    predicate_type: str
    build_id: str
    subject_digest: str  # "sha256:<hex>" of the manifest
    predicate: dict[str, Any]
    key_ids: tuple[str, ...]  # the keys whose signatures verified (empty when only opened)


def _signer(private_key):
    from securesystemslib.signer import CryptoSigner, SSlibKey

    public = SSlibKey.from_crypto(private_key.public_key(), keyid=key_id(private_key.public_key()))
    return CryptoSigner(private_key, public)


def _sslib_key(public_key):
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public_key, keyid=key_id(public_key))


def attest(private_key, *, kind: str, build_id: str, subject_digest: str, predicate: dict) -> bytes:
    """Sign ``predicate`` about one build; returns the envelope as canonical JSON bytes."""
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


def _parse(data: bytes, where: str):
    from securesystemslib.dsse import Envelope

    try:
        doc = json.loads(data)
        env = Envelope.from_dict(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise IntegrityError(f"{where}: not a DSSE envelope ({type(e).__name__}: {e})") from None
    if env.payload_type != PAYLOAD_TYPE:
        raise IntegrityError(f"{where}: payload type {env.payload_type!r}, expected {PAYLOAD_TYPE!r}")
    try:
        st = json.loads(env.payload)
        subject = st["subject"][0]
        att = Attestation(predicate_type=st["predicateType"], build_id=subject["name"],
                          subject_digest="sha256:" + subject["digest"]["sha256"], predicate=st["predicate"],
                          key_ids=())
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise IntegrityError(f"{where}: not an in-toto Statement ({type(e).__name__}: {e})") from None
    if st.get("_type") != STATEMENT_TYPE or not isinstance(att.predicate, dict):
        raise IntegrityError(f"{where}: not an in-toto v1 Statement")
    return env, att


def open_envelope(data: bytes, where: str) -> Attestation:
    """Read an envelope WITHOUT checking its signatures (for display; never for a decision)."""
    return _parse(data, where)[1]


def verify_envelope(data: bytes, where: str, *, trusted: dict[str, Any], kind: str,
                    subject_digest: str | None = None) -> Attestation:
    """Verify an envelope against ``trusted`` public keys ({key id: key}) and return its statement.

    Refuses (TrustError) an envelope with no signature by a trusted key, a predicate of another
    kind, or a subject other than ``subject_digest``; each refusal names the envelope, the key
    ids found and what was expected.
    """
    from securesystemslib.exceptions import VerificationError

    env, att = _parse(data, where)
    found = sorted(env.signatures)
    if not trusted:
        raise TrustError(f"{where}: no key is trusted for {kind} evidence; the trust policy names none")
    try:
        accepted = env.verify([_sslib_key(k) for k in trusted.values()], 1)
    except (VerificationError, ValueError):
        raise TrustError(
            f"{where}: no valid signature by a trusted key (signed by {', '.join(found) or 'nobody'}; "
            f"the trust policy accepts {', '.join(sorted(trusted))} for {kind} evidence)") from None
    if att.predicate_type != PREDICATE_TYPES[kind]:
        raise TrustError(f"{where}: predicate type {att.predicate_type!r}, expected {PREDICATE_TYPES[kind]!r}")
    if subject_digest is not None and att.subject_digest != subject_digest:
        raise TrustError(f"{where}: signed for build {att.build_id} ({att.subject_digest}), expected {subject_digest}")
    return Attestation(att.predicate_type, att.build_id, att.subject_digest, att.predicate, tuple(sorted(accepted)))

