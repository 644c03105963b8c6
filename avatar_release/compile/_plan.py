"""Step 1 of a build: what will be compiled, for which machine, from which weights.

Everything that can be refused without tracing is refused here (bad format, a flag profile for
another platform, a missing weights file, an unknown config, an entry that does not satisfy the
pipeline contract). The pipeline is reached only through its spec's entry and the contract
(``avatar_release.pipeline``); the plan holds it, its module tree, its weights as they will ship,
and one StagePlan per stage x bucket.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._dtypes import dtype_name
from ..errors import AvatarReleaseError, ContractError, InputError, SpecError
from ..machine import configure_compile_env, current_platform
from ..pipeline import (
    CONTRACT_PAGE,
    JaxStage,
    Pipeline,
    RequestProgram,
    StageSignature,
    TargetContext,
    author_error,
    calling,
    check_request_program,
    defined_at,
    load_entry,
    project_source_digest,
    request_program,
    returned,
    signature_of,
    weight_layout_of,
)
from ..records import ArraySpec, Platform
from ..specs import (
    FlagProfile,
    PipelineSpec,
    Project,
    TargetSpec,
    find_project,
    load_flag_profile,
    load_pipeline,
    load_target,
    target_description,
)
from ._devices import make_mesh, target_devices
from ._overrides import apply_overrides
from ._stage import StagePlan, fsdp_spec
from ._trace import stage_function
from ._weights import HostTensor

__all__ = ["ABSTRACT_WEIGHTS", "EXECUTABLE_FORMATS", "BuildPlan", "plan_build"]

ABSTRACT_WEIGHTS = "abstract: shapes only, never materialised"
EXECUTABLE_FORMATS = ("xla-executable", "jax-export")


@dataclass(frozen=True)
class BuildPlan:
    spec: PipelineSpec
    target: TargetSpec
    flags: FlagProfile
    executable_format: str  # one of EXECUTABLE_FORMATS
    platform: Platform  # the machine the executables are compiled for
    mesh: Any  # jax.sharding.Mesh over the target's devices
    pipeline: Pipeline  # the spec's entry, checked against the contract
    project: Project  # where the spec and the pipeline's code were found
    source_digest: str  # the pipeline's source packages
    config: Any  # the pipeline's config (a dataclass), overrides applied
    overrides: dict[str, Any]  # the overrides as applied (typed values)
    program: RequestProgram  # what chunk_program declared (an older ChunkProgramSpec mapped onto it)
    tree: Any  # the pipeline's module tree; on the meta device for an abstract build
    weights_label: str  # where the weights came from (ABSTRACT_WEIGHTS: nowhere)
    weight_tensors: list[HostTensor] | None  # every stage's weights as host tensors; None for an abstract build
    weights_tensors: int
    stages: list[StagePlan]  # one per stage x bucket, in the pipeline's stage order

    @property
    def abstract(self) -> bool:
        return self.weights_label == ABSTRACT_WEIGHTS


def plan_build(
    pipeline: str,
    target: str,
    *,
    weights_path: str | None,
    overrides: dict[str, str],
    executable_format: str,
    progress: Callable[[str], None],
) -> BuildPlan:
    if executable_format not in EXECUTABLE_FORMATS:
        raise InputError(f"--format {executable_format!r}: expected xla-executable or jax-export")
    project = find_project()
    spec = load_pipeline(pipeline)
    tgt = load_target(target)
    flags = _flag_profile(tgt, weights_path)

    progress(f"loading pipeline {spec.entry} ({spec.config}) from {project.root}")
    pipe = load_entry(spec, project)
    where, root = f"pipeline spec {spec.name}", project.root
    config, applied, program, signatures = _configure(pipe, spec, overrides, root)
    mesh, platform = _target_machine(tgt)

    tree, weights_label = _load_tree(pipe, spec, config, weights_path, root)
    stage_objs = {s: _stage_object(pipe, tree, s, where, root) for s in pipe.stages}
    host = None if weights_label == ABSTRACT_WEIGHTS else _host_tensors(stage_objs)
    n_tensors = 0 if host is None else len(host)
    context = functools.partial(
        TargetContext,
        name=tgt.name,
        platform=tgt.platform,
        mesh=mesh,
        axis=tgt.mesh_axes[0],
        kernel_flags=dict(flags.kernel_flags),
    )
    stages = _stage_plans(pipe, config, stage_objs, spec, signatures, tgt, context, root)
    return BuildPlan(
        spec=spec,
        target=tgt,
        flags=flags,
        executable_format=executable_format,
        platform=platform,
        mesh=mesh,
        pipeline=pipe,
        project=project,
        source_digest=project_source_digest(pipe, spec, project),
        config=config,
        overrides=applied,
        program=program,
        tree=tree,
        weights_label=weights_label,
        weight_tensors=host,
        weights_tensors=n_tensors,
        stages=stages,
    )


def _flag_profile(tgt: TargetSpec, weights_path: str | None) -> FlagProfile:
    """The target's flag profile, refused when it is for another platform; a missing --weights file refused."""
    flags = load_flag_profile(tgt.flag_profile)
    if flags.platform != tgt.platform:
        raise InputError(
            f"target {tgt.name} ({tgt.platform}) names flag profile {flags.name}, which is for {flags.platform}"
        )
    if weights_path is not None and not Path(weights_path).is_file():
        raise InputError(f"--weights {weights_path}: no such file")
    return flags


