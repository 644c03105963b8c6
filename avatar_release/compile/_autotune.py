"""What a GPU build's autotuning rests on, read from its compiled programs (manifest v6 ``autotune``).

XLA:GPU picks, for each GEMM, convolution and tiled fusion, a config (a Triton tiling, a cuBLAS or
cuDNN algorithm) by measuring candidates on the device while it compiles. Without the device it
measures nothing (openxla/xla, ``xla/service/gpu/autotuning/autotuner_pass.cc``,
``GetConfigAssignerOptions``: a deviceless compile sets ``use_default_config``), and a cuDNN
convolution is given algorithm ``-1``, "which means that we autotune at runtime"
(``conv_algorithm_picker.cc``, ``PickBestAlgorithmNoCache``). With the deterministic flags
(``xla_gpu_deterministic_ops`` or ``xla_gpu_exclude_nondeterministic_ops``) XLA selects the first
valid config instead of the fastest even with a device (``select_first_config``, same function).

So the record says, per executable, how many instructions carry a config nobody measured and how
many convolutions a pod will choose an algorithm for when it first runs them (JAX reports no compile
event for that: docs/how-to/gpu-builds.md). Text analysis of the scheduled HLO: compiler evidence, not a
measurement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records import AutotuneFinding, AutotuneRecord, BlobRef
from ._autotune_results import AutotuneResults

__all__ = ["autotune_finding", "autotune_record", "AUTOTUNE_OPTIONS", "AutotunePlan", "RESULTS_MEDIA_TYPE"]

RESULTS_MEDIA_TYPE = "application/vnd.avatar-release.autotune-results.v1.textproto+zstd"
# Options naming files on the compiling host: recorded by what they held (the results' digest), not the path.
_PATH_OPTIONS = (
    "xla_gpu_load_autotune_results_from",
    "xla_gpu_dump_autotune_results_to",
    "xla_gpu_per_fusion_autotune_cache_dir",
)


@dataclass(frozen=True)
class AutotunePlan:
    """What a compile does about autotuning beyond its flag profile (``avatar-release autotune``).

    ``results``: load these (written to ``results_file`` for XLA) and, with ``require_complete``,
    refuse to compile any instruction they lack a config for. ``dump_to``: a directory where XLA
    writes what it chose while compiling, one file a stage (on the build's GPUs: what it measured)."""

    results: AutotuneResults | None = None
    require_complete: bool = True
    results_file: Path | None = None
    dump_to: Path | None = None

    def compiler_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.results is not None:
            assert self.results_file is not None, "results are handed to XLA as a file"
            options["xla_gpu_load_autotune_results_from"] = str(self.results_file)
            options["xla_gpu_require_complete_aot_autotune_results"] = self.require_complete
        return options  # a dump is one file a stage: the compile names it (compile._build._stage_options)


# Compiler options that decide what XLA:GPU autotunes; recorded as the flag profile sets them.
AUTOTUNE_OPTIONS = (
    "xla_gpu_autotune_level",
    "xla_gpu_deterministic_ops",
    "xla_gpu_exclude_nondeterministic_ops",
    "xla_gpu_require_complete_aot_autotune_results",
    "xla_gpu_load_autotune_results_from",
    "xla_gpu_per_fusion_autotune_cache_dir",
    "xla_gpu_experimental_autotune_cache_mode",
    "xla_gpu_cudnn_gemm_fusion_level",
    "xla_gpu_experimental_enable_fusion_autotuner",
)

_CONV = re.compile(r'custom_call_target="__cudnn\$conv[A-Za-z]*"')
_CONV_AT_RUN_TIME = re.compile(r'"algorithm"\s*:\s*\{\s*"algo_id"\s*:\s*"-1"')
_CUBLAS = re.compile(r'custom_call_target="__cublas\$(?:gemm|lt\$matmul[^"]*)"')
_FUSION_KIND = re.compile(r'"fusion_backend_config"\s*:\s*\{\s*"kind"\s*:\s*"([^"]+)"')
# Fusion kinds whose config the GEMM autotuner chooses (Triton GEMM, cuDNN, custom kernels), and
# the block-level (tiled) Triton fusions a generic config covers (softmax, reductions).
_GEMM_KINDS = ("__triton_gemm", "__triton_nested_gemm_fusion", "__cudnn$fusion", "__custom_fusion")
_BLOCK_KINDS = ("__triton",)


def autotune_finding(hlo: str) -> AutotuneFinding:
    """Count what one compiled program carries that autotuning would decide (loops not multiplied:
    instructions, not executions)."""
    convs = conv_at_run_time = gemms = cublas = blocks = 0
    for line in hlo.splitlines():
        if _CONV.search(line):
            convs += 1
            conv_at_run_time += bool(_CONV_AT_RUN_TIME.search(line))
            continue
        if _CUBLAS.search(line):
            cublas += 1
            continue
        m = _FUSION_KIND.search(line)
        if m and " fusion(" in line:
            gemms += m.group(1) in _GEMM_KINDS
            blocks += m.group(1) in _BLOCK_KINDS
    return AutotuneFinding(
        convolutions_at_run_time=conv_at_run_time, gemm_fusions=gemms, cublas_calls=cublas, block_fusions=blocks
    )


def autotune_record(
    hlos: Mapping[str, str],
    options: Mapping[str, Any],
    *,
    deviceless: bool,
    results: AutotuneResults | None = None,
    results_blob: BlobRef | None = None,
) -> AutotuneRecord:
    """The build's record: ``hlos`` by executable key, ``options`` the compile's (the flag profile's,
    and any an :class:`AutotunePlan` added), ``results`` the autotune results it loaded."""
    findings = {key: autotune_finding(text) for key, text in hlos.items()}
    settings = {k: options[k] for k in AUTOTUNE_OPTIONS if k in options and k not in _PATH_OPTIONS}
    select_first = bool(
        options.get("xla_gpu_deterministic_ops")
        or options.get("xla_gpu_exclude_nondeterministic_ops")
        or options.get("xla_gpu_autotune_level") == 0
    )
    loaded: dict[str, Any] = {}
    if results is not None:
        loaded = {
            "results": results.digest,
            "results_blob": results_blob,
            "results_size": len(results.text),
            "results_entries": results.entries,
            "complete_required": bool(options.get("xla_gpu_require_complete_aot_autotune_results")),
        }
    return AutotuneRecord(
        deviceless=deviceless,
        select_first=select_first,
        settings=settings,
        executables=findings,
        convolutions_at_run_time=sum(f.convolutions_at_run_time for f in findings.values()),
        **loaded,
    )
