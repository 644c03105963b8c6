"""``avatar-release autotune``: a GPU build compiled again with autotune results, as a new build.

A build compiled without its GPUs carries configs nobody measured (default GEMM tilings, cuDNN
convolutions left to choose an algorithm when they first run, which a pod would do at start).
Autotuning gives the compile what it lacked:

1. **measure** (on a host with the build's GPUs): compile the build's source once on them with
   ``xla_gpu_dump_autotune_results_to``, one results file per stage, merged into one
   (``_autotune_results``); or take results recorded there earlier (``results=``);
2. **compile again** with ``xla_gpu_load_autotune_results_from`` and, unless told otherwise,
   ``xla_gpu_require_complete_aot_autotune_results``: XLA then refuses any instruction the results
   lack a config for instead of falling back, so the build it publishes leaves nothing to tune;
3. **publish** that as a new build: the results are kept in it (a blob) and their digest is part of
   its identity (``records/identity.py``), so two builds tuned differently never share an id.

The source must be the one the build was compiled from (its source digest is checked before
anything is traced). Measuring needs the GPUs; everything else runs anywhere the GPU compiler does.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CompileError, InputError
from ..records import Manifest, check_identity
from ..registry import Registry, read_manifest
from ..specs import load_target
from ._autotune import AutotunePlan
from ._autotune_results import AutotuneResults, merge_results
from ._build import compile_build
from ._devices import measuring_gpus
from ._rebuild import build_inputs

__all__ = ["AutotuneReport", "autotune_build"]


@dataclass
class AutotuneReport:
    build_id: str  # the build tuned
    tuned_id: str  # the new build
    digest: str  # the new build's manifest digest
    created: bool
    measured_on: str | None  # "8 x NVIDIA H100 80GB HBM3" when measured here; None when results were given
    results: AutotuneResults
    complete_required: bool
    convolutions_at_run_time: tuple[int, int]  # (before, after): what a pod would still tune at start
    wall_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "build_id": self.build_id,
            "tuned_id": self.tuned_id,
            "digest": self.digest,
            "created": self.created,
            "measured_on": self.measured_on,
            "results": self.results.digest,
            "results_entries": self.results.entries,
            "results_size": len(self.results.text),
            "complete_required": self.complete_required,
            "convolutions_at_run_time": {
                "before": self.convolutions_at_run_time[0],
                "after": self.convolutions_at_run_time[1],
            },
            "wall_seconds": round(self.wall_seconds, 3),
        }


def autotune_build(
    ref: str,
    registry: Registry,
    *,
    results: AutotuneResults | None = None,
    require_complete: bool = True,
    save_results: Path | None = None,
    progress: Callable[[str], None] = lambda msg: None,
) -> AutotuneReport:
    """Tune the GPU build ``ref`` names (see the module) and publish the tuned build; dev is left alone."""
    t0 = time.perf_counter()
    _, m = read_manifest(registry, ref)
    check_identity(m)  # nothing from an edited manifest is compiled
    before = _tunable(m)
    measured_on = None
    if results is None:
        gpus = measuring_gpus(load_target(m.target))
        measured_on = f"{len(gpus)} x {gpus[0].device_kind}"
        progress(f"measuring autotune configs for {m.build_id} on {measured_on}")
        results = _measure(m, registry, progress)
    if save_results is not None:
        save_results.write_bytes(results.text)
    progress(
        f"compiling {m.build_id} with {results.entries} autotune results ({results.digest[:19]}), "
        + ("every config required" if require_complete else "XLA's defaults where one is missing")
    )
    tuned = compile_build(
        **build_inputs(m),
        registry=registry,
        expect_source=m.source_digest,
        move_dev=False,
        autotune=AutotunePlan(results=results, require_complete=require_complete),
        progress=progress,
    )
    assert tuned.manifest is not None and tuned.manifest.autotune is not None  # a GPU build always records it
    return AutotuneReport(
        m.build_id,
        tuned.build_id,
        tuned.digest,
        tuned.created,
        measured_on,
        results,
        require_complete,
        (before, tuned.manifest.autotune.convolutions_at_run_time),
        time.perf_counter() - t0,
    )


def _tunable(m: Manifest) -> int:
    """What the build leaves to tune at start (convolutions); InputError for a build with nothing to tune."""
    if m.platform.backend != "gpu" or m.autotune is None:
        raise InputError(
            f"build {m.build_id} is a {m.platform.backend} build: autotune is for GPU builds (XLA:GPU "
            "picks GEMM tilings and convolution algorithms by measuring them on the device; "
            f"{m.platform.backend} builds have nothing to measure)"
        )
    return m.autotune.convolutions_at_run_time


def _measure(m: Manifest, registry: Registry, progress: Callable[[str], None]) -> AutotuneResults:
    """Compile the build's source on this host's GPUs, XLA writing what it chose; the files merged."""
    with tempfile.TemporaryDirectory(prefix="avatar-release-measure-") as scratch:
        out = Path(scratch)
        compile_build(
            **build_inputs(m),
            registry=registry,
            expect_source=m.source_digest,
            publish=False,
            autotune=AutotunePlan(dump_to=out),
            progress=progress,
        )
        parts = [p.read_bytes() for p in sorted(out.glob("*.textproto"))]
    if not parts:
        raise CompileError(
            f"build {m.build_id}: XLA wrote no autotune results while compiling on the GPUs "
            "(xla_gpu_dump_autotune_results_to): nothing to tune with"
        )
    return merge_results(parts, where=f"autotune results measured for {m.build_id}")
