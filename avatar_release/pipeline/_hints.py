"""Hints a pipeline's model code gives a compiler, and the hooks a compiler installs for them.

Eager PyTorch ignores every hint: ``replicated(x)`` is the identity and ``run_blocks`` is a Python
loop. A compiler tracing the model for a mesh installs a function for the duration of the trace
(``layout_hints``, ``block_runner``: avatar_release.compile does) that pins a tensor's sharding or
runs a stack of identical blocks as one scanned block. The values never change, only where they
live and how the program is laid out.

Layouts a module may ask for with a ``weight_layout`` attribute:

sharded     (the default) the stage's weights split over the mesh (FSDP).
replicated  on a stage module: its weights whole on every device (too small to be worth gathering).
stationary  on a sub-module of a block the compiler gathers layer by layer: its weights stay
            sharded where they are and its output moves instead (a layer applied to a handful of
            rows, e.g. a per-frame modulation).

No torch import here: the contract is importable where torch is not (a serving pod).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: a pipeline brings its own torch
    import torch

__all__ = [
    "WEIGHT_LAYOUTS",
    "replicated",
    "layout_hints",
    "weight_layout_of",
    "stationary_params",
    "run_blocks",
    "block_runner",
]

WEIGHT_LAYOUTS = ("sharded", "replicated")

Hint = Callable[[Any, str], Any]
Runner = Callable[..., Any]
_HINT: contextvars.ContextVar[Hint | None] = contextvars.ContextVar("layout_hint", default=None)
_RUNNER: contextvars.ContextVar[Runner | None] = contextvars.ContextVar("block_runner", default=None)


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


def weight_layout_of(module: Any) -> str:
    """How a stage asks for its weights to be laid out: "sharded" (the default) or "replicated"."""
    layout = getattr(module, "weight_layout", "sharded")
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"{type(module).__name__}.weight_layout = {layout!r}: expected one of {WEIGHT_LAYOUTS}")
    return layout


def stationary_params(block: torch.nn.Module) -> set[str]:
    """Names of ``block``'s parameters under sub-modules marked ``weight_layout = "stationary"``."""
    out: set[str] = set()
    for prefix, module in block.named_modules():
        if getattr(module, "weight_layout", None) == "stationary":
            out.update(f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters())
    return out


def run_blocks(blocks: torch.nn.ModuleList, x: torch.Tensor, *args: Any, scan: bool = False) -> torch.Tensor:
    """x -> blocks[-1](... blocks[0](x, *args) ..., *args). ``args`` are the same for every block.

    ``scan=True`` asks a compiler to run the stack as one loop over stacked weights (compile time
    independent of depth); eager PyTorch loops either way, with the same per-block math.
    """
    runner = _RUNNER.get()
    if scan and runner is not None and len(blocks) > 1:
        return runner(blocks, x, *args)
    for block in blocks:
        x = block(x, *args)
    return x


@contextlib.contextmanager
def block_runner(runner: Runner) -> Iterator[None]:
    """Install ``runner(blocks, x, *args)`` for stacks that ask to be scanned (compilers only)."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)
