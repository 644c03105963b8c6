"""Deterministic random weights, and safetensors save / load with errors that name file and tensor.

Production weights are not available; a seed stands in for a checkpoint. The seeded weights go
through the same save -> load path a real checkpoint would, so loading is tested for real.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from model.attention import Linear, RMSNorm
from model.config import PipelineConfig
from model.errors import WeightsError
from model.pipeline import AvatarPipeline
from model.vae import Conv2d, GroupNorm

# Stand-in weights are scaled below variance-preserving (gain 1) so that the random network is
# contractive, as a trained diffusion model is. At gain 1 a random transformer sits at the edge
# of chaos: any rounding change (a reordered fp32 sum) grows through the bf16 casts until every
# lever looks alike in the output, and the similarity band could not tell a reassociation from a
# bf16 residual stream. Measured on `tiny` (DiT latents, mean relative difference from the
# baseline): gain 1: k-split 6e-4 vs bf16 residual 2e-3; gain 0.25: 3e-8 vs 4e-4.
INIT_GAIN = 0.25


def init_pipeline(config: PipelineConfig, seed: int) -> AvatarPipeline:
    """A pipeline with weights drawn from one seeded torch.Generator: identical in every process.

    Matmul / conv weights ~ N(0, (INIT_GAIN^2) / fan_in), stored bf16; biases 0; norm scales 1.
    Draws happen in module registration order, which the model code fixes.
    """
    g = torch.Generator().manual_seed(seed)
    pipeline = AvatarPipeline(config)
    with torch.no_grad():
        for module in pipeline.modules():
            if isinstance(module, (Linear, Conv2d)):
                w = module.weight
                fan_in = math.prod(w.shape[1:])
                draw = torch.randn(w.shape, generator=g, dtype=torch.float32) * (INIT_GAIN / math.sqrt(fan_in))
                w.copy_(draw.to(w.dtype))
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, GroupNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
    return pipeline.requires_grad_(False).eval()


def save_weights(pipeline: AvatarPipeline, path: str | os.PathLike) -> Path:
    """Write the pipeline's parameters as safetensors, atomically: a temp file, then rename."""
    path = Path(path)
    tensors = {name: t.detach().contiguous() for name, t in pipeline.state_dict().items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt", "config": pipeline.config.name})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_weights(config: PipelineConfig, path: str | os.PathLike) -> AvatarPipeline:
    """A pipeline for `config` with the weights in `path`; WeightsError if they do not fit exactly."""
    path = Path(path)
    where = f"weights file {path}"
    if not path.is_file():
        raise WeightsError(f"{where}: not found")
    try:
        tensors = load_file(path)
    except Exception as e:  # safetensors raises its own error type for a bad header
        raise WeightsError(f"{where}: not a readable safetensors file ({type(e).__name__}: {e})") from None

    with torch.device("meta"):  # shapes and dtypes only; load_state_dict(assign=True) fills them
        pipeline = AvatarPipeline(config)
    expected = pipeline.state_dict()
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s) for config {config.name!r}: {_names(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) for config {config.name!r}: {_names(unexpected)}")
    mismatched = []
    for name in sorted(expected.keys() & tensors.keys()):
        want, got = expected[name], tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            mismatched.append(f"tensor {name!r} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif got.dtype != want.dtype:
            mismatched.append(f"tensor {name!r} has dtype {_dtype(got)}, expected {_dtype(want)}")
    problems += mismatched[:10]
    if len(mismatched) > 10:
        problems.append(f"... and {len(mismatched) - 10} more tensors of the wrong shape or dtype")
    if problems:
        raise WeightsError(f"{where}: " + "; ".join(problems))

    pipeline.load_state_dict(tensors, strict=True, assign=True)
    return pipeline.requires_grad_(False).eval()


def _names(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
