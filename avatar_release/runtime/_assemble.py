"""A LoadedBuild from programs compiled in this process: the JIT path that benchmarks hold the
loader against (the same stages, weights and stream, without fetching or deserializing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..records import Manifest
from ..registry import Resolved
from ._guard import CompileGuard
from ._load import LoadedBuild, LoadedStage, LoadTimings, devices_for
from ._weights import place_weights, sharding_of

__all__ = ["assemble"]


def assemble(
    manifest: Manifest, executables: Mapping[str, Any], host_weights: Mapping[str, np.ndarray], *, strict: bool = False
) -> LoadedBuild:
    """``manifest``'s stages over ``executables`` (jax Compiled, by executable key) with
    ``host_weights`` placed on the build's mesh; the guard counts compiles (``strict``: refuses them)."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    p = manifest.platform
    mesh = jax.sharding.Mesh(np.array(devices_for(manifest)).reshape(p.mesh_shape), tuple(p.mesh_axes))
    stages = {
        (e.stage, e.bucket): LoadedStage(e, executables[e.key], [sharding_of(mesh, s) for s in e.inputs], {})
        for e in manifest.executables
    }
    place_weights(manifest, stages, dict(host_weights), mesh)
    return LoadedBuild(
        Resolved("jit", manifest.build_id, "", "jit"),
        manifest,
        "memory",
        mesh,
        stages,
        LoadTimings(),
        CompileGuard(strict=strict),
    )
