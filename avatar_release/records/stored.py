"""The side records a registry keeps beside builds, and the blobs each keeps alive.

Every namespace a room writes with ``registry.put_record`` is declared here once: what it is
keyed by (a build id or a channel), its roots (the blobs that must survive garbage
collection as long as the record does) and its attachments (the signed blobs it holds about a
build, which an OCI registry also attaches to that build's OCI manifest as referrers, so
``oras discover`` and ``cosign tree`` find them). Garbage collection asks these declarations
instead of knowing any namespace by name, and keeps, untouched, any namespace it does not know.

Attached: every attestation (``attestations``: gate results, compile gates, review answers and
decisions), every shard run's signed partial evidence (``gate-shards``) and every promotion
statement (``statements``, a DSSE envelope about the build the channel was moved to). Not
attached: timestamps (re-signed every few hours, they would add a referrer per refresh) and
version-1 signed statements (no longer written).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypedDict

from .._digest import sha256_digest
from ..errors import IntegrityError
from ._base import BlobRef, parse_record
from .gate import GateResult

__all__ = [
    "StoredNamespace",
    "STORED_NAMESPACES",
    "GATE_RESULTS",
    "GATE_SHARDS",
    "COMPILE_GATES",
    "REVIEWS",
    "STATEMENTS",
    "ATTESTATIONS",
    "TIMESTAMPS",
    "RELEASE_STATE",
    "parse_results_index",
    "render_results_index",
    "parse_attestations_index",
    "render_attestations_index",
    "shard_record_name",
    "shard_record_build",
    "parse_shard_record",
    "render_shard_record",
    "ShardRecord",
    "Attachment",
    "DSSE_ENVELOPE",
    "PROMOTION_STATEMENT",
]

# fetch(BlobRef) -> verified bytes: how a roots function reads a blob it must look inside.
Fetch = Callable[[BlobRef], bytes]


# What an attached blob is, as an OCI artifactType: gate evidence is a DSSE envelope (the media
# type in-toto and sigstore use); a promotion statement is one too, typed as what it says.
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
PROMOTION_STATEMENT = "application/vnd.avatar-release.promotion-statement.v1+json"
_IN_TOTO = "application/vnd.in-toto+json"


def _in_toto(data: bytes) -> dict | None:
    """The in-toto Statement inside a DSSE envelope, read WITHOUT checking a signature: for labels
    and links only (a reader verifies with ``trust.attest``); None for anything else."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("payloadType") != _IN_TOTO:
            return None
        statement = json.loads(base64.b64decode(doc["payload"], validate=True))
    except (ValueError, KeyError, TypeError):
        return None
    return statement if isinstance(statement, dict) else None


@dataclass(frozen=True)
class Attachment:
    """A signed blob a record holds about one build: attached to that build (an OCI referrer)."""

    build_id: str
    blob: BlobRef  # its media type is the layer's
    artifact_type: str

    def label(self, data: bytes) -> tuple[str, str | None]:
        """(file name, in-toto predicate type or None) of the blob, from its bytes: what ``oras pull``
        writes it as and what ``oras discover`` shows. Unverified: a label, never a decision."""
        statement = _in_toto(data) or {}
        predicate = statement.get("predicateType")
        predicate = predicate if isinstance(predicate, str) else None
        # ".../attestations/gate-result/v1" -> "gate-result"
        parts = [p for p in (predicate or "").split("/") if p]
        kind = re.sub(r"[^a-z0-9_.-]+", "-", parts[-2].lower())[:64].strip("-.") if len(parts) >= 2 else ""
        return f"{kind or 'signed'}-{self.blob.digest[7:19]}.dsse.json", predicate


def _no_attachments(raw: bytes, name: str) -> list[Attachment]:
    return []


@dataclass(frozen=True)
class StoredNamespace:
    name: str
    keyed_by: Literal["build", "channel", "registry"]
    what: str
    roots: Callable[[bytes, str, Fetch], list[BlobRef]]  # (stored bytes, record name, fetch) -> blobs
    # record name -> the build it belongs to (keyed_by "build"); most namespaces name records by it
    build_of: Callable[[str], str] = lambda name: name
    # (stored bytes, record name) -> the signed blobs it attaches to builds; never raises (a record
    # that does not parse attaches nothing, and is refused where it is read)
    attachments: Callable[[bytes, str], list[Attachment]] = _no_attachments


def parse_results_index(raw: bytes | None, where: str) -> tuple[list[BlobRef], list[BlobRef] | None]:
    """A build's gate-results index: (results oldest first, frames or None for indexes older
    than the frames list)."""
    if raw is None:
        return [], []
    try:
        doc = json.loads(raw)
        results = [BlobRef(**r) for r in doc["results"]]
        frames = doc.get("frames")
        return results, (None if frames is None else [BlobRef(**r) for r in frames])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise IntegrityError(
            f"{where}: not a gate-results index (expected {{'results': [...], 'frames': [...]}})"
        ) from None


def render_results_index(results: list[BlobRef], frames: list[BlobRef]) -> bytes:
    # The frames are listed too, so stores that keep only what records reference keep them.
    return json.dumps(
        {"results": [r.model_dump() for r in results], "frames": [f.model_dump() for f in frames]}
    ).encode()


