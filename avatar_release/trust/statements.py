"""Signed promotion statements, and the checks a serving pod makes before it trusts a channel.

A statement binds: build id and manifest digest, the channel, the history sequence number of
the move that put the build there (registry-wide, strictly increasing), issue and expiry
times, and the signing key's id. The manifest digest is the store-independent one
(``Manifest.content_digest()``, version 2 of the statement), so a statement signed in one store
verifies in every copy of the build (``avatar-release copy``): a directory store, an OCI
registry (whose build manifest names those very manifest bytes as its config), another OCI
registry. Version-1 statements bound the digest of the store they were signed in (an OCI
manifest digest in an OCI registry) and are verified against either digest.

A digest alone is not enough: the channel is signed, so a statement for dev never passes for
prod, and the sequence lets a pod refuse a replay of an older statement (rollback protection:
the pod remembers the highest sequence it accepted per channel). An intentional rollback is a
new move with a higher sequence and a new statement.

Stored in the registry as the record ``statements/<channel>``: a DSSE envelope (the same
in-toto Statement format as gate evidence, ``trust.attest``, predicate type ``.../promotion/v1``).
The format written before 2026-12-01 (``avatar-release/signed-statement``, a bare signature beside
the payload) is outside the support window (``records.window``): it is refused, version error,
naming the command that signs the channel again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _atomic
from .._digest import canonical_json
from ..errors import IntegrityError, SchemaVersionError, TrustError
from ..records import (
    STATEMENT_SCHEMA_VERSION,
    StatementPayload,
    TimestampPayload,
    parse_record,
)
from ..records.stored import STATEMENTS, TIMESTAMPS
from ..records.window import RECORD_FORMATS_PAGE, oldest_supported
from ..registry import Registry, read_manifest
from .attest import attest, open_envelope, verify_envelope
from .keys import key_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "StatementPayload",
    "PromotionStatement",
    "sign",
    "publish_statement",
    "read_statement",
    "parse_statement",
    "verify",
    "AcceptedState",
    "DEFAULT_VALIDITY",
    "TIMESTAMP_VALIDITY",
    "SignedTimestamp",
    "sign_timestamp",
    "publish_timestamp",
    "read_timestamp",
    "verify_fresh",
    "verify_channel",
    "signed_digest",
]

DEFAULT_VALIDITY = timedelta(days=30)
# A timestamp lives an hour by default (the trust policy's [timestamps] validity_hours sets what a
# promoter signs), and a pod accepts none signed longer ago than its own cap (TrustConfig, default
# this): how long a restarted pod with no trust state could still be fed a superseded statement.
TIMESTAMP_VALIDITY = timedelta(hours=1)
_NS = STATEMENTS.name
_BARE_KIND = "avatar-release/signed-statement"  # the format before DSSE envelopes: refused


def _ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_ts(text: str, what: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise TrustError(f"statement {what} {text!r} is not a UTC timestamp") from None


@dataclass(frozen=True)
class PromotionStatement:
    """A promotion statement as a DSSE envelope (in-toto Statement, predicate = the payload)."""

    payload: StatementPayload
    envelope: bytes  # exactly as stored and signed

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {"payload": self.payload.model_dump(mode=mode), "envelope": json.loads(self.envelope)}


def signed_digest(registry: Registry, digest: str) -> str:
    """What a statement about the build with this store digest binds: its manifest's content digest."""
    return read_manifest(registry, digest)[1].content_digest()


def sign(
    private_key: Ed25519PrivateKey,
    *,
    build_id: str,
    build_digest: str,
    channel: str,
    sequence: int,
    who: str,
    validity: timedelta = DEFAULT_VALIDITY,
    now: datetime | None = None,
) -> PromotionStatement:
    """``build_digest``: the build's manifest content digest (:func:`signed_digest`), not a store's digest."""
    now = now or datetime.now(UTC)
    payload = StatementPayload(
        build_id=build_id,
        build_digest=build_digest,
        channel=channel,
        sequence=sequence,
        issued_at=_ts(now),
        expires_at=_ts(now + validity),
        key_id=key_id(private_key.public_key()),
        who=who,
    )
    envelope = attest(
        private_key,
        kind="promotion",
        build_id=build_id,
        subject_digest=build_digest,
        predicate=payload.model_dump(mode="json"),
    )
    return PromotionStatement(payload, envelope)


