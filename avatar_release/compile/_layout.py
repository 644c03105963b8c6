"""The compiler's side of the pipeline contract's layout hints: each hint becomes a sharding constraint on the mesh.

Why: in the super-resolution stage the reference frame's tokens (one frame, computed from the
photo with FSDP-sharded weights) are concatenated in front of the video's frames (sharded over
the mesh by frame). F + 1 frames do not split over 8 devices, so the partitioner shards the
concatenation by tokens, and from the sharding it had guessed for the reference tokens it could
only get there by replicating the tensor first: XLA's "[SPMD] Involuntary full
rematerialization" warning on every build. Pinned as replicated (one frame of tokens, gathered
once per chunk), the reference tokens reach any layout by a local slice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..pipeline import layout_hints

if TYPE_CHECKING:  # only for annotations: torch and JAX load only while tracing
    import torch
    from jax.sharding import Mesh

__all__ = ["pinned_layouts"]


@contextlib.contextmanager
def pinned_layouts(mesh: Mesh) -> Iterator[None]:
    """While tracing for ``mesh``: layout hints pin shardings (a 1-device mesh: no-op)."""

    def hint(x: torch.Tensor, layout: str) -> torch.Tensor:
        # Lazy (compile extra): torch and torchax load only while tracing a PyTorch stage.
        import jax
        from jax.sharding import NamedSharding, PartitionSpec
        from torchax import interop

        if layout != "replicated":
            raise ValueError(f"unknown layout hint {layout!r}")
        if mesh.size == 1:
            return x
        pinned = jax.lax.with_sharding_constraint(interop.jax_view(x), NamedSharding(mesh, PartitionSpec()))
        return interop.torch_view(pinned)

    with layout_hints(hint):
        yield
