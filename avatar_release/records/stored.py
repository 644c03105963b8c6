"""The side records a registry keeps beside builds, and the blobs each keeps alive.

Every namespace a room writes with ``registry.put_record`` is declared here once: what it is
keyed by (a build id or a channel) and its roots (the blobs that must survive garbage
collection as long as the record does). Garbage collection asks these declarations instead
of knowing any namespace by name, and keeps, untouched, any namespace it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import IntegrityError
from ._base import BlobRef, parse_record
from .gate import GateResult

__all__ = ["StoredNamespace", "STORED_NAMESPACES", "GATE_RESULTS", "GATE_SHARDS", "COMPILE_GATES", "REVIEWS", "STATEMENTS",
           "ATTESTATIONS", "TIMESTAMPS", "parse_results_index", "render_results_index", "parse_attestations_index",
           "render_attestations_index", "parse_shards_index", "render_shards_index"]

# fetch(BlobRef) -> verified bytes: how a roots function reads a blob it must look inside.
Fetch = Callable[[BlobRef], bytes]


@dataclass(frozen=True)
class StoredNamespace:
    name: str
    keyed_by: Literal["build", "channel"]
    what: str
    roots: Callable[[bytes, str, Fetch], list[BlobRef]]  # (stored bytes, record name, fetch) -> blobs


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


def parse_shards_index(raw: bytes | None, where: str) -> tuple[list[BlobRef], list[BlobRef]]:
    """A build's gate-shards index: (partial evidence blobs oldest first, the frames blobs they name)."""
    if raw is None:
        return [], []
    try:
        doc = json.loads(raw)
        return [BlobRef(**r) for r in doc["shards"]], [BlobRef(**r) for r in doc["frames"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise IntegrityError(f"{where}: not a gate-shards index (expected {{'shards': [...], 'frames': [...]}})") \
            from None


def render_shards_index(shards: list[BlobRef], frames: list[BlobRef]) -> bytes:
    return json.dumps({"shards": [r.model_dump() for r in shards], "frames": [f.model_dump() for f in frames]}).encode()


def _gate_shards_roots(raw: bytes, name: str, fetch: Fetch) -> list[BlobRef]:
    shards, frames = parse_shards_index(raw, f"record gate-shards/{name}")
    return shards + frames


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
GATE_SHARDS = StoredNamespace("gate-shards", "build", "partial gate evidence of sharded gate runs and their frames",
                              _gate_shards_roots)
COMPILE_GATES = StoredNamespace("compile-gates", "build", "the compile gate's result for a build", _no_blobs)
REVIEWS = StoredNamespace("reviews", "build", "the blind review of a build below the band", _no_blobs)
STATEMENTS = StoredNamespace("statements", "channel", "the signed statement for where a channel points", _no_blobs)
TIMESTAMPS = StoredNamespace("timestamps", "channel", "the short-lived signed newest sequence of a channel", _no_blobs)
ATTESTATIONS = StoredNamespace("attestations", "build", "signed evidence about a build (DSSE envelopes)",
                               _attestation_roots)

STORED_NAMESPACES: dict[str, StoredNamespace] = {ns.name: ns for ns in (GATE_RESULTS, GATE_SHARDS, COMPILE_GATES,
                                                                        REVIEWS, STATEMENTS, ATTESTATIONS, TIMESTAMPS)}
