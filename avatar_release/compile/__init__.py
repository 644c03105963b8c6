"""Trace, lower and AOT-compile a pipeline for a target; publish the result as a build.

Needs the ``compile`` extra (torch, torchax). Nothing is imported until called.
"""

from ._autotune_results import AutotuneResults, read_results
from ._build import EXECUTABLE_MEDIA_TYPE, CompileResult, compile_build
from ._devices import make_mesh, target_devices
from ._evidence import schedule_of
from ._overrides import apply_overrides, override_keys, parse_set_args
from ._rebuild import RebuildReport, rebuild, rebuild_manifest
from ._tune import AutotuneReport, autotune_build

__all__ = [
    "CompileResult",
    "compile_build",
    "apply_overrides",
    "override_keys",
    "parse_set_args",
    "rebuild",
    "rebuild_manifest",
    "RebuildReport",
    "autotune_build",
    "AutotuneReport",
    "AutotuneResults",
    "read_results",
    "make_mesh",
    "target_devices",
    "schedule_of",
    "EXECUTABLE_MEDIA_TYPE",
]
