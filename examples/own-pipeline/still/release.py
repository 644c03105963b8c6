"""The still pipeline as avatar-release sees it: ``entry = "still.release:pipeline"``.

Image -> video: one required image input and the frame times in, uint8 frames out; no audio, no
noise. Importing this module imports no torch.
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
    from still.model import CONFIGS

    return dict(CONFIGS)


def _create(config: Any) -> Any:
    from still.model import Still

    return Still(config)


def _init_weights(config: Any, seed: int) -> Any:
    import torch

    from still.model import Still

    g = torch.Generator().manual_seed(int(seed))
    tree = Still(config)
    with torch.no_grad():
        for p in tree.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32))
    return tree.requires_grad_(False).eval()


def _load_weights(config: Any, path: str) -> Any:
    from safetensors.torch import load_file

    from still.model import Still

    tree = Still(config)
    tree.load_state_dict(load_file(path), strict=True)  # a mismatch raises, naming the keys
    return tree.requires_grad_(False).eval()


def _stage(tree: Any, name: str) -> Any:
    if name != "sway":
        raise ValueError(f"unknown still stage {name!r}; stages: sway")
    return tree.sway


def _signature(config: Any, frames: int) -> dict[str, StageSignature]:
    from still.model import stage_inputs, stage_outputs

    return {
        "sway": StageSignature(
            tuple(TensorSpec(*t) for t in stage_inputs(config, frames)),
            tuple(TensorSpec(*t) for t in stage_outputs(config, frames)),
        )
    }


def _chunk_program(config: Any) -> RequestProgram:
    return RequestProgram(
        inputs=(RequestInput.image("image", height=config.height, width=config.width), RequestInput.time("times")),
        delivers=Delivery.video("frames", height=config.height, width=config.width),
        fps=config.fps,
    )


pipeline = Pipeline(
    name="still",
    stages=("sway",),
    configs={"tiny": lambda: _configs()["tiny"]()},
    create=_create,
    init_weights=_init_weights,
    load_weights=_load_weights,
    stage=_stage,
    signature=_signature,
    chunk_program=_chunk_program,
    gate_requests=GateRequests(images=(0, 1), audio=(0,), seed=0),
    source_packages=("still",),
)