def publish_statement(registry: Registry, statement: PromotionStatement) -> None:
    registry.put_record(_NS, statement.payload.channel, statement.envelope)


def read_statement(registry: Registry, channel: str) -> PromotionStatement | None:
    """The statement for ``channel`` (a DSSE envelope)."""
    raw = registry.get_record(_NS, channel)
    return None if raw is None else parse_statement(raw, channel)


def parse_statement(raw: bytes, channel: str) -> PromotionStatement:
    """A stored statement's bytes (the record ``statements/<channel>``), parsed; its signature unchecked.
    A statement in the format before DSSE envelopes is a :class:`SchemaVersionError` (exit 11)."""
    where = f"statement for channel {channel}"
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("kind") == _BARE_KIND:
            raise SchemaVersionError(
                f"{where}: an {_BARE_KIND} (a bare signature beside the payload, written before 2026-12-01), a format "
                "outside this avatar-release's support window, which reads DSSE envelopes of "
                f"avatar-release/statement v{oldest_supported(STATEMENT_SCHEMA_VERSION)}..{STATEMENT_SCHEMA_VERSION}; sign the channel "
                f"again with this avatar-release: `avatar-release keys sign {channel} --key KEY` ({RECORD_FORMATS_PAGE})",
                kind=_BARE_KIND,
                found=doc.get("schema_version") if isinstance(doc.get("schema_version"), int) else None,
                supported=(oldest_supported(STATEMENT_SCHEMA_VERSION), STATEMENT_SCHEMA_VERSION),
            )
        att = open_envelope(raw, where)
        # parse_record checks the version first: a newer statement is a version error (exit 11)
        return PromotionStatement(parse_record(StatementPayload, canonical_json(att.predicate), where=where), raw)
    except (IntegrityError, ValueError) as e:
        raise TrustError(f"channel {channel}: the signed statement is unreadable ({str(e)[:200]})") from None


