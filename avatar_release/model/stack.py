"""Running a stack of identical transformer blocks: a Python loop, or one scanned block.

Unrolled, a 32-block transformer sampled in 8 steps is 256 copies of a block in the traced
program, and XLA's compile time grows with it (hours for the production shapes on a 2-core
build machine). ``PipelineConfig.scan_layers`` asks for the stack to run as one loop over
stacked weights instead. PyTorch has no scan that traces through torchax, so the model only
names the stack here; eager PyTorch always loops, and a compiler that can scan installs a
runner for the duration of a trace (``avatar_release.compile._scan``). The per-block math
is the same either way.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

import torch
import torch.nn as nn

__all__ = ["run_blocks", "block_runner"]

Runner = Callable[..., torch.Tensor]
_RUNNER: contextvars.ContextVar[Runner | None] = contextvars.ContextVar("block_runner", default=None)


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, *args, scan: bool = False) -> torch.Tensor:
    """x -> blocks[-1](... blocks[0](x, *args) ..., *args). ``args`` are the same for every block."""
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