def _configure(
    pipe: Pipeline, spec: PipelineSpec, overrides: dict[str, str], root: Path | None
) -> tuple[Any, dict[str, Any], RequestProgram, dict[str, dict[str, StageSignature]]]:
    """The spec's config with the overrides applied, the request program it declares, and each
    bucket's stage signatures (checked against the program)."""
    where = f"pipeline spec {spec.name}"
    try:
        config = pipe.config(spec.config, root)
    except SpecError as e:
        raise SpecError(f"pipeline spec {spec.name}: {e}") from None
    with calling(where, f"configs[{spec.config!r}] (its __post_init__ or validate, with the overrides)", root):
        config, applied = apply_overrides(config, overrides)
    with calling(where, "chunk_program(config)", root):
        program = request_program(
            returned(pipe.chunk_program(config), where, "chunk_program(config)"), f"pipeline spec {spec.name}"
        )
    signatures = {b.name: signature_of(pipe, config, b.frames, where, root) for b in spec.buckets}
    for b in spec.buckets:
        check_request_program(f"pipeline spec {spec.name}, bucket {b.name}", program, signatures[b.name], b.frames)
    return config, applied, program, signatures


def _target_machine(tgt: TargetSpec) -> tuple[Any, Platform]:
    """The mesh over the target's devices and the platform the executables are compiled for."""
    if tgt.platform != "cpu":
        configure_compile_env(tgt)  # CPU device counts are the entry point's job (before JAX starts)
    devices = target_devices(tgt)
    mesh = make_mesh(devices, tgt)
    platform = current_platform(devices, tgt.mesh_axes, tgt.mesh_shape, tgt.topology)
    if tgt.platform == "gpu":  # the description compiled for: in the identity, through the platform
        platform = platform.model_copy(update={"target_config": target_description(tgt).digest})
    return mesh, platform


def _load_tree(
    pipe: Pipeline, spec: PipelineSpec, config: Any, weights_path: str | None, root: Path | None = None
) -> tuple[Any, str]:
    where = f"pipeline spec {spec.name}"
    if spec.weights.source == "abstract" and weights_path is None:
        # Shapes only: the module tree lives on the meta device and no value is ever computed.
        import torch  # the compile extra's; a pipeline's create() builds torch modules

        with torch.device("meta"), calling(where, "create(config)", root):
            return returned(pipe.create(config), where, "create(config)"), ABSTRACT_WEIGHTS
    source = weights_path or (None if spec.weights.source == "init" else spec.weights.source)
    if source is None:
        member = f"init_weights(config, {spec.weights.seed})"
        with calling(where, member, root):
            tree = returned(pipe.init_weights(config, spec.weights.seed), where, member)
        return tree, f"init:seed={spec.weights.seed}"
    try:
        tree = pipe.load_weights(config, source)
    except (ValueError, OSError) as e:  # the contract: load_weights raises ValueError when they do not fit
        raise InputError(str(e)) from None
    except AvatarReleaseError:
        raise
    except Exception as e:  # noqa: BLE001 - the pipeline's code raised: its author's to fix
        raise author_error(e, where, "load_weights(config, path)", root) from e
    return returned(tree, where, "load_weights(config, path)"), str(Path(source).absolute())


