"""spec + target -> trace (torchax) -> lower -> compile (flag profile) -> serialize + zstd
-> one immutable, content-addressed build in a registry.

``compile_build`` reads as its steps: plan (_plan.py) -> trace -> compile -> package
(_package.py) -> publish; with ``move_dev``, dev then points at the build (``trust.state_moves.publish_to_dev``, signed:
dev takes any compiled build, so no promotion policy is involved).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._progress import Tick
from ..errors import InputError
from ..records import WEIGHT_COMPRESSIONS, GateRequestsRecord, Manifest
from ..registry import Registry, read_manifest
from ..trust.policy import load_policy
from ..trust.state_moves import open_state, publish_to_dev
from ..trust.state_read import state_exists
from ._autotune import AutotunePlan
from ._package import EXECUTABLE_MEDIA_TYPE, ExecutableReport, Package, package_build
from ._plan import BuildPlan, plan_build
from ._share import shared_compiles
from ._stage import CompiledStage, LoweredStage, compile_stage, lower_stage, shared_stage

__all__ = ["CompileResult", "compile_build", "EXECUTABLE_MEDIA_TYPE"]


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
    weight_tensors: list | None = None  # compile._weights.HostTensor, with keep_compiled
    # executable key -> the key whose executable it shares (the same program, compiled once: _share.py)
    shared: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what the user should know (the build was published)

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
            "shared": dict(self.shared),
            "warnings": list(self.warnings),
        }


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
    autotune: AutotunePlan | None = None,
    expect_source: str | None = None,
    weight_compression: str = "none",
    progress: Callable[[str], None] = lambda msg: None,
) -> CompileResult:
    """Compile every stage x bucket of ``pipeline`` for ``target`` and publish one build.

    ``executable_format="jax-export"`` ships portable StableHLO instead of executables: the
    serving pod then compiles on first use, which the zero-recompile gate refuses.
    ``move_dev`` (with ``publish``) then points the dev channel at the build
    (``trust.state_moves.publish_to_dev``). ``autotune`` loads autotune results or writes what XLA chose
    (GPU targets; ``avatar-release autotune``). ``expect_source``: refuse, before tracing, a pipeline
    whose source digest is not this one (recompiling a published build from this checkout).
    ``weight_compression``: how weight chunks are stored, "none" (raw) or "zstd" (records.weights).
    """
    t_start = time.perf_counter()
    _check_compression(weight_compression)
    plan = plan_build(
        pipeline,
        target,
        weights_path=weights_path,
        overrides=overrides or {},
        executable_format=executable_format,
        progress=progress,
    )
    _check_source(plan, expect_source)
    lowered = _trace(plan, progress)
    with tempfile.TemporaryDirectory(prefix="avatar-release-autotune-") as scratch:
        autotune = _results_on_disk(autotune, Path(scratch))
        compiled = _compile(
            lowered,
            plan,
            side_by_side=concurrent_compile and plan.target.concurrent_compile,
            autotune=autotune,
            progress=progress,
        )
    package = package_build(plan, compiled.stages, progress, autotune=autotune, weight_compression=weight_compression)
    result = _result(plan, package, compiled, registry)
    if keep_compiled:
        result.compiled = {f"{cs.plan.stage}/{cs.plan.bucket}": cs.compiled for cs in compiled.stages}
        result.weight_tensors = plan.weight_tensors
    if publish:
        published = _publish_build(registry, package, plan, move_dev=move_dev, progress=progress)
        result.digest, result.created, result.warnings = published
    else:
        result.digest = package.manifest.content_digest()
    result.wall_seconds = time.perf_counter() - t_start
    return result


def _kept_gate_requests(registry: Registry, digest: str, compiled: Manifest) -> list[str]:
    """A build published earlier keeps its manifest (builds are immutable), gate requests included:
    say so when this compile would have recorded others (a spec's [gate] table, or the pipeline's
    gate_requests, changed since; they are not part of the build's identity)."""
    kept = read_manifest(registry, digest)[1].gate_requests
    if kept == compiled.gate_requests:
        return []
    return [
        f"build {compiled.build_id} was published earlier with gate requests {_requests(kept)}; this compile's "
        f"are {_requests(compiled.gate_requests)} (the spec's [gate] table or the pipeline's gate_requests "
        "changed). The published build keeps its own, and its gates render those"
    ]


def _requests(r: GateRequestsRecord | None) -> str:
    return "the defaults" if r is None else f"images {r.images} x audio {r.audio}, seed {r.seed}"


def _check_compression(weight_compression: str) -> None:
    if weight_compression not in WEIGHT_COMPRESSIONS:
        raise InputError(
            f"weight compression {weight_compression!r}: expected one of {', '.join(WEIGHT_COMPRESSIONS)} "
            "(--weight-compression)"
        )


def _result(plan: BuildPlan, package: Package, compiled: _Compiled, registry: Registry) -> CompileResult:
    """What compile_build returns, before publishing: the build, its executables, its compile wall."""
    return CompileResult(
        build_id=package.manifest.build_id,
        digest="",
        created=False,
        registry=registry.uri,
        pipeline=plan.spec.name,
        target=plan.target.name,
        executables=package.reports,
        compile_wall_seconds=compiled.wall_seconds,
        manifest=package.manifest,
        shared=compiled.shared,
    )


def _check_source(plan: BuildPlan, expected: str | None) -> None:
    if expected is not None and plan.source_digest != expected:
        raise InputError(
            f"pipeline {plan.spec.name}: this checkout's source is {plan.source_digest}, the build's is "
            f"{expected}: recompiling a build needs the source it was built from (check out the "
            "commit it was compiled at)"
        )


def _trace(plan: BuildPlan, progress: Callable[[str], None]) -> list[LoweredStage]:
    """Step 2: trace and lower every stage x bucket, one at a time."""
    lowered: list[LoweredStage] = []
    # Tracing runs Python (torchax dispatch), so it is serial. It runs in a worker thread
    # on purpose: XLA records the Python call stack in the program's debug locations, and
    # a fixed stack keeps the HLO (and so the build identity) independent of the caller, and
    # lower_stage names its files relative to the project or an import root (compile/_locations.py).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as tracer:
        for sp in plan.stages:
            ls = tracer.submit(
                lower_stage,
                sp,
                plan.mesh,
                export=plan.executable_format == "jax-export",
                project_root=plan.project.root,
            ).result()
            progress(f"{sp.stage}/{sp.bucket}: traced {ls.trace_seconds:.2f}s, lowered {ls.lower_seconds:.2f}s")
            lowered.append(ls)
            progress(Tick("trace", len(lowered), len(plan.stages), "stage"))
    return lowered


@dataclass
class _Compiled:
    stages: list[CompiledStage]  # in the order of the lowered stages
    wall_seconds: float  # wall time of the whole compile step (stages overlap when concurrent)
    shared: dict[str, str] = field(default_factory=dict)  # key -> the key whose executable it shares


def _results_on_disk(autotune: AutotunePlan | None, scratch: Path) -> AutotunePlan | None:
    """The plan with its results written where XLA reads them (a .textproto file: text form)."""
    if autotune is None or autotune.results is None:
        return autotune
    path = scratch / "autotune-results.textproto"
    path.write_bytes(autotune.results.text)
    return dataclasses.replace(autotune, results_file=path)


def _stage_options(plan: BuildPlan, autotune: AutotunePlan | None, ls: LoweredStage) -> dict[str, Any]:
    """The flag profile's compiler options, and what an autotune plan adds (its dump: one file a stage)."""
    options = dict(plan.flags.compiler_options)
    if autotune is not None:
        options.update(autotune.compiler_options())
        if autotune.dump_to is not None:
            name = f"{ls.plan.stage}-{ls.plan.bucket}.textproto"
            options["xla_gpu_dump_autotune_results_to"] = str(autotune.dump_to / name)
    return options


def _compile(
    lowered: list[LoweredStage],
    plan: BuildPlan,
    *,
    side_by_side: bool,
    autotune: AutotunePlan | None,
    progress: Callable[[str], None],
) -> _Compiled:
    """Step 3: compile every distinct lowered program under the target's flag profile; a program
    identical to one already compiled (a bucket-independent stage's other buckets) shares it."""
    t_compile = time.perf_counter()
    groups = shared_compiles(lowered, lambda ls: _stage_options(plan, autotune, ls))
    unique = [lowered[i] for i in groups.compiles]
    done: dict[int, CompiledStage] = {}

    def finished(ls: LoweredStage, cs: CompiledStage) -> None:
        done[id(ls)] = cs
        progress(f"{cs.plan.stage}/{cs.plan.bucket}: compiled {cs.evidence.compile_seconds:.2f}s")
        progress(Tick("compile", len(done), len(unique), "stage"))

    if side_by_side and len(unique) > 1:
        # XLA compiles release the GIL: the stages compile side by side.
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(unique)) as pool:
            futures = {pool.submit(compile_stage, ls, _stage_options(plan, autotune, ls)): ls for ls in unique}
            for fut in concurrent.futures.as_completed(futures):
                finished(futures[fut], fut.result())
    else:
        for ls in unique:
            finished(ls, compile_stage(ls, _stage_options(plan, autotune, ls)))
    shared = {}
    for i, j in groups.shares.items():
        done[id(lowered[i])] = shared_stage(lowered[i], done[id(lowered[j])])
        key, source = (f"{lowered[k].plan.stage}/{lowered[k].plan.bucket}" for k in (i, j))
        shared[key] = source
        progress(f"{key}: shared with {source} (the same program; not compiled again)")
    return _Compiled([done[id(ls)] for ls in lowered], time.perf_counter() - t_compile, shared)


