"""Trace, lower and AOT-compile a pipeline for a target; publish the result as a build.

Needs the ``compile`` extra (torch, torchax). Nothing is imported until called.
"""

from ._build import EXECUTABLE_MEDIA_TYPE, WEIGHTS_MEDIA_TYPE, CompileResult, compile_build, source_digest
from ._overrides import apply_overrides, override_keys, parse_set_args

__all__ = [
    "CompileResult",
    "compile_build",
    "source_digest",
    "apply_overrides",
    "override_keys",
    "parse_set_args",
    "EXECUTABLE_MEDIA_TYPE",
    "WEIGHTS_MEDIA_TYPE",
]
