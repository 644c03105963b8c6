"""Step 4 of a build: compiled stages -> zstd blobs + one sealed manifest, nothing written yet.

The memory fit is checked here, before anything is published: a build that does not fit its
device is refused with the numbers (DoesNotFit) and leaves the registry untouched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import zstandard

from .._digest import canonical_json, sha256_digest
from .._dtypes import itemsize
from ..errors import DoesNotFit
from ..machine import toolchain, who
from ..records import (
    BUILD_SCHEMA_VERSION,
    AutotuneRecord,
    BlobRef,
    Bucket,
    ChunkProgram,
    DeliveryRecord,
    ExecutableEntry,
    FlagProfileRecord,
    GateRequestsRecord,
    KernelRouteRecord,
    LeverRecord,
    Manifest,
    MemoryFit,
    RequestInputRecord,
    WeightsRecord,
    build_id_for,
    identity_digest,
    identity_flags,
    manifest_seal,
    utcnow,
)
from ..specs import TargetSpec
from ._autotune import RESULTS_MEDIA_TYPE, AutotunePlan, autotune_record
from ._evidence import memory_fit
from ._plan import ABSTRACT_WEIGHTS, BuildPlan
from ._stage import CompiledStage
from ._weights import WEIGHT_CHUNKING, chunk_table_digest, pack_chunks

__all__ = [
    "EXECUTABLE_MEDIA_TYPE",
    "NOISE_RECIPES",
    "ExecutableReport",
    "Package",
    "package_build",
]

EXECUTABLE_MEDIA_TYPE = "application/vnd.avatar-release.executable.v1+zstd"
ZSTD_LEVEL = 9
# Weights compress about as well at level 3 as at 9 (bf16 ~N(0, 0.02), 64 MiB: 0.780 vs 0.771 of
# the raw bytes) in a fifth of the time (0.40 s vs 1.98 s on one core, measured 2026-12-02); at
# 37 GB that is minutes of compile. Decompression speed does not depend on the level.
WEIGHTS_ZSTD_LEVEL = 3
NOISE_RECIPES = {"seeded": "numpy-pcg64-standard-normal/v1", "entropy": "os-entropy-standard-normal/v1"}


@dataclass
class ExecutableReport:
    key: str
    raw_size: int
    compressed_size: int
    trace_seconds: float
    lower_seconds: float
    compile_seconds: float


@dataclass
class Package:
    manifest: Manifest  # sealed
    blobs: dict[str, bytes]  # digest -> zstd bytes: the weights (unless abstract) and every executable
    reports: list[ExecutableReport]  # one per executable, in stage x bucket order


def package_build(
    plan: BuildPlan,
    compiled: list[CompiledStage],
    progress: Callable[[str], None],
    *,
    autotune: AutotunePlan | None = None,
    weight_compression: str = "none",
) -> Package:
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    blobs: dict[str, bytes] = {}
    weights = _weights_record(plan, blobs, weight_compression)
    entries, reports = [], []
    packed: dict[int, bytes] = {}  # a program shared across buckets (_share.py: one payload) is compressed once
    for cs in compiled:
        z = packed.get(id(cs.payload))
        if z is None:
            z = packed[id(cs.payload)] = cctx.compress(cs.payload)
        entry = _executable_entry(cs, z, plan.executable_format)
        blobs[entry.blob.digest] = z
        entries.append(entry)
        p, ev = cs.plan, cs.evidence
        reports.append(
            ExecutableReport(
                p.stage + "/" + p.bucket,
                len(cs.payload),
                len(z),
                round(ev.trace_seconds, 3),
                round(ev.lower_seconds, 3),
                round(ev.compile_seconds, 3),
            )
        )
    fit = _check_fit(plan, entries, progress)
    tuned = _autotune(plan, compiled, autotune, cctx, blobs)
    return Package(_manifest(plan, weights, entries, fit, tuned), blobs, reports)


def _weights_record(plan: BuildPlan, blobs: dict[str, bytes], compression: str) -> WeightsRecord:
    """v8: the weights as tensor-aligned chunks, each digested (sha256 and BLAKE3) and stored
    (raw, or zstd-compressed) on its own."""
    if plan.abstract:
        return _abstract_weights(plan)
    chunks, chunk_blobs = pack_chunks(plan.weight_tensors or [], level=WEIGHTS_ZSTD_LEVEL, compression=compression)
    blobs.update(chunk_blobs)
    return WeightsRecord(
        blob=None,
        raw_size=sum(c.raw_size for c in chunks),
        raw_digest=chunk_table_digest(chunks, compression),
        tensors=plan.weights_tensors,
        source=plan.weights_label,
        chunks=chunks,
        chunking=WEIGHT_CHUNKING,
        compression=compression,
    )


def _abstract_weights(plan: BuildPlan) -> WeightsRecord:
    """What an abstract build records for weights it never materialised: their shapes, by digest."""
    params = {p.name: p for sp in plan.stages for p in sp.params}  # buckets of a stage share its weights
    shapes = [(k, list(p.shape), p.dtype) for k, p in sorted(params.items())]
    size = sum(math.prod(shape) * itemsize(dtype) for _, shape, dtype in shapes)
    return WeightsRecord(
        blob=None,
        raw_size=size,
        raw_digest=sha256_digest(canonical_json(shapes)),
        tensors=len(shapes),
        source=ABSTRACT_WEIGHTS,
        materialized=False,
    )


def _executable_entry(cs: CompiledStage, z: bytes, executable_format: str) -> ExecutableEntry:
    """The manifest's entry: the stage's slot, its blob, and its compile evidence as compiled."""
    p = cs.plan
    return ExecutableEntry(
        key=f"{p.stage}/{p.bucket}",
        stage=p.stage,
        bucket=p.bucket,
        format=executable_format,
        blob=BlobRef(digest=sha256_digest(z), size=len(z), media_type=EXECUTABLE_MEDIA_TYPE),
        raw_size=len(cs.payload),
        raw_digest=sha256_digest(cs.payload),
        params=p.params,
        inputs=p.inputs,
        outputs=p.outputs,
        **dict(cs.evidence),  # every CompileEvidence field, as compile_stage set it
    )


def _check_fit(plan: BuildPlan, entries: list[ExecutableEntry], progress: Callable[[str], None]) -> MemoryFit | None:
    """None when the target declares no per-device capacity; DoesNotFit when over it."""
    tgt = plan.target
    if not tgt.hbm_bytes_per_device:
        return None
    fit = memory_fit(entries, tgt.hbm_bytes_per_device, tgt.device_count, tgt.weight_sharding)
    progress(
        f"memory per device: {_gib(fit.total_bytes)} of {_gib(fit.capacity_bytes)} "
        f"(weights {_gib(fit.weights_bytes)}, {tgt.weight_sharding}; "
        f"peak working set {_gib(fit.peak_working_bytes)} in {fit.peak_stage})"
    )
    if not fit.fits:
        replaced = [
            f"{sp.stage} {r.kernel}: {r.requested} was asked for, {r.used} runs ({r.reason})"
            for sp in plan.stages
            for r in sp.routes.values()
            if r.used != r.requested and r.reason
        ]
        raise DoesNotFit(_does_not_fit(plan.spec.name, tgt, fit, entries, sorted(set(replaced))), fit)
    return fit


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.2f} MiB"


def _does_not_fit(
    pipeline: str, tgt: TargetSpec, fit: MemoryFit, entries: list[ExecutableEntry], replaced: list[str] | None = None
) -> str:
    peak = next(e for e in entries if e.key == fit.peak_stage)
    m = peak.memory
    parts = ", ".join(f"{k.removesuffix('_size')} {_gib(v)}" for k, v in m.items() if v)
    fixes = []
    if tgt.weight_sharding != "fsdp":
        fixes.append('shard the weights (a target with weight_sharding = "fsdp")')
    fixes += ["a smaller bucket (fewer frames per chunk)"]
    if replaced:  # the pipeline asked for a kernel this target cannot compile (its kernel_routes)
        fixes.append(f"a kernel for {tgt.platform} where the pipeline routed around one: {'; '.join(replaced)}")
    else:
        fixes.append(
            "the frame-aligned attention kernel (--set attention_kernel=blocksparse) instead of dense attention"
        )
    return (
        f"{pipeline} does not fit {tgt.name}: it needs {_gib(fit.total_bytes)} per device, the device has "
        f"{_gib(fit.capacity_bytes)} (over by {_gib(fit.total_bytes - fit.capacity_bytes)}). Resident weights "
        f"of all stages: {_gib(fit.weights_bytes)} ({fit.weight_sharding}); largest working set: "
        f"{_gib(fit.peak_working_bytes)} in {fit.peak_stage} (XLA memory_analysis: {parts}). "
        f"Nothing was published. Options: {'; '.join(fixes)}"
    )


def _manifest(
    plan: BuildPlan,
    weights: WeightsRecord,
    entries: list[ExecutableEntry],
    fit: MemoryFit | None,
    autotune: AutotuneRecord | None = None,
) -> Manifest:
    spec, tgt, config = plan.spec, plan.target, plan.config
    flags_rec = _flags_record(plan)
    tools = toolchain(with_compile_tools=True)
    config_doc = dataclasses.asdict(config)
    src = plan.source_digest
    program = _program(plan)
    # The identity: a hash over everything that changes the binary or its output (records/identity.py).
    identity = identity_digest(
        pipeline=spec.name,
        entry=spec.entry,
        config=config_doc,
        overrides=plan.overrides,
        source=src,
        weights=weights.raw_digest,
        target=tgt.name,
        flags=identity_flags(flags_rec, BUILD_SCHEMA_VERSION),
        jax=tools.jax,
        jaxlib=tools.jaxlib,
        platform=plan.platform.model_dump(mode="json"),
        executables=[(e.key, e.format, e.hlo_digest, e.fingerprint) for e in entries],
        noise=NOISE_RECIPES[spec.noise],
        autotune_results=autotune.results if autotune else None,
    )
    manifest = Manifest(
        build_id=build_id_for(spec.name, tgt.name, identity),
        identity=identity,
        created_at=utcnow(),
        created_by=who(),
        pipeline=spec.name,
        model_entry=spec.entry,
        config=config_doc,
        overrides=plan.overrides,
        source_digest=src,
        weights=weights,
        target=tgt.name,
        flags=flags_rec,
        toolchain=tools,
        platform=plan.platform,
        buckets=_buckets(plan, program),
        program=program,
        executables=entries,
        memory_fit=fit,
        levers={k: LeverRecord(effect=v.effect, note=v.note) for k, v in sorted(plan.pipeline.levers.items())},
        gate_requests=_gate_requests(plan),
        autotune=autotune,
        kernel_routes=_kernel_routes(plan),
    )
    return manifest.model_copy(update={"seal": manifest_seal(manifest)})


def _flags_record(plan: BuildPlan) -> FlagProfileRecord:
    """The target's flag profile as the manifest records it."""
    flags = plan.flags
    return FlagProfileRecord(
        name=flags.name,
        version=flags.version,
        compiler_options=dict(flags.compiler_options),
        env_flags=list(flags.env_flags),
        kernel_flags=dict(flags.kernel_flags),
        digest=flags.digest(),
    )


