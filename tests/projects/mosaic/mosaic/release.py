"""mosaic as avatar-release sees it: ``entry = "mosaic.release:pipeline"``. No wrapper around any
stage: each module is handed over as it is, whatever it returns."""

from __future__ import annotations

from typing import Any

from avatar_release.pipeline import ChunkProgramSpec, Pipeline, StageSignature
from mosaic.config import CONFIGS, MosaicConfig

STAGES = ("encode", "motion", "decode")


def _create(c: MosaicConfig) -> Any:
    from mosaic.model import Mosaic

    return Mosaic(c)


def _init_weights(c: MosaicConfig, seed: int) -> Any:
    from mosaic.model import init_weights

    return init_weights(c, seed)


def _load_weights(c: MosaicConfig, path: str) -> Any:
    from mosaic.model import load_weights

    return load_weights(c, path)


def _stage(tree: Any, name: str) -> Any:
    return getattr(tree, name)


def _signature(c: MosaicConfig, frames: int) -> dict[str, StageSignature]:
    from mosaic.model import signature

    return {s: StageSignature(tuple(ins), tuple(outs)) for s, (ins, outs) in signature(c, frames).items()}


def _chunk_program(c: MosaicConfig) -> ChunkProgramSpec:
    return ChunkProgramSpec(
        image="image",
        audio="audio",
        noise="noise",
        carry={"pose": "last_pose"},
        deliver="frames",
        fps=c.fps,
        sample_rate=c.sample_rate,
        samples_per_frame=c.samples_per_frame,
        height=c.height,
        width=c.width,
    )


pipeline = Pipeline(
    name="mosaic",
    stages=STAGES,
    configs=dict(CONFIGS),
    create=_create,
    init_weights=_init_weights,
    load_weights=_load_weights,
    stage=_stage,
    signature=_signature,
    chunk_program=_chunk_program,
    source_packages=("mosaic",),
)
