"""Gate records: the result a gate stores with a build, the similarity band, the compile gate.

Changelogs (each kind versioned on its own):
  * ``avatar-release/gate-result`` (``GATE_RESULT_SCHEMA_VERSION``): 1 (2026-11-29) first version;
    optional ``target_spec_digest`` added 2026-12-01 (the digest of the target spec the gate ran
    under; absent in older results, which the policy still reads).
    2 (2026-12-05): ``band_digest`` (the band file a tier-2 verdict was judged against, the same
    digest as ``band.digest``) and ``levers_digest`` (the ``manifests/levers.toml`` that decided the
    tier, whenever a baseline was compared): with ``target_spec_digest``, every project file that
    decided the verdict, named inside the signed evidence so a trust policy's ``[gate_inputs]`` can
    pin them. Version-1 results are still read (both absent: None).
  * ``avatar-release/band`` (``BAND_SCHEMA_VERSION``): 1 (2026-11-29) first version.
    2 (2026-12-05): ``metric``: ``psnr`` (video frames, as every version-1 band, which is still
    read as one) or ``snr`` (an audio or tensors build's delivered chunks: SNR in dB, the floor in
    ``psnr_floor_db``); ``max_abs_diff_ceiling`` may be a float (the samples' or values' largest
    difference).
  * ``avatar-release/compile-gate`` (``COMPILE_GATE_SCHEMA_VERSION``): 1 (2026-11-29) first version.
  * ``avatar-release/gate-shard`` (``GATE_SHARD_SCHEMA_VERSION``): 1 (2026-12-02) first version: the
    partial evidence of one shard of a gate set (one or both twin runs of its slice, where each ran).

Typed evidence (2026-12-02, no format change): each gate's ``GateEvidence.details`` and
``GateResult.band`` stay the JSON objects they always were (same bytes, same schema); the models
below (``ZeroRecompileDetails`` ... ``BandUsed``) are typed views of them, read through
``GateResult.evidence(kind)`` / ``GateEvidence.details_as(kind)`` / ``GateResult.band_used()`` and
written through ``GateEvidence.with_details``. A field absent from older evidence reads as None
(absent is not empty: no ``frames_below`` is not "no frame below the band").
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from ..errors import IntegrityError
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
    "GateDetails",
    "FrameDifference",
    "ZeroRecompileDetails",
    "TwinBaselineDetails",
    "BitExactDetails",
    "SimilarityBandDetails",
    "BandUsed",
    "BandVariant",
    "Band",
    "CompileCheck",
    "CompileGateResult",
    "GateShardRun",
    "GateShard",
]

GATE_RESULT_SCHEMA_VERSION = 2
BAND_SCHEMA_VERSION = 2
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


def _invalid(where: str, e: ValidationError) -> IntegrityError:
    first = e.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return IntegrityError(f"{where}: {loc}: {first['msg']} ({e.error_count()} error(s))")


class _View(Record):
    # A view of evidence read from signed records: no coercion ("3" is not frame 3).
    model_config = ConfigDict(strict=True)


class GateDetails(_View):
    """The typed view of one gate's ``GateEvidence.details``; ``gate`` names the gate it describes.

    Every field is optional: which ones a gate writes depends on its verdict (a passing
    zero-recompile lists its runs, a failing one its compiles), and None means "not in this
    evidence"."""

    gate: ClassVar[str]


_D = TypeVar("_D", bound=GateDetails)


class FrameDifference(_View):
    """One frame that differs from the other side (the other twin, or the baseline), and by how much."""

    frame: int  # global index, in gate-set order
    label: str  # 'image0-audio1 frame 7'
    # None: the other side's frames were not at hand (a float for an audio or tensors build's chunk)
    max_abs_diff: int | float | None = None
    psnr_db: float | None = None  # None: not measured, or infinite (identical); SNR for a delivered chunk


class ZeroRecompileDetails(GateDetails):
    gate: ClassVar[str] = "zero-recompile"

    runs: list[str] | None = None  # passed: every fresh-process run, by label
    compiles: int | None = None  # failed: XLA compiles while serving, over all runs
    events: list[dict[str, Any]] | None = None  # failed: the first 64 compiles (run, during, seconds, ...)
    imports: list[str] | None = None  # heavy modules (torch, the compile stack) any serving process imported
    hosts: dict[str, str] | None = None  # where each process ran, by label (since 2026-12-01)
    partials: dict[str, str] | None = None  # a merged sharded gate: the signed partial behind each process


class TwinBaselineDetails(GateDetails):
    gate: ClassVar[str] = "twin-baseline"

    differing_frames: int | None = None
    first: FrameDifference | None = None  # the first frame the twins differ on
    # The differing frames (the first 64); when the twins delivered different counts, the two counts.
    frames: list[int] | None = None


