"""The puppet pipeline as avatar-release sees it: ``entry = "puppet.release:pipeline"``.

Two stages (motion -> decode), a pose vector carried from chunk to chunk, 32x64 frames (tiny).
Importing this module imports no torch; the model is imported when a module tree is built.
"""

from __future__ import annotations

from typing import Any

from avatar_release.pipeline import (
    ChunkProgramSpec,
    GateRequests,
    Lever,
    Pipeline,
    StageSignature,
    TensorSpec,
)
from puppet.config import CONFIGS, PuppetConfig

__all__ = ["pipeline"]

STAGES = ("motion", "decode")


def _create(config: PuppetConfig) -> Any:
    from puppet.model import Puppet

    return Puppet(config)


def _init_weights(config: PuppetConfig, seed: int) -> Any:
    from puppet.weights import init_weights

    return init_weights(config, seed)


def _load_weights(config: PuppetConfig, path: str) -> Any:
    from puppet.weights import load_weights

    return load_weights(config, path)


def _stage(tree: Any, name: str) -> Any:
    from puppet.model import stage_module

    return stage_module(tree, name)


def _signature(config: PuppetConfig, frames: int) -> dict[str, StageSignature]:
    from puppet.model import stage_inputs, stage_outputs

    ins, outs = stage_inputs(config, frames), stage_outputs(config, frames)
    return {
        s: StageSignature(tuple(TensorSpec(*t) for t in ins[s]), tuple(TensorSpec(*t) for t in outs[s])) for s in STAGES
    }


def _chunk_program(config: PuppetConfig) -> ChunkProgramSpec:
    return ChunkProgramSpec(
        image="image",
        audio="audio",
        noise="noise",
        carry={"pose": "last_pose"},
        deliver="frames",
        fps=config.fps,
        sample_rate=config.sample_rate,
        samples_per_frame=config.samples_per_frame,
        height=config.height,
        width=config.width,
    )


pipeline = Pipeline(
    name="puppet",
    stages=STAGES,
    configs=dict(CONFIGS),
    create=_create,
    init_weights=_init_weights,
    load_weights=_load_weights,
    stage=_stage,
    signature=_signature,
    chunk_program=_chunk_program,
    levers={
        "matmul_k_split": Lever("reassociation", "every matmul's contraction as k float32 partial sums added in order")
    },
    band_variants=({"matmul_k_split": "2"}, {"matmul_k_split": "4"}),
    gate_requests=GateRequests(images=(0, 1), audio=(0, 1), seed=0),
    source_packages=("puppet",),
)
