"""Gate records: the result a gate stores with a build, the blind review, the similarity band.

All are versioned like the manifest (``schema_version``, read through ``parse_record``) and
exported as JSON Schema under ``manifests/schema/``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..records import BlobRef, Record

__all__ = [
    "GATE_SCHEMA_VERSION",
    "EnvironmentRecord",
    "GateSetRecord",
    "GateRequestRecord",
    "BaselineRef",
    "GateEvidence",
    "GateResult",
    "ReviewAnswer",
    "ReviewDecision",
    "ReviewRecord",
    "BandVariant",
    "Band",
    "CompileCheck",
    "CompileGateResult",
]

GATE_SCHEMA_VERSION = 1
FRAMES_MEDIA_TYPE = "application/vnd.avatar-release.gate-frames.v1.npy+zstd"
RESULT_MEDIA_TYPE = "application/vnd.avatar-release.gate-result.v1+json"


class EnvironmentRecord(Record):
    """Where the gate ran. Outputs are only compared between equal fingerprints."""

    fingerprint: str  # sha256 over the other fields
    backend: str
    platform_version: str
    device_kind: str
    device_count: int
    jax: str
    jaxlib: str
    cpu_features: list[str] | None = None


class GateRequestRecord(Record):
    name: str
    image_variant: int
    audio_variant: int
    seed: int
    frames: int
    buckets: list[str]  # the bucket of each chunk, in order


class GateSetRecord(Record):
    name: str
    version: int
    digest: str  # over the spec and the bytes of every input
    requests: list[GateRequestRecord]

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.requests)


class BaselineRef(Record):
    build_id: str
    digest: str
    gate_result_digest: str


class GateEvidence(Record):
    name: Literal["zero-recompile", "twin-baseline", "bit-exact", "similarity-band"]
    status: Literal["passed", "failed", "below-band", "skipped"]
    summary: str
    details: dict[str, Any] = {}


class GateResult(Record):
    kind: Literal["avatar-release/gate-result"] = "avatar-release/gate-result"
    schema_version: int = GATE_SCHEMA_VERSION
    status: Literal["passed", "failed", "needs-review"]
    build_id: str
    build_digest: str
    pipeline: str
    target: str
    baseline: BaselineRef | None
    tier: Literal[1, 2] | None  # None without a baseline
    tier_reasons: list[str] = []
    band: dict[str, Any] | None = None  # the band used: path, digest, floor, ceiling
    environment: EnvironmentRecord
    tool: dict[str, str]
    gate_set: GateSetRecord
    gates: list[GateEvidence]
    frame_sha256: list[list[str]]  # per request, per delivered frame (the first twin)
    frames_blob: BlobRef  # every delivered frame, (N, H, W, 3) uint8 .npy, zstd
    seconds: dict[str, float] = {}
    created_at: str
    created_by: str

    def gate(self, name: str) -> GateEvidence | None:
        return next((g for g in self.gates if g.name == name), None)


class ReviewAnswer(Record):
    pair: int  # index into ReviewRecord.frames
    choice: Literal["left", "right", "same"]  # which side looks better, or no visible difference
    preferred: Literal["baseline", "candidate", "same"]  # resolved by the server, never shown
    at: str


class ReviewDecision(Record):
    decision: Literal["approved", "rejected"]
    reviewer: str
    note: str
    at: str


class ReviewRecord(Record):
    """A blind frame-by-frame review of a build whose output fell below the band."""

    kind: Literal["avatar-release/review"] = "avatar-release/review"
    schema_version: int = GATE_SCHEMA_VERSION
    build_id: str
    build_digest: str
    gate_result_digest: str
    baseline_digest: str
    seed: int  # drew the left/right order
    frames: list[int]  # global frame indices under review
    candidate_left: list[bool]  # per pair: is the candidate on the left?
    answers: list[ReviewAnswer] = []
    decision: ReviewDecision | None = None
    created_at: str

    @property
    def complete(self) -> bool:
        return {a.pair for a in self.answers} >= set(range(len(self.frames)))


class BandVariant(Record):
    overrides: dict[str, str]
    build_id: str
    min_psnr_db: float | None  # None: every frame identical
    median_psnr_db: float | None
    max_abs_diff: int
    identical_frames: int
    frames: int


class Band(Record):
    """How far a reduction-order change may move the output: measured, with its provenance."""

    kind: Literal["avatar-release/band"] = "avatar-release/band"
    schema_version: int = GATE_SCHEMA_VERSION
    pipeline: str
    target: str
    psnr_floor_db: float = Field(description="every frame of a tier-2 candidate must reach this PSNR")
    max_abs_diff_ceiling: int = Field(description="no pixel may move more than this many levels")
    margin_db: float  # subtracted from the lowest measured PSNR
    reference_build: str
    reference_digest: str
    variants: list[BandVariant]
    gate_set: GateSetRecord
    environment: EnvironmentRecord
    tool: dict[str, str]
    measured_at: str
    method: str


class CompileCheck(Record):
    name: Literal["every-bucket", "flags-present", "fits-memory", "no-host-callbacks", "reproducible"]
    status: Literal["passed", "failed", "skipped"]
    summary: str
    details: dict[str, Any] = {}


class CompileGateResult(Record):
    """What can be proven about a build without its hardware: at compile time, on any host.

    Never enough to promote past dev: the output gates (twin baseline, bit-exact, band) need a
    run on matching hardware, and the promotion policy reads only their results.
    """

    kind: Literal["avatar-release/compile-gate"] = "avatar-release/compile-gate"
    schema_version: int = GATE_SCHEMA_VERSION
    status: Literal["passed", "failed"]
    build_id: str
    build_digest: str
    pipeline: str
    target: str
    checks: list[CompileCheck]
    host: dict[str, str]  # where the checks ran (backend, jaxlib, hostname)
    seconds: float
    created_at: str
    created_by: str