class BitExactDetails(GateDetails):
    gate: ClassVar[str] = "bit-exact"

    differing_frames: int | None = None  # frames, or delivered chunks for an audio or tensors build
    worst_max_abs_diff: int | float | None = None
    lowest_psnr_db: float | None = None
    frames: list[FrameDifference] | None = None  # the first 64 frames that differ from the baseline


class SimilarityBandDetails(GateDetails):
    gate: ClassVar[str] = "similarity-band"

    psnr_floor_db: float | None = None  # the band's floor: PSNR, or SNR (band metric snr: audio, tensors)
    max_abs_diff_ceiling: int | float | None = None
    min_psnr_db: float | None = None  # None: every frame identical
    median_psnr_db: float | None = None
    max_abs_diff: int | float | None = None
    per_frame_psnr_db: list[float | None] | None = None  # every frame, gate-set order (None: identical)
    frames_below: list[int] | None = None  # the frames outside the band: what a blind review shows


class BandUsed(_View):
    """The band a tier-2 gate judged by (``GateResult.band``): which file, its limits, its provenance."""

    path: str
    digest: str
    psnr_floor_db: float
    max_abs_diff_ceiling: int | float
    measured_at: str
    environment: str  # fingerprint of the machine the band was measured on


class GateEvidence(Record):
    name: Literal["zero-recompile", "twin-baseline", "bit-exact", "similarity-band"]
    status: Literal["passed", "failed", "below-band", "skipped"]
    summary: str
    details: dict[str, Any] = {}  # read it typed: ``details_as(kind)``

    def details_as(self, kind: type[_D]) -> _D:
        """``details`` as ``kind``; an IntegrityError when they do not fit it (a malformed record)."""
        if kind.gate != self.name:
            raise TypeError(f"{self.name} evidence read as {kind.__name__}, the {kind.gate} gate's")
        try:
            return kind.model_validate(self.details)
        except ValidationError as e:
            raise _invalid(f"{self.name} evidence", e) from None

    def with_details(self, more: GateDetails) -> GateEvidence:
        """A copy with the fields set in ``more`` added to (or replacing) ``details``, checked as a whole."""
        details = {**self.details, **more.model_dump(mode="json", exclude_unset=True)}
        updated = self.model_copy(update={"details": details})
        updated.details_as(type(more))  # the whole must still fit the gate's model
        return updated


class GateResult(Record):
    kind: Literal["avatar-release/gate-result"] = "avatar-release/gate-result"
    schema_version: int = GATE_RESULT_SCHEMA_VERSION
    status: Literal["passed", "failed", "needs-review"]
    build_id: str
    build_digest: str
    pipeline: str
    target: str
    target_spec_digest: str | None = None  # the target spec in force at the gate (TargetSpec.digest())
    band_digest: str | None = None  # v2: the band file judged by (tier 2; None: no band decided)
    levers_digest: str | None = None  # v2: the levers.toml that decided the tier (None: no baseline)
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

    _digests = check_digest_fields("target_spec_digest", "band_digest", "levers_digest")

    def gate(self, name: str) -> GateEvidence | None:
        return next((g for g in self.gates if g.name == name), None)

    def evidence(self, kind: type[_D]) -> _D | None:
        """The typed evidence of the gate ``kind`` describes; None when that gate is not in this result."""
        g = self.gate(kind.gate)
        return None if g is None else g.details_as(kind)

    def band_used(self) -> BandUsed | None:
        """``band``, typed; None without one (tier 1, or no baseline)."""
        if self.band is None:
            return None
        try:
            return BandUsed.model_validate(self.band)
        except ValidationError as e:
            raise _invalid("gate result band", e) from None

    def band_judged_by(self) -> str | None:
        """The digest of the band this verdict was judged against: ``band_digest``, or in a version-1
        result the one inside ``band``; None without a band (tier 1, or no baseline)."""
        if self.band_digest is not None:
            return self.band_digest
        used = self.band_used()
        return used.digest if used is not None else None


class BandVariant(Record):
    overrides: dict[str, str]
    build_id: str
    min_psnr_db: float | None  # None: every frame identical (band metric snr: SNR of the delivered chunks)
    median_psnr_db: float | None
    max_abs_diff: int | float
    identical_frames: int  # band metric snr: identical chunks (and ``frames``: chunks)
    frames: int


class Band(Record):
    """How far a reduction-order change may move the output: measured, with its provenance."""

    kind: Literal["avatar-release/band"] = "avatar-release/band"
    schema_version: int = BAND_SCHEMA_VERSION
    pipeline: str
    target: str
    psnr_floor_db: float = Field(
        description="every frame (or, metric snr, every delivered chunk) of a tier-2 "
        "candidate must reach this PSNR (or SNR) in dB"
    )
    max_abs_diff_ceiling: int | float = Field(
        description="no pixel may move more than this many levels (metric snr: no delivered value more than this)"
    )
    metric: Literal["psnr", "snr"] = Field(
        "psnr",
        description="psnr: video frames (every version-1 band); snr: an audio or tensors build's delivered chunks",
    )
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