class AcceptedState:
    """The highest statement sequence this pod has accepted, per channel, kept in a JSON file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[str, dict[str, Any]]:
        if not self.path.is_file():
            return {}
        try:
            return json.loads(self.path.read_text())
        except ValueError:
            raise TrustError(
                f"pod trust state {self.path} is corrupt; restore it (deleting it disables "
                "replay protection until the next accepted statement)"
            ) from None

    def highest(self, channel: str) -> dict[str, Any] | None:
        return self.load().get(channel)

    def accept(self, payload: StatementPayload) -> None:
        state = self.load()
        state[payload.channel] = {
            "sequence": payload.sequence,
            "digest": payload.build_digest,
            "build_id": payload.build_id,
            "accepted_at": _ts(datetime.now(UTC)),
        }
        _atomic.write_json(self.path, state, indent=None)


def verify(
    statement: PromotionStatement | None,
    public_key: Ed25519PublicKey,
    *,
    channel: str,
    digest: str,
    state: AcceptedState | None = None,
    now: datetime | None = None,
    content_digest: str | None = None,
) -> StatementPayload:
    """Every check a pod makes, in order; TrustError naming the first that fails.

    ``digest`` is what the channel points at in this store; ``content_digest`` the content digest
    of the build manifest it resolves to (``Manifest.content_digest()``, the same in every store;
    omitted, ``digest`` is taken to be it, as in a directory store). A version-2 statement binds
    the content digest, so it verifies in every copy of the build; a version-1 statement may bind
    either (one signed in an OCI store bound that store's OCI manifest digest).
    """

    where = f"channel {channel}"
    if statement is None:
        raise TrustError(
            f"{where}: unsigned: no signed statement in the registry; a trust key is configured, "
            "so only signed promotions are served (promote with --sign-key)"
        )
    p = statement.payload
    _check_signature(statement, public_key, where)
    if p.channel != channel:
        raise TrustError(f"{where}: the statement was signed for channel {p.channel!r}, not {channel!r}")
    if p.build_digest not in (digest, content_digest):
        copied = (
            " (or, a version-1 statement, it was signed in another store, whose digests differ: re-sign it "
            f"here with avatar-release keys sign {channel})"
            if p.schema_version < 2
            else ""
        )
        raise TrustError(
            f"{where}: the statement signs {p.build_id} ({p.build_digest}), but the channel points "
            f"at {digest} (manifest {content_digest or digest}); the channel was moved without a signed "
            f"promotion{copied}"
        )
    now = now or datetime.now(UTC)
    if now >= _parse_ts(p.expires_at, "expiry"):
        raise TrustError(
            f"{where}: the statement expired at {p.expires_at}; re-sign it "
            f"(avatar-release keys sign {channel} --key KEY)"
        )
    if state is not None:
        _check_not_replayed(p, state.highest(channel), where, digest, content_digest)
    return p


def _check_signature(statement: PromotionStatement, public_key: Ed25519PublicKey, where: str) -> None:
    """The statement is signed by ``public_key`` and its envelope signs exactly its payload."""
    p = statement.payload
    want = key_id(public_key)
    if p.key_id != want:
        raise TrustError(f"{where}: signed by key {p.key_id}, this pod trusts {want}")
    tampered = TrustError(f"{where}: the statement's signature does not verify (tampered, or a wrong key)")
    try:
        att = verify_envelope(
            statement.envelope, where, trusted={want: public_key}, kind="promotion", subject_digest=p.build_digest
        )
    except (TrustError, IntegrityError):
        raise tampered from None
    if att.predicate != p.model_dump(mode="json"):
        raise tampered


def _check_not_replayed(
    p: StatementPayload, seen: dict[str, Any] | None, where: str, digest: str, content_digest: str | None
) -> None:
    """``p`` is not older than ``seen``, the highest statement this pod accepted for its channel."""
    # the same sequence is the same move only for the same build (remembered by either of its digests)
    same_build = seen is not None and seen["digest"] in (p.build_digest, digest, content_digest)
    if seen is not None and (p.sequence < seen["sequence"] or (p.sequence == seen["sequence"] and not same_build)):
        raise TrustError(
            f"{where}: replayed statement: sequence {p.sequence} ({p.build_id}) is older than "
            f"the {seen['sequence']} ({seen['build_id']}) this pod already accepted; a rollback "
            "must be a new signed promotion"
        )


@dataclass(frozen=True)
class SignedTimestamp:
    payload: TimestampPayload
    envelope: bytes


def sign_timestamp(
    private_key: Ed25519PrivateKey,
    *,
    channel: str,
    sequence: int,
    build_id: str,
    build_digest: str,
    validity: timedelta = TIMESTAMP_VALIDITY,
    now: datetime | None = None,
) -> SignedTimestamp:
    """The newest sequence of ``channel``, signed for a short time. Re-sign it on a schedule
    (``avatar-release keys refresh CHANNEL``, e.g. hourly from a CronJob) and on every signed move."""
    now = now or datetime.now(UTC)
    payload = TimestampPayload(
        channel=channel,
        sequence=sequence,
        build_id=build_id,
        build_digest=build_digest,
        issued_at=_ts(now),
        expires_at=_ts(now + validity),
        key_id=key_id(private_key.public_key()),
    )
    envelope = attest(
        private_key,
        kind="timestamp",
        build_id=build_id,
        subject_digest=build_digest,
        predicate=payload.model_dump(mode="json"),
    )
    return SignedTimestamp(payload, envelope)


def publish_timestamp(registry: Registry, ts: SignedTimestamp) -> None:
    registry.put_record(TIMESTAMPS.name, ts.payload.channel, ts.envelope)


def read_timestamp(registry: Registry, channel: str) -> SignedTimestamp | None:
    raw = registry.get_record(TIMESTAMPS.name, channel)
    if raw is None:
        return None
    where = f"timestamp of {channel}"
    try:
        predicate = open_envelope(raw, where).predicate
        return SignedTimestamp(parse_record(TimestampPayload, canonical_json(predicate), where=where), raw)
    except (IntegrityError, ValueError) as e:
        raise TrustError(f"channel {channel}: the signed timestamp is unreadable ({str(e)[:200]})") from None


def verify_fresh(
    ts: SignedTimestamp | None,
    public_key: Ed25519PublicKey,
    *,
    statement: StatementPayload,
    now: datetime | None = None,
    max_age: timedelta = TIMESTAMP_VALIDITY,
) -> TimestampPayload:
    """A pod that cannot remember (no trust state, or a fresh one) accepts ``statement`` only with
    an unexpired timestamp, signed by the same key no longer than ``max_age`` ago (whatever expiry
    the signer chose), naming exactly its channel and sequence."""
    where = f"channel {statement.channel}"
    fix = f"re-sign it: avatar-release keys refresh {statement.channel} --key KEY (run it on a schedule)"
    if ts is None:
        raise TrustError(f"{where}: no signed timestamp, so this pod cannot tell the statement is the newest; {fix}")
    want = key_id(public_key)
    try:
        att = verify_envelope(
            ts.envelope,
            f"timestamp of {statement.channel}",
            trusted={want: public_key},
            kind="timestamp",
            subject_digest=ts.payload.build_digest,
        )
    except (TrustError, IntegrityError):
        raise TrustError(f"{where}: the timestamp's signature does not verify with key {want}") from None
    t = TimestampPayload.model_validate(att.predicate)
    if t.channel != statement.channel:
        raise TrustError(f"{where}: the timestamp is for channel {t.channel!r}")
    now = now or datetime.now(UTC)
    if now >= _parse_ts(t.expires_at, "timestamp expiry"):
        raise TrustError(
            f"{where}: the timestamp expired at {t.expires_at}; a statement it cannot vouch for may be a replay; {fix}"
        )
    age = now - _parse_ts(t.issued_at, "timestamp issue time")
    if age > max_age:
        raise TrustError(
            f"{where}: the timestamp was signed {age.total_seconds() / 3600:.1f} h ago ({t.issued_at}), "
            f"longer ago than this pod accepts ({max_age.total_seconds() / 3600:g} h); {fix}"
        )
    if (t.sequence, t.build_digest) != (statement.sequence, statement.build_digest):
        raise TrustError(
            f"{where}: replayed statement: sequence {statement.sequence} ({statement.build_id}), but the "
            f"timestamp of {t.issued_at} says the newest is {t.sequence} ({t.build_id})"
        )
    return t


def verify_channel(
    registry: Registry,
    channel: str,
    public_key: Ed25519PublicKey,
    *,
    digest: str,
    state: AcceptedState | None = None,
    require_fresh: bool = True,
    now: datetime | None = None,
    content_digest: str | None = None,
    max_age: timedelta = TIMESTAMP_VALIDITY,
) -> StatementPayload:
    """Everything a pod checks before it trusts ``channel``: the statement (key, signature,
    channel, digest, expiry, replay against what this pod remembers) and, with ``require_fresh``,
    an unexpired timestamp naming that very statement, which a pod that remembers nothing (a
    restarted container) needs to refuse an older statement replayed to it.

    ``content_digest`` not given: read from the manifest ``digest`` names in ``registry``."""
    if content_digest is None:
        content_digest = signed_digest(registry, digest)
    p = verify(
        read_statement(registry, channel),
        public_key,
        channel=channel,
        digest=digest,
        state=state,
        now=now,
        content_digest=content_digest,
    )
    if require_fresh:
        verify_fresh(read_timestamp(registry, channel), public_key, statement=p, now=now, max_age=max_age)
    return p
