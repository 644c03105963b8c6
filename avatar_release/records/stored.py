"""The side records a registry keeps beside builds, and the blobs each keeps alive.

Every namespace a room writes with ``registry.put_record`` is declared here once: what it is
keyed by (a build id or a channel) and its roots (the blobs that must survive garbage
collection as long as the record does). Garbage collection asks these declarations instead
of knowing any namespace by name, and keeps, untouched, any namespace it does not know.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import IntegrityError
from ._base import BlobRef, parse_record
from .gate import GateResult

__all__ = ["StoredNamespace", "STORED_NAMESPACES", "GATE_RESULTS", "GATE_SHARDS", "COMPILE_GATES", "REVIEWS", "STATEMENTS",
           "ATTESTATIONS", "TIMESTAMPS", "parse_results_index", "render_results_index", "parse_attestations_index",
           "render_attestations_index", "shard_record_name", "shard_record_build", "parse_shard_record",
           "render_shard_record"]

# fetch(BlobRef) -> verified bytes: how a roots function reads a blob it must look inside.
Fetch = Callable[[BlobRef], bytes]


@dataclass(frozen=True)
class StoredNamespace:
    name: str
    keyed_by: Literal["build", "channel"]
    what: str
    roots: Callable[[bytes, str, Fetch], list[BlobRef]]  # (stored bytes, record name, fetch) -> blobs
    # record name -> the build it belongs to (keyed_by "build"); most namespaces name records by it
    build_of: Callable[[str], str] = lambda name: name


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
        raise IntegrityError(f"{where}: not a gate-results index (expected {{'results': [...], 'frames': [...]}})") \
            from None


def render_results_index(results: list[BlobRef], frames: list[BlobRef]) -> bytes:
    # The frames are listed too, so stores that keep only what records reference keep them.
    return json.dumps({"results": [r.model_dump() for r in results],
                       "frames": [f.model_dump() for f in frames]}).encode()


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


def parse_shard_record(raw: bytes, where: str) -> dict[str, BlobRef | list[BlobRef]]:
    """A shard run's record: its signed envelope, its partial and the frames the partial names."""
    try:
        doc = json.loads(raw)
        return {"envelope": BlobRef(**doc["envelope"]), "shard": BlobRef(**doc["shard"]),
                "frames": [BlobRef(**r) for r in doc["frames"]]}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise IntegrityError(f"{where}: not a gate-shard record (expected {{'envelope', 'shard', 'frames'}})") from None


def render_shard_record(envelope: BlobRef, shard: BlobRef, frames: list[BlobRef]) -> bytes:
    return json.dumps({"envelope": envelope.model_dump(), "shard": shard.model_dump(),
                       "frames": [f.model_dump() for f in frames]}).encode()


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


def _no_blobs(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    return []


GATE_RESULTS = StoredNamespace("gate-results", "build", "every gate result of a build and its frames",
                               _gate_results_roots)
GATE_SHARDS = StoredNamespace("gate-shards", "build", "one sharded gate run's signed partial evidence and frames",
                              _gate_shards_roots, build_of=shard_record_build)
COMPILE_GATES = StoredNamespace("compile-gates", "build", "the compile gate's result for a build", _no_blobs)
REVIEWS = StoredNamespace("reviews", "build", "the blind review of a build below the band", _no_blobs)
STATEMENTS = StoredNamespace("statements", "channel", "the signed statement for where a channel points", _no_blobs)
TIMESTAMPS = StoredNamespace("timestamps", "channel", "the short-lived signed newest sequence of a channel", _no_blobs)
ATTESTATIONS = StoredNamespace("attestations", "build", "signed evidence about a build (DSSE envelopes)",
                               _attestation_roots)

STORED_NAMESPACES: dict[str, StoredNamespace] = {ns.name: ns for ns in (GATE_RESULTS, GATE_SHARDS, COMPILE_GATES,
                                                                        REVIEWS, STATEMENTS, ATTESTATIONS, TIMESTAMPS)}