PUBLISH_WORKERS = 4


def _publish(registry: Registry, package: Package, progress: Callable[[str], None]) -> tuple[str, bool]:
    """Step 5: every blob first, the manifest last (its write is the commit) -> (digest, created)."""
    build_id = package.manifest.build_id
    # Content-addressed: put_blob sends nothing for a blob already stored (a weight chunk an earlier
    # build shares), only renews its garbage-collection grace; say how much is new.
    new = {d: b for d, b in package.blobs.items() if not registry.has_blob(d)}
    kept = len(package.blobs) - len(new)
    progress(
        f"publishing {build_id} to {registry.uri}: {len(new)} new blobs, {sum(map(len, new.values())) / 1e6:.1f} MB"
        + (f" ({kept} already stored)" if kept else "")
    )
    # Side by side: an OCI registry takes several uploads at once; each put is atomic on its own.
    blobs = list(package.blobs.values())
    total, sent = sum(map(len, blobs)), 0
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=min(PUBLISH_WORKERS, len(blobs) or 1), thread_name_prefix="publish"
    ) as pool:
        futures = {pool.submit(registry.put_blob, b): len(b) for b in blobs}
        for fut in concurrent.futures.as_completed(futures):
            fut.result()
            sent += futures[fut]
            progress(Tick("upload", sent, total, "B"))
    return registry.put_build(build_id, package.manifest.to_json_bytes())


def _publish_build(
    registry: Registry, package: Package, plan: BuildPlan, *, move_dev: bool, progress: Callable[[str], None]
) -> tuple[str, bool, list[str]]:
    """Publish the package (its digest, whether it was new, warnings about a build published
    earlier); then, with ``move_dev``, point the dev channel at it."""
    digest, created = _publish(registry, package, progress)
    warnings = [] if created else _kept_gate_requests(registry, digest, package.manifest)
    if not state_exists(registry) and not registry.list_channels() and not registry.history():
        open_state(registry, load_policy(), init_if_new=True)  # a new registry: its signed state starts here
    if move_dev:
        _move_dev(registry, digest, reason=f"compile {plan.spec.name} for {plan.target.name}")
    return digest, created, warnings


def _move_dev(registry: Registry, digest: str, *, reason: str) -> None:
    resolved, manifest = read_manifest(registry, digest)
    publish_to_dev(registry, resolved, manifest, reason=reason)
