"""spec + target -> trace (torchax) -> lower -> compile (flag profile) -> serialize + zstd
-> one immutable, content-addressed build in a registry."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import importlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import zstandard

from .._digest import canonical_json, sha256_digest
from .._dtypes import dtype_name
from ..machine import configure_compile_env, current_platform, toolchain, who
from ..errors import DoesNotFit, InputError
from ..records import (
    ArraySpec,
    BlobRef,
    Bucket,
    ChunkProgram,
    ExecutableEntry,
    FlagProfileRecord,
    Manifest,
    WeightsRecord,
    utcnow,
)
from ..registry import Registry
from ..specs import PipelineSpec, load_flag_profile, load_pipeline, load_target
from ._devices import make_mesh, target_devices
from ..identity import build_id_for, identity_digest, manifest_seal
from ._attention import AttentionRoute
from ._overrides import apply_overrides
from ._evidence import memory_fit
from ._trace import stage_function
from ._stage import CompiledStage, LoweredStage, StagePlan, compile_stage, fsdp_spec, lower_stage

__all__ = ["CompileResult", "compile_build", "source_digest", "EXECUTABLE_MEDIA_TYPE", "WEIGHTS_MEDIA_TYPE"]

EXECUTABLE_MEDIA_TYPE = "application/vnd.avatar-release.executable.v1+zstd"
WEIGHTS_MEDIA_TYPE = "application/vnd.avatar-release.weights.safetensors.v1+zstd"
ZSTD_LEVEL = 9
ABSTRACT_WEIGHTS = "abstract: shapes only, never materialised"
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ExecutableReport:
    key: str
    raw_size: int
    compressed_size: int
    trace_seconds: float
    lower_seconds: float
    compile_seconds: float


@dataclass
class CompileResult:
    build_id: str
    digest: str
    created: bool
    registry: str
    pipeline: str
    target: str
    executables: list[ExecutableReport] = field(default_factory=list)
    wall_seconds: float = 0.0
    compile_wall_seconds: float = 0.0
    manifest: Manifest | None = None
    # In-process compiled objects and raw weights, only with keep_compiled=True (benchmarks:
    # the JIT path runs exactly these programs without a serialize/deserialize round trip).
    compiled: dict[str, Any] | None = None
    weights_raw: bytes | None = None

    def to_json(self) -> dict:
        return {
            "build_id": self.build_id,
            "digest": self.digest,
            "created": self.created,
            "registry": self.registry,
            "pipeline": self.pipeline,
            "target": self.target,
            "wall_seconds": round(self.wall_seconds, 3),
            "compile_wall_seconds": round(self.compile_wall_seconds, 3),
            "executables": [dataclasses.asdict(e) for e in self.executables],
        }


def source_digest() -> str:
    """Digest of the model and kernel source that produced the executables."""
    h = hashlib.sha256()
    for folder in ("model", "kernels"):
        for p in sorted((_ROOT / folder).rglob("*.py")):
            h.update(str(p.relative_to(_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def _load_model(spec: PipelineSpec, overrides: dict[str, str], weights_path: str | None):
    from model.config import get_config

    try:
        config = get_config(spec.config)
    except (KeyError, ValueError) as e:
        raise InputError(f"pipeline {spec.name}: model config {spec.config!r}: {e}") from None
    config, applied = apply_overrides(config, overrides)
    module_name, _, attr = spec.entry.partition(":")
    try:
        importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(f"pipeline {spec.name}: entry point {spec.entry!r} cannot be imported ({e})") from None
    from model import weights as W
    from model.errors import WeightsError

    if spec.weights.source == "abstract" and weights_path is None:
        # Shapes only: the module lives on the meta device and no value is ever computed.
        import torch

        from model.pipeline import AvatarPipeline

        with torch.device("meta"):
            pipe = AvatarPipeline(config)
        return config, applied, pipe, ABSTRACT_WEIGHTS
    source = weights_path or (None if spec.weights.source == "init" else spec.weights.source)
    try:
        if source is None:
            pipe = W.init_pipeline(config, spec.weights.seed)
            label = f"init:seed={spec.weights.seed}"
        else:
            pipe = W.load_weights(config, source)
            label = str(Path(source).absolute())
    except WeightsError as e:
        raise InputError(str(e)) from None
    return config, applied, pipe, label


def _weights_bytes(pipe) -> tuple[bytes, int]:
    from safetensors.torch import save

    state = {k: v.detach().contiguous() for k, v in pipe.state_dict().items()}
    return save(state), len(state)


def _abstract_weights(pipe) -> WeightsRecord:
    """What an abstract build records for weights it never materialised: their shapes, by digest."""
    from .._dtypes import itemsize

    shapes = [(k, list(v.shape), dtype_name(v.dtype)) for k, v in sorted(pipe.state_dict().items())]
    size = sum(math.prod(shape) * itemsize(dtype) for _, shape, dtype in shapes)
    return WeightsRecord(blob=None, raw_size=size, raw_digest=sha256_digest(canonical_json(shapes)),
                         tensors=len(shapes), source=ABSTRACT_WEIGHTS, materialized=False)



def _plans(config, pipe, spec: PipelineSpec, axis: str, size: int, *, weight_sharding: str = "fsdp",
           route: AttentionRoute) -> list[StagePlan]:
    def weight_spec(shape: tuple[int, ...]) -> list[str | None]:
        return fsdp_spec(shape, axis, size) if weight_sharding == "fsdp" else [None] * len(shape)

    from model import pipeline as P

    plans = []
    for stage in P.STAGES:
        module = getattr(pipe, stage)
        states, jax_func = stage_function(module)
        keys = sorted(states)
        params = [
            ArraySpec(
                name=f"{stage}.{k}",
                shape=list(states[k][0]),
                dtype=dtype_name(states[k][1]),
                sharding=weight_spec(tuple(states[k][0])),
            )
            for k in keys
        ]
        for b in spec.buckets:
            ins = P.stage_inputs(config, b.frames)[stage]
            outs = P.stage_outputs(config, b.frames)[stage]
            # Activations cross stage boundaries sharded by the same shape rule as weights
            # (leading dim over the mesh axis when it divides): one stage's outputs are then
            # exactly the next stage's inputs, so serving never needs a resharding program,
            # and each device works on its slice instead of all of it.
            plans.append(
                StagePlan(
                    stage=stage,
                    bucket=b.name,
                    jax_func=jax_func,
                    params=params,
                    param_keys=keys,
                    inputs=[ArraySpec(name=n, shape=list(s), dtype=d, sharding=fsdp_spec(s, axis, size))
                            for n, s, d in ins],
                    outputs=[ArraySpec(name=n, shape=list(s), dtype=d, sharding=fsdp_spec(s, axis, size))
                             for n, s, d in outs],
                    attention=route,
                )
            )
    return plans


NOISE_RECIPES = {"seeded": "numpy-pcg64-standard-normal/v1", "entropy": "os-entropy-standard-normal/v1"}


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.2f} MiB"


def _does_not_fit(pipeline: str, tgt, fit, entries) -> str:
    peak = next(e for e in entries if e.key == fit.peak_stage)
    m = peak.memory
    parts = ", ".join(f"{k.removesuffix('_size')} {_gib(v)}" for k, v in m.items() if v)
    fixes = []
    if tgt.weight_sharding != "fsdp":
        fixes.append("shard the weights (a target with weight_sharding = \"fsdp\")")
    fixes += ["a smaller bucket (fewer frames per chunk)",
              "the frame-aligned attention kernel (--set attention_kernel=blocksparse) instead of dense attention"]
    return (f"{pipeline} does not fit {tgt.name}: it needs {_gib(fit.total_bytes)} per device, the device has "
            f"{_gib(fit.capacity_bytes)} (over by {_gib(fit.total_bytes - fit.capacity_bytes)}). Resident weights "
            f"of all stages: {_gib(fit.weights_bytes)} ({fit.weight_sharding}); largest working set: "
            f"{_gib(fit.peak_working_bytes)} in {fit.peak_stage} (XLA memory_analysis: {parts}). "
            f"Nothing was published. Options: {'; '.join(fixes)}")


def _program(config, noise: str = "seeded") -> ChunkProgram:
    from model import pipeline as P

    prog = P.CHUNK_PROGRAM
    return ChunkProgram(
        stages=list(P.STAGES),
        image_input=prog["image"],
        audio_input=prog["audio"],
        noise_input=prog["noise"],
        carry=dict(prog["carry"]),
        deliver=prog["deliver"],
        noise_recipe=NOISE_RECIPES[noise],
        fps=config.fps,
        sample_rate=config.sample_rate,
        samples_per_frame=config.samples_per_frame,
        height=config.height,
        width=config.width,
    )


def compile_build(
    pipeline: str = "tiny",
    target: str = "cpu-8",
    *,
    registry: Registry,
    weights_path: str | None = None,
    overrides: dict[str, str] | None = None,
    concurrent_compile: bool = True,
    publish: bool = True,
    keep_compiled: bool = False,
    executable_format: str = "xla-executable",
    move_dev: bool = True,
    progress: Callable[[str], None] = lambda msg: None,
) -> CompileResult:
    """Compile every stage x bucket of ``pipeline`` for ``target`` and publish one build.

    ``executable_format="jax-export"`` ships portable StableHLO instead of executables: the
    serving pod then compiles on first use, which the zero-recompile gate refuses.
    """
    if executable_format not in ("xla-executable", "jax-export"):
        raise InputError(f"--format {executable_format!r}: expected xla-executable or jax-export")
    t_start = time.perf_counter()
    spec = load_pipeline(pipeline)
    tgt = load_target(target)
    flags = load_flag_profile(tgt.flag_profile)
    if flags.platform != tgt.platform:
        raise InputError(
            f"target {tgt.name} ({tgt.platform}) names flag profile {flags.name}, which is for {flags.platform}"
        )
    if weights_path is not None and not Path(weights_path).is_file():
        raise InputError(f"--weights {weights_path}: no such file")

    if tgt.platform != "cpu":
        configure_compile_env(tgt)  # CPU device counts are the entry point's job (before JAX starts)
    devices = target_devices(tgt)
    mesh = make_mesh(devices, tgt)
    platform = current_platform(devices, tgt.mesh_axes, tgt.mesh_shape, tgt.topology)

    progress(f"loading model {spec.entry} ({spec.config})")
    config, applied, pipe, weights_label = _load_model(spec, overrides or {}, weights_path)
    abstract = weights_label == ABSTRACT_WEIGHTS
    weights_raw, n_tensors = (None, 0) if abstract else _weights_bytes(pipe)

    axis, size = tgt.mesh_axes[0], tgt.mesh_shape[0]
    route = AttentionRoute.from_config(config, platform=tgt.platform, kernel_flags=flags.kernel_flags)
    plans = _plans(config, pipe, spec, axis, size, weight_sharding=tgt.weight_sharding, route=route)
    lowered: list[LoweredStage] = []
    # Tracing runs Python (torchax dispatch), so it is serial. It runs in a worker thread
    # on purpose: XLA records the Python call stack in the program's debug locations, and
    # a fixed stack keeps the HLO (and so the build identity) independent of the caller.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as tracer:
        for plan in plans:
            ls = tracer.submit(lower_stage, plan, mesh, export=executable_format == "jax-export").result()
            progress(f"{plan.stage}/{plan.bucket}: traced {ls.trace_seconds:.2f}s, lowered {ls.lower_seconds:.2f}s")
            lowered.append(ls)

    t_compile = time.perf_counter()
    options = dict(flags.compiler_options)
    if concurrent_compile and len(lowered) > 1:
        # XLA compiles release the GIL: the stages compile side by side.
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(lowered)) as pool:
            futures = {pool.submit(compile_stage, ls, options): ls for ls in lowered}
            done: dict[int, CompiledStage] = {}
            for fut in concurrent.futures.as_completed(futures):
                cs = fut.result()
                done[id(futures[fut])] = cs
                progress(f"{cs.plan.stage}/{cs.plan.bucket}: compiled {cs.compile_seconds:.2f}s")
            compiled = [done[id(ls)] for ls in lowered]
    else:
        compiled = []
        for ls in lowered:
            cs = compile_stage(ls, options)
            progress(f"{cs.plan.stage}/{cs.plan.bucket}: compiled {cs.compile_seconds:.2f}s")
            compiled.append(cs)
    compile_wall = time.perf_counter() - t_compile

    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    blobs: dict[str, bytes] = {}
    if abstract:
        weights_rec = _abstract_weights(pipe)
    else:
        weights_z = cctx.compress(weights_raw)
        blobs[sha256_digest(weights_z)] = weights_z
        weights_rec = WeightsRecord(
            blob=BlobRef(digest=sha256_digest(weights_z), size=len(weights_z), media_type=WEIGHTS_MEDIA_TYPE),
            raw_size=len(weights_raw),
            raw_digest=sha256_digest(weights_raw),
            tensors=n_tensors,
            source=weights_label,
        )
    entries, reports = [], []
    for cs in compiled:
        z = cctx.compress(cs.payload)
        blobs[sha256_digest(z)] = z
        p = cs.plan
        entries.append(
            ExecutableEntry(
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
                in_tree=cs.in_tree,
                out_tree=cs.out_tree,
                hlo_digest=cs.hlo_digest,
                fingerprint=cs.fingerprint,
                trace_seconds=round(cs.trace_seconds, 4),
                lower_seconds=round(cs.lower_seconds, 4),
                compile_seconds=round(cs.compile_seconds, 4),
                cost=cs.cost,
                cost_loop_scale=round(cs.loop_scale, 6),
                memory=cs.memory,
                kernels=cs.kernels,
                schedule=cs.schedule,
                host_callbacks=cs.host_callbacks,
            )
        )
        reports.append(
            ExecutableReport(p.stage + "/" + p.bucket, len(cs.payload), len(z),
                             round(cs.trace_seconds, 3), round(cs.lower_seconds, 3), round(cs.compile_seconds, 3))
        )

    fit = None
    if tgt.hbm_bytes_per_device:
        fit = memory_fit(entries, tgt.hbm_bytes_per_device, tgt.device_count, tgt.weight_sharding)
        progress(f"memory per device: {_gib(fit.total_bytes)} of {_gib(fit.capacity_bytes)} "
                 f"(weights {_gib(fit.weights_bytes)}, {tgt.weight_sharding}; "
                 f"peak working set {_gib(fit.peak_working_bytes)} in {fit.peak_stage})")
        if not fit.fits:
            raise DoesNotFit(_does_not_fit(spec.name, tgt, fit, entries), fit)

    flags_rec = FlagProfileRecord(
        name=flags.name,
        version=flags.version,
        compiler_options=dict(flags.compiler_options),
        env_flags=list(flags.env_flags),
        kernel_flags=dict(flags.kernel_flags),
        digest=flags.digest(),
    )
    tools = toolchain(with_compile_tools=True)
    config_doc = dataclasses.asdict(config)
    src = source_digest()
    # The identity: a hash over everything that changes the binary or its output (identity.py).
    identity = identity_digest(
        pipeline=spec.name, entry=spec.entry, config=config_doc, overrides=applied, source=src,
        weights=weights_rec.raw_digest, target=tgt.name, flags=flags_rec.digest, jax=tools.jax, jaxlib=tools.jaxlib,
        platform=platform.model_dump(mode="json"),
        executables=[(e.key, e.format, e.hlo_digest, e.fingerprint) for e in entries],
        noise=NOISE_RECIPES[spec.noise],
    )
    build_id = build_id_for(spec.name, tgt.name, identity)
    manifest = Manifest(
        build_id=build_id,
        identity=identity,
        created_at=utcnow(),
        created_by=who(),
        pipeline=spec.name,
        model_entry=spec.entry,
        config=config_doc,
        overrides=applied,
        source_digest=src,
        weights=weights_rec,
        target=tgt.name,
        flags=flags_rec,
        toolchain=tools,
        platform=platform,
        buckets=[Bucket(name=b.name, frames=b.frames, height=config.height, width=config.width) for b in spec.buckets],
        program=_program(config, spec.noise),
        executables=entries,
        memory_fit=fit,
    )
    manifest = manifest.model_copy(update={"seal": manifest_seal(manifest)})
    result = CompileResult(
        build_id=build_id,
        digest="",
        created=False,
        registry=registry.uri,
        pipeline=spec.name,
        target=tgt.name,
        executables=reports,
        compile_wall_seconds=compile_wall,
        manifest=manifest,
    )
    if keep_compiled:
        result.compiled = {f"{cs.plan.stage}/{cs.plan.bucket}": cs.compiled for cs in compiled}
        result.weights_raw = weights_raw
    if publish:
        progress(f"publishing {build_id} ({sum(len(b) for b in blobs.values()) / 1e6:.1f} MB) to {registry.uri}")
        for data in blobs.values():
            registry.put_blob(data)
        digest, created = registry.put_build(build_id, manifest.to_json_bytes())
        result.digest, result.created = digest, created
    if publish and move_dev:
        resolved = registry.resolve(result.digest)
        current = registry.get_channel("dev")
        registry.move_channel(
            "dev",
            resolved,
            expected_digest=current.digest if current else None,
            action="publish",
            who=who(),
            reason=f"compile {spec.name} for {tgt.name}",
        )
    if not publish:
        result.digest = manifest.content_digest()
    result.wall_seconds = time.perf_counter() - t_start
    return result
