"""Layout hints: where the model tells a compiler how a tensor should sit on the device mesh.

Eager PyTorch ignores them (each is the identity). A compiler tracing the model for a mesh
installs a function for the duration of the trace (``avatar_release.compile._layout``) that pins
the tensor's sharding, so the partitioner does not have to guess one it then cannot leave
cheaply. The values never change, only where they live.

replicated  a small tensor every device reads whole: the super-resolution stage's reference
            frame tokens, concatenated in front of the frame-sharded video.

A stage module may also say how its weights should sit: ``weight_layout = "replicated"`` asks
for them whole on every device instead of sharded, for a stage whose weights are too small to be
worth gathering (``weight_layout_of``). Inside a block that a compiler gathers layer by layer
(FSDP), a sub-module may say ``weight_layout = "stationary"``: its weights stay sharded where
they are and its output moves instead, for a layer applied to a handful of rows (the DiT's
per-frame adaLN modulation: 16 rows against a weight of 157M parameters) (``stationary_params``).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

import torch

__all__ = ["replicated", "layout_hints", "weight_layout_of", "stationary_params"]

WEIGHT_LAYOUTS = ("sharded", "replicated")

Hint = Callable[[torch.Tensor, str], torch.Tensor]
_HINT: contextvars.ContextVar[Hint | None] = contextvars.ContextVar("layout_hint", default=None)


def replicated(x: torch.Tensor) -> torch.Tensor:
    """``x``, to be held whole by every device (identity outside a compiler's trace)."""
    hint = _HINT.get()
    return x if hint is None else hint(x, "replicated")


@contextlib.contextmanager
def layout_hints(hint: Hint) -> Iterator[None]:
    """Install ``hint(tensor, layout) -> tensor`` while a compiler traces (compilers only)."""
    token = _HINT.set(hint)
    try:
        yield
    finally:
        _HINT.reset(token)


def weight_layout_of(module: torch.nn.Module) -> str:
    """How a stage asks for its weights to be laid out: "sharded" (the default) or "replicated"."""
    layout = getattr(module, "weight_layout", "sharded")
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"{type(module).__name__}.weight_layout = {layout!r}: expected one of {WEIGHT_LAYOUTS}")
    return layout


def stationary_params(block: torch.nn.Module) -> set[str]:
    """Names of ``block``'s parameters under sub-modules marked ``weight_layout = "stationary"``."""
    out = set()
    for prefix, module in block.named_modules():
        if getattr(module, "weight_layout", None) == "stationary":
            out.update(f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters())
    return out
