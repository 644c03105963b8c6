"""The compiler's runner for ``avatar_release.pipeline.run_blocks``: a block stack as one ``lax.scan``.

While a stage is traced, the block parameters are torchax tensors (JAX tracers inside). The
runner stacks each parameter over the blocks (leading axis = depth; FSDP sharding moves to the
next axis) and scans one block's functional call over them. The traced program then holds one
block instead of ``depth``, so compile time no longer grows with depth. The stacking is a copy
of the stack's weights inside the program (per device, under FSDP: weights / mesh size); a
checkpoint stored pre-stacked would avoid it.

On a mesh, the body pins each layer's weights whole (replicated) where it uses them: FSDP's
per-layer gather, inside the loop, while the activations stay sharded by frame. Left to itself,
the partitioner kept the weights split over output features and moved the activations instead:
windowed einsums over every token of the chunk on every chip, and the MLP's whole hidden layer
gathered to each (on avatar-720p's DiT, 1.77 TB of HBM traffic per chip per chunk by XLA's own
count, against 0.84 TB with the gather here; see docs/concepts/production-shapes.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ..pipeline import block_runner, stationary_params

if TYPE_CHECKING:  # only for annotations: torch and JAX load only while tracing
    import jax
    import torch
    from jax.sharding import Mesh

__all__ = ["scanned_blocks"]


def _scan(
    blocks: Sequence[torch.nn.Module], x: torch.Tensor, *args: torch.Tensor, mesh: Mesh | None = None
) -> torch.Tensor:
    # Lazy (compile extra): torch and torchax load only while tracing a PyTorch stage.
    import jax
    import jax.numpy as jnp
    import torch
    import torchax
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax import interop

    env = torchax.default_env()
    first = blocks[0]
    names = [n for n, _ in first.named_parameters()]
    per_block = [dict(b.named_parameters()) for b in blocks]
    for i, params in enumerate(per_block):
        if list(params) != names:
            raise ValueError(
                f"block {i} of the stack has parameters {list(params)[:4]}..., block 0 has "
                f"{names[:4]}...: only identical blocks can be scanned"
            )
    stacked = {n: jnp.stack([interop.jax_view(p[n]) for p in per_block]) for n in names}
    const = interop.jax_view(args)

    stationary = stationary_params(first)

    def body(h: jax.Array, params: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        if mesh is not None and mesh.size > 1:  # FSDP: this layer's weights gathered whole, here
            whole = NamedSharding(mesh, PartitionSpec())
            params = {
                n: p if n in stationary else jax.lax.with_sharding_constraint(p, whole) for n, p in params.items()
            }
        with env:
            out = torch.func.functional_call(
                first, interop.torch_view(params), (interop.torch_view(h), *interop.torch_view(const))
            )
        return interop.jax_view(out), None

    out, _ = jax.lax.scan(body, interop.jax_view(x), stacked)
    return interop.torch_view(out)


@contextlib.contextmanager
def scanned_blocks(mesh: Mesh | None = None) -> Iterator[None]:
    """While tracing: stacks that ask for it (``scan_layers``) run as one scanned block; on a
    ``mesh``, each block gathers its own weights whole (FSDP) before it runs."""
    with block_runner(functools.partial(_scan, mesh=mesh)):
        yield
