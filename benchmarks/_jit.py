"""The JIT path, for benchmarks that hold the loader against it: trace, lower and compile a
pipeline from its model code in this process, then serve it through the same stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["jit_build"]


def jit_build(
    pipeline: str,
    target: str,
    *,
    overrides: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Any, Any]:
    """(LoadedBuild, CompileResult) of ``pipeline`` for ``target`` (with config ``overrides``),
    compiled here and never published; ``progress`` gets compile's progress messages."""
    # Imported when called: each benchmark sets XLA_FLAGS (the device count) before JAX starts.
    from avatar_release._dtypes import np_dtype
    from avatar_release.compile import compile_build
    from avatar_release.machine import keep_freed_memory
    from avatar_release.registry import MemoryRegistry
    from avatar_release.runtime import assemble

    keep_freed_memory()  # the allocator every loading process runs with: programs compared, not mallocs
    res = compile_build(
        pipeline,
        target,
        registry=MemoryRegistry(),
        publish=False,
        keep_compiled=True,
        overrides=overrides,
        **({"progress": progress} if progress else {}),
    )
    host = {t.name: t.data.view(np_dtype(t.dtype)).reshape(t.shape) for t in res.weight_tensors}
    return assemble(res.manifest, res.compiled, host), res