def _stage_object(pipe: Pipeline, tree: Any, stage: str, where: str, root: Path | None) -> Any:
    """``pipe.stage(tree, stage)``, checked: a torch module or a JaxStage."""
    member = f"stage(tree, {stage!r})"
    with calling(where, member, root):
        obj = returned(pipe.stage(tree, stage), where, member)
    if not isinstance(obj, JaxStage):
        import torch  # the compile extra's: a stage that is no JaxStage is a torch module

        if not isinstance(obj, torch.nn.Module):
            raise ContractError(
                f"{where}: {member} must return a torch.nn.Module or a JaxStage, got "
                f"{type(obj).__name__}. The pipeline contract: {CONTRACT_PAGE}"
            )
    return obj


def _host_tensors(stage_objs: dict[str, Any]) -> list[HostTensor]:
    """Every stage's weights, named ``<stage>.<param>`` as the executables' parameters are, as views
    of their bytes (no copy, no serialized file: they are chunked and compressed from these)."""
    out: list[HostTensor] = []
    for stage, obj in stage_objs.items():
        if isinstance(obj, JaxStage):
            for k, v in obj.params.items():
                a = np.ascontiguousarray(np.asarray(v))
                out.append(
                    HostTensor(f"{stage}.{k}", dtype_name(a.dtype), tuple(a.shape), a.reshape(-1).view(np.uint8))
                )
        else:
            import torch  # the compile extra's: the pipeline's stages are torch modules

            for k, t in obj.state_dict().items():
                t = t.detach().contiguous()
                raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
                out.append(HostTensor(f"{stage}.{k}", dtype_name(t.dtype), tuple(t.shape), raw))
    return out


def _stage_plans(
    pipe: Pipeline,
    config: Any,
    stage_objs: dict[str, Any],
    spec: PipelineSpec,
    signatures: dict[str, dict[str, StageSignature]],
    tgt: TargetSpec,
    context: Callable[..., TargetContext],
    root: Path | None = None,
) -> list[StagePlan]:
    axis, size = tgt.mesh_axes[0], tgt.mesh_shape[0]
    where, signature_at = f"pipeline spec {spec.name}", defined_at(pipe.signature, root)
    plans = []
    for stage in pipe.stages:
        obj = stage_objs[stage]
        shard = _shards_weights(tgt, obj, spec, stage)
        states, jax_func = stage_function(obj)
        keys = sorted(states)
        params = [
            ArraySpec(
                name=f"{stage}.{k}",
                shape=list(states[k][0]),
                dtype=dtype_name(states[k][1]),
                sharding=fsdp_spec(tuple(states[k][0]), axis, size) if shard else [None] * len(states[k][0]),
            )
            for k in keys
        ]

        routes: dict[str, Any] = {}  # what the pipeline declares while tracing the stage (every bucket)

        def trace(stage: str = stage, routes: dict[str, Any] = routes) -> AbstractContextManager[Any]:
            return returned(
                pipe.trace_context(config, context(stage=stage, routes=routes)), where, "trace_context(config, target)"
            )

        for b in spec.buckets:
            sig = signatures[b.name][stage]
            plans.append(
                StagePlan(
                    stage=stage,
                    bucket=b.name,
                    jax_func=jax_func,
                    params=params,
                    param_keys=keys,
                    inputs=_activation_specs(sig.inputs, axis, size),
                    outputs=_activation_specs(sig.outputs, axis, size),
                    trace_context=trace,
                    routes=routes,
                    where=where,
                    signature_at=signature_at,
                )
            )
    return plans


def _shards_weights(tgt: TargetSpec, obj: Any, spec: PipelineSpec, stage: str) -> bool:
    """FSDP unless the stage asks to keep its (small) weights whole on every device."""
    try:
        return tgt.weight_sharding == "fsdp" and weight_layout_of(obj) == "sharded"
    except ValueError as e:
        raise ContractError(
            f"pipeline spec {spec.name}: stage {stage}: {e}. The pipeline contract: {CONTRACT_PAGE} (layout hints)"
        ) from None


def _activation_specs(tensors: Any, axis: str, size: int) -> list[ArraySpec]:
    """Activations cross stage boundaries sharded by the same shape rule as weights (leading dim
    over the mesh axis when it divides): one stage's outputs are then exactly the next stage's
    inputs, so serving never needs a resharding program, and each device works on its slice
    instead of all of it."""
    return [
        ArraySpec(name=t.name, shape=list(t.shape), dtype=t.dtype, sharding=fsdp_spec(t.shape, axis, size))
        for t in tensors
    ]
