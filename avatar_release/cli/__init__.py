"""The ``avatar-release`` command line: parse, call one function, print (human or ``--json``),
and map the exception tree to exit codes (``_app``). One module per family of commands; each
command's body is a call into the room that does the work.
"""

from __future__ import annotations

from . import _analyze_cmds, _build_cmds, _completion_cmds, _diff_cmds, _gate_cmds, _registry_cmds, _release_cmds, _serve_cmds  # noqa: F401 - registers commands
from ._app import cli, main

__all__ = ["cli", "main"]