def _gate_results_roots(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    results, frames = parse_results_index(raw, f"record gate-results/{name}")
    if frames is None:  # an index written before it listed frames: read them from the results
        frames = [parse_record(GateResult, fetch(r), where=f"gate result {r.digest}").frames_blob for r in results]
    return results + frames


_SHARD_SEP = "__shard-"


def shard_record_name(build_id: str, index: int, count: int, twins: list[int], run_id: str | None) -> str:
    """One record per shard run: shards on many hosts never read-modify-write a shared record
    (an OCI registry's record lock is per host), so parallel shards lose nothing."""
    run = re.sub(r"[^a-z0-9_.-]+", "-", (run_id or "none").lower()).strip("-.")[:48] or "none"
    return f"{build_id}{_SHARD_SEP}{index}-of-{count}-t{''.join(map(str, twins))}-{run}"


def shard_record_build(name: str) -> str:
    return name.split(_SHARD_SEP)[0]


class ShardRecord(TypedDict):
    """A ``gate-shards`` record, parsed: the blobs one shard run stored."""

    envelope: BlobRef  # its signed DSSE envelope
    shard: BlobRef  # its partial evidence (a GateShard)
    frames: list[BlobRef]  # the frames the partial names


def parse_shard_record(raw: bytes, where: str) -> ShardRecord:
    """A shard run's record: its signed envelope, its partial and the frames the partial names."""
    try:
        doc = json.loads(raw)
        return {
            "envelope": BlobRef(**doc["envelope"]),
            "shard": BlobRef(**doc["shard"]),
            "frames": [BlobRef(**r) for r in doc["frames"]],
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        raise IntegrityError(f"{where}: not a gate-shard record (expected {{'envelope', 'shard', 'frames'}})") from None


def render_shard_record(envelope: BlobRef, shard: BlobRef, frames: list[BlobRef]) -> bytes:
    return json.dumps(
        {"envelope": envelope.model_dump(), "shard": shard.model_dump(), "frames": [f.model_dump() for f in frames]}
    ).encode()


def _gate_shards_roots(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    doc = parse_shard_record(raw, f"record gate-shards/{name}")
    return [doc["envelope"], doc["shard"], *doc["frames"]]


def parse_attestations_index(raw: bytes | None, where: str) -> list[BlobRef]:
    """A build's signed attestations (DSSE envelopes), oldest first."""
    if raw is None:
        return []
    try:
        return [BlobRef(**r) for r in json.loads(raw)["envelopes"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise IntegrityError(f"{where}: not an attestations index (expected {{'envelopes': [...]}})") from None


def render_attestations_index(envelopes: list[BlobRef]) -> bytes:
    return json.dumps({"envelopes": [e.model_dump() for e in envelopes]}).encode()


def _attestation_roots(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    return parse_attestations_index(raw, f"record attestations/{name}")


def _attestation_attachments(raw: bytes, name: str) -> list[Attachment]:
    try:
        refs = parse_attestations_index(raw, f"record attestations/{name}")
    except IntegrityError:
        return []
    return [Attachment(name, ref, DSSE_ENVELOPE) for ref in refs]


def _shard_attachments(raw: bytes, name: str) -> list[Attachment]:
    try:
        envelope = parse_shard_record(raw, f"record gate-shards/{name}")["envelope"]
    except IntegrityError:
        return []
    return [Attachment(shard_record_build(name), envelope, DSSE_ENVELOPE)]


def _statement_attachments(raw: bytes, name: str) -> list[Attachment]:
    """A promotion statement is its own envelope; it is about the build its in-toto subject names."""
    statement = _in_toto(raw)
    try:
        build_id = statement["subject"][0]["name"] if statement else None
    except (KeyError, IndexError, TypeError):
        build_id = None
    if not isinstance(build_id, str) or not build_id:
        return []
    blob = BlobRef(digest=sha256_digest(raw), size=len(raw), media_type=DSSE_ENVELOPE)
    return [Attachment(build_id, blob, PROMOTION_STATEMENT)]


def _no_blobs(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    return []


GATE_RESULTS = StoredNamespace(
    "gate-results", "build", "every gate result of a build and its frames", _gate_results_roots
)
GATE_SHARDS = StoredNamespace(
    "gate-shards",
    "build",
    "one sharded gate run's signed partial evidence and frames",
    _gate_shards_roots,
    build_of=shard_record_build,
    attachments=_shard_attachments,
)
COMPILE_GATES = StoredNamespace("compile-gates", "build", "the compile gate's result for a build", _no_blobs)
REVIEWS = StoredNamespace("reviews", "build", "the blind review of a build below the band", _no_blobs)
STATEMENTS = StoredNamespace(
    "statements",
    "channel",
    "the signed statement for where a channel points",
    _no_blobs,
    attachments=_statement_attachments,
)
TIMESTAMPS = StoredNamespace("timestamps", "channel", "the short-lived signed newest sequence of a channel", _no_blobs)
ATTESTATIONS = StoredNamespace(
    "attestations",
    "build",
    "signed evidence about a build (DSSE envelopes)",
    _attestation_roots,
    attachments=_attestation_attachments,
)


def _release_state_roots(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    """A channel's or the revocations' metadata keeps alive the move records and evidence its
    targets name (older versions stay, so every move of a chain is named by some file)."""
    try:
        targets = json.loads(raw)["signed"].get("targets") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
    out = []
    for target in targets.values() if isinstance(targets, dict) else ():
        custom = target.get("custom") if isinstance(target, dict) else None
        for r in [custom.get("move"), *(custom.get("evidence") or [])] if isinstance(custom, dict) else ():
            try:
                out.append(BlobRef(**r))
            except (TypeError, ValueError):
                continue
    return out


RELEASE_STATE = StoredNamespace(
    "release-state", "registry", "the signed release state: TUF metadata of every role", _release_state_roots
)

STORED_NAMESPACES: dict[str, StoredNamespace] = {
    ns.name: ns
    for ns in (GATE_RESULTS, GATE_SHARDS, COMPILE_GATES, REVIEWS, STATEMENTS, ATTESTATIONS, TIMESTAMPS, RELEASE_STATE)
}
