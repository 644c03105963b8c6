"""The ``avatar-release`` command line: parse, call one function, print (human or ``--json``),
and map the exception tree to exit codes (``_app``). One module per family of commands, each
loaded when one of its commands is used (``_app.COMMANDS``); each command's body is a call into
the room that does the work.
"""

from __future__ import annotations

from ._app import COMMANDS, cli, load_commands, main

__all__ = ["cli", "main", "COMMANDS", "load_commands"]
