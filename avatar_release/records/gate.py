"""Gate records: the result a gate stores with a build, the similarity band, the compile gate.

Changelogs (each kind versioned on its own):
  * ``avatar-release/gate-result`` (``GATE_RESULT_SCHEMA_VERSION``): 1 (2026-11-29) first version;
    optional ``target_spec_digest`` added 2026-12-01 (the digest of the target spec the gate ran
    under; absent in older results, which the policy still reads).
  * ``avatar-release/band`` (``BAND_SCHEMA_VERSION``): 1 (2026-11-29) first version.
  * ``avatar-release/compile-gate`` (``COMPILE_GATE_SCHEMA_VERSION``): 1 (2026-11-29) first version.
  * ``avatar-release/gate-shard`` (``GATE_SHARD_SCHEMA_VERSION``): 1 (2026-12-02) first version: the
    partial evidence of one shard of a gate set (one or both twin runs of its slice, where each ran).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ._base import BlobRef, Record, check_digest_fields
from .build import EnvironmentRecord

__all__ = [
    "GATE_RESULT_SCHEMA_VERSION",
    "BAND_SCHEMA_VERSION",
    "COMPILE_GATE_SCHEMA_VERSION",
    "GATE_SHARD_SCHEMA_VERSION",
    "SHARD_MEDIA_TYPE",
    "FRAMES_MEDIA_TYPE",
    "RESULT_MEDIA_TYPE",
    "GateSetRecord",
    "GateRequestRecord",
    "BaselineRef",
    "GateEvidence",
    "GateResult",
    "BandVariant",
    "Band",
    "CompileCheck",
    "CompileGateResult",
    "GateShardRun",
    "GateShard",
]

GATE_RESULT_SCHEMA_VERSION = 1
BAND_SCHEMA_VERSION = 1
COMPILE_GATE_SCHEMA_VERSION = 1
GATE_SHARD_SCHEMA_VERSION = 1
FRAMES_MEDIA_TYPE = "application/vnd.avatar-release.gate-frames.v1.npy+zstd"
RESULT_MEDIA_TYPE = "application/vnd.avatar-release.gate-result.v1+json"
SHARD_MEDIA_TYPE = "application/vnd.avatar-release.gate-shard.v1+json"


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

    _digests = check_digest_fields("digest", "gate_result_digest")


class GateEvidence(Record):
    name: Literal["zero-recompile", "twin-baseline", "bit-exact", "similarity-band"]
    status: Literal["passed", "failed", "below-band", "skipped"]
    summary: str
    details: dict[str, Any] = {}


class GateResult(Record):
    kind: Literal["avatar-release/gate-result"] = "avatar-release/gate-result"
    schema_version: int = GATE_RESULT_SCHEMA_VERSION
    status: Literal["passed", "failed", "needs-review"]
    build_id: str
    build_digest: str
    pipeline: str
    target: str
    target_spec_digest: str | None = None  # the target spec in force at the gate (TargetSpec.digest())
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
    schema_version: int = BAND_SCHEMA_VERSION
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
    schema_version: int = COMPILE_GATE_SCHEMA_VERSION
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


class GateShardRun(Record):
    """One fresh-process run of a shard's slice: what it rendered and counted, and where."""

    twin: Literal[1, 2]
    host: str  # where it ran (hostname; a Job's pod name)
    environment: EnvironmentRecord
    frame_sha256: list[list[str]]  # per request of the slice, per delivered frame
    frames_blob: BlobRef  # the slice's delivered frames, (n, H, W, 3) uint8 .npy, zstd
    compiles: int
    compile_events: list[dict[str, Any]] = []
    heavy_modules: list[str] = []
    wall_seconds: float


class GateShard(Record):
    """Partial gate evidence: shard ``index`` of ``count`` of a gate set, merged by ``gate merge``.

    Requests are dealt round-robin (request i goes to shard i mod count), so every shard gets
    work while count <= the number of requests; ``requests`` names the slice, in gate-set order.
    """

    kind: Literal["avatar-release/gate-shard"] = "avatar-release/gate-shard"
    schema_version: int = GATE_SHARD_SCHEMA_VERSION
    build_id: str
    build_digest: str
    pipeline: str
    target: str
    run_id: str | None = None  # groups the shards of one CI run (merge picks them by it)
    index: int = Field(ge=0, description="0-based shard index (a Kubernetes Job's JOB_COMPLETION_INDEX)")
    count: int = Field(ge=1)
    gate_set: GateSetRecord  # the whole set, so every shard can be checked against the others
    requests: list[str]  # the names of this shard's requests, in gate-set order
    runs: list[GateShardRun]  # twin 1, twin 2, or both
    tool: dict[str, str]
    created_at: str
    created_by: str
