"""The echo pipeline as avatar-release sees it: ``entry = "echo.release:pipeline"``.

Audio -> audio: one required audio input in, float32 samples at the same rate out; no picture,
no noise. ``render`` writes a WAV, ``serve`` answers one, the gate compares the delivered chunks.
Importing this module imports no torch.
"""

from __future__ import annotations

from typing import Any

from avatar_release.pipeline import (
    Delivery,
    GateRequests,
    Pipeline,
    RequestInput,
    RequestProgram,
    StageSignature,
    TensorSpec,
)

__all__ = ["pipeline"]


def _configs() -> dict[str, Any]:
    from echo.model import CONFIGS

    return dict(CONFIGS)


def _create(config: Any) -> Any:
    from echo.model import Echo

    return Echo(config)


def _init_weights(config: Any, seed: int) -> Any:
    import torch

    from echo.model import Echo

    g = torch.Generator().manual_seed(int(seed))
    tree = Echo(config)
    with torch.no_grad():
        for p in tree.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32))
    return tree.requires_grad_(False).eval()


def _load_weights(config: Any, path: str) -> Any:
    from safetensors.torch import load_file

    from echo.model import Echo

    tree = Echo(config)
    tree.load_state_dict(load_file(path), strict=True)  # a mismatch raises, naming the keys
    return tree.requires_grad_(False).eval()


def _stage(tree: Any, name: str) -> Any:
    if name != "shape":
        raise ValueError(f"unknown echo stage {name!r}; stages: shape")
    return tree.shape


def _signature(config: Any, frames: int) -> dict[str, StageSignature]:
    from echo.model import stage_inputs, stage_outputs

    return {
        "shape": StageSignature(
            tuple(TensorSpec(*t) for t in stage_inputs(config, frames)),
            tuple(TensorSpec(*t) for t in stage_outputs(config, frames)),
        )
    }


def _chunk_program(config: Any) -> RequestProgram:
    return RequestProgram(
        inputs=(
            RequestInput.audio("audio", sample_rate=config.sample_rate, samples_per_frame=config.samples_per_frame),
        ),
        delivers=Delivery.audio("out", sample_rate=config.sample_rate, samples_per_frame=config.samples_per_frame),
        fps=config.fps,
    )


pipeline = Pipeline(
    name="echo",
    stages=("shape",),
    configs={"tiny": lambda: _configs()["tiny"]()},
    create=_create,
    init_weights=_init_weights,
    load_weights=_load_weights,
    stage=_stage,
    signature=_signature,
    chunk_program=_chunk_program,
    gate_requests=GateRequests(images=(0,), audio=(0, 1), seed=0),
    source_packages=("echo",),
)