def _buckets(plan: BuildPlan, program: ChunkProgram) -> list[Bucket]:
    """One per spec bucket; height x width: the delivered video's, 1 x 1 for audio or tensors (the
    fields must be positive)."""
    return [
        Bucket(name=b.name, frames=b.frames, height=max(program.height, 1), width=max(program.width, 1))
        for b in plan.spec.buckets
    ]


def _gate_requests(plan: BuildPlan) -> GateRequestsRecord:
    """The requests the gates render: the pipeline's declaration, each field the spec's [gate]
    table sets replaced by the spec's."""
    d, table = plan.pipeline.gate_requests, plan.spec.gate
    given = table.model_dump(exclude_none=True, exclude={"schema_version"}) if table else {}
    return GateRequestsRecord(**{"images": list(d.images), "audio": list(d.audio), "seed": d.seed, **given})


def _autotune(
    plan: BuildPlan,
    compiled: list[CompiledStage],
    autotune: AutotunePlan | None,
    cctx: zstandard.ZstdCompressor,
    blobs: dict[str, bytes],
) -> AutotuneRecord | None:
    """GPU builds: what XLA:GPU chose without measuring (compile/_autotune.py), and the autotune
    results the compile loaded, kept as a blob; None elsewhere."""
    if plan.target.platform != "gpu" or plan.executable_format != "xla-executable":
        return None
    hlos = {f"{cs.plan.stage}/{cs.plan.bucket}": cs.compiled.as_text() or "" for cs in compiled}
    options = {**plan.flags.compiler_options, **(autotune.compiler_options() if autotune else {})}
    results, ref = autotune.results if autotune else None, None
    if results is not None:
        z = cctx.compress(results.text)
        blobs[sha256_digest(z)] = z
        ref = BlobRef(digest=sha256_digest(z), size=len(z), media_type=RESULTS_MEDIA_TYPE)
    return autotune_record(
        hlos,
        options,
        deviceless=plan.platform.platform_version.startswith("topology:"),
        results=results,
        results_blob=ref,
    )


