"""Step 1 of a build: what will be compiled, for which machine, from which weights.

Everything that can be refused without tracing is refused here (bad format, a flag profile for
another platform, a missing weights file, an unknown config). The plan holds the loaded model,
its weights as they will ship, and one StagePlan per stage x bucket.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .._dtypes import dtype_name
from ..errors import InputError
from ..machine import configure_compile_env, current_platform
from ..records import ArraySpec, Platform
from ..specs import FlagProfile, PipelineSpec, TargetSpec, load_flag_profile, load_pipeline, load_target
from ._attention import AttentionRoute
from ._devices import make_mesh, target_devices
from ._overrides import apply_overrides
from ._stage import StagePlan, fsdp_spec
from ._trace import stage_function

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
    config: Any  # model.config dataclass, overrides applied
    overrides: dict[str, Any]  # the overrides as applied (typed values)
    pipe: Any  # the torch pipeline module; on the meta device for an abstract build
    weights_label: str  # where the weights came from (ABSTRACT_WEIGHTS: nowhere)
    weights_raw: bytes | None  # safetensors bytes; None for an abstract build
    weights_tensors: int
    stages: list[StagePlan]  # one per stage x bucket, in model.pipeline.STAGES order

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
    config, applied, pipe, weights_label = _load_model(spec, overrides, weights_path)
    weights_raw, n_tensors = (None, 0) if weights_label == ABSTRACT_WEIGHTS else _weights_bytes(pipe)

    route = AttentionRoute.from_config(config, platform=tgt.platform, kernel_flags=flags.kernel_flags)
    stages = _stage_plans(config, pipe, spec, tgt.mesh_axes[0], tgt.mesh_shape[0],
                          weight_sharding=tgt.weight_sharding, route=route)
    return BuildPlan(spec=spec, target=tgt, flags=flags, executable_format=executable_format, platform=platform,
                     mesh=mesh, config=config, overrides=applied, pipe=pipe, weights_label=weights_label,
                     weights_raw=weights_raw, weights_tensors=n_tensors, stages=stages)


def _load_model(spec: PipelineSpec, overrides: dict[str, str], weights_path: str | None):
    from avatar_release.model.config import get_config

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
    from avatar_release.model import weights as W
    from avatar_release.model.errors import WeightsError

    if spec.weights.source == "abstract" and weights_path is None:
        # Shapes only: the module lives on the meta device and no value is ever computed.
        import torch

        from avatar_release.model.pipeline import AvatarPipeline

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


def _stage_plans(config, pipe, spec: PipelineSpec, axis: str, size: int, *, weight_sharding: str = "fsdp",
                 route: AttentionRoute) -> list[StagePlan]:
    from avatar_release.model import pipeline as P
    from avatar_release.model.layout import weight_layout_of

    plans = []
    for stage in P.STAGES:
        module = getattr(pipe, stage)
        # FSDP unless the stage asks to keep its (small) weights whole on every device.
        shard = weight_sharding == "fsdp" and weight_layout_of(module) == "sharded"

        def weight_spec(shape: tuple[int, ...], shard: bool = shard) -> list[str | None]:
            return fsdp_spec(shape, axis, size) if shard else [None] * len(shape)

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