def _kernel_routes(plan: BuildPlan) -> dict[str, list[KernelRouteRecord]] | None:
    """What the pipeline declared while tracing, by stage (None: it declared nothing)."""
    routes = {}
    for sp in plan.stages:  # buckets of a stage share one declaration
        if sp.routes and sp.stage not in routes:
            routes[sp.stage] = [
                KernelRouteRecord(
                    kernel=r.kernel,
                    requested=r.requested,
                    used=r.used,
                    reason=r.reason,
                    program_kernel=r.program_kernel,
                    estimate=dict(r.estimate) if r.estimate else None,
                )
                for _, r in sorted(sp.routes.items())
            ]
    return routes or None


def _program(plan: BuildPlan) -> ChunkProgram:
    prog = plan.program
    image, audio, noise = prog.of_kind("image"), prog.of_kind("audio"), prog.of_kind("noise")
    d = prog.delivers
    talking_head = [(i.kind, i.required) for i in prog.inputs] == [
        ("image", True),
        ("audio", True),
        ("noise", False),
    ] and d.kind == "video"
    # The sizes the runtime works at: the video's (else the picture's) and the audio's (in or out).
    height, width = (d.height, d.width) if d.kind == "video" else (image.shape[0], image.shape[1]) if image else (0, 0)
    sample_rate, spf = (
        (audio.sample_rate, audio.samples_per_frame)
        if audio
        else (d.sample_rate, d.samples_per_frame)
        if d.kind == "audio"
        else (0, 0)
    )
    return ChunkProgram(
        stages=list(plan.pipeline.stages),
        image_input=image.name if image else None,
        audio_input=audio.name if audio else None,
        noise_input=noise.name if noise else None,
        carry=dict(prog.carry),
        deliver=d.outputs[0],
        noise_recipe=NOISE_RECIPES[plan.spec.noise],
        fps=prog.fps,
        sample_rate=sample_rate,
        samples_per_frame=spf,
        height=height,
        width=width,
        # A talking head's manifest stays as it was (records/build.py): its declaration is derived.
        inputs=None
        if talking_head
        else [
            RequestInputRecord(
                name=i.name,
                kind=i.kind,
                required=i.required,
                shape=list(i.shape),
                dtype=i.dtype,
                sample_rate=i.sample_rate,
                samples_per_frame=i.samples_per_frame,
            )
            for i in prog.inputs
        ],
        delivers=None
        if talking_head
        else DeliveryRecord(
            kind=d.kind, outputs=list(d.outputs), sample_rate=d.sample_rate, samples_per_frame=d.samples_per_frame
        ),
    )
