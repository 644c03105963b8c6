"""Which exit codes each command can end with, shown at the end of its ``--help``.

The meanings come from one table (``EXIT_MEANINGS``, the same as the docs site's Reference > Exit
codes, which a test holds to it); the codes a command can return follow from the rooms it calls.
Every command can also end 0 (done), 2 (bad input or usage) and 70 (a crash: a bug, never a refusal).
"""

from __future__ import annotations

import click

from ..errors import CRASH_EXIT_CODE

__all__ = ["EXIT_MEANINGS", "COMMAND_CODES", "codes_for", "ExitCodesCommand", "ExitCodesGroup", "exit_codes_epilog"]

EXIT_MEANINGS: dict[int, str] = {
    0: "done",
    1: "a gate or policy said no (the reason is in the message)",
    2: "bad input or usage",
    3: "not found (build, channel, blob, registry)",
    4: "integrity or trust: stored bytes or a signature do not check out",
    5: "this machine differs from the build's",
    6: "compile error",
    7: "registry unreachable or failed",
    8: "XLA compiled while serving",
    9: "ffmpeg failed",
    11: "a record from a newer (or too old) avatar-release",
    12: "a gate run could not complete (no verdict)",
    13: "below the band: a blind review decides",
    CRASH_EXIT_CODE: "crash (a bug; please report it)",
}

_REGISTRY = (3, 7, 11)  # every command that reads a registry
_LOADS = (*_REGISTRY, 4, 5, 8)  # every command that loads a build as a pod does
COMMAND_CODES: dict[str, tuple[int, ...]] = {
    "compile": (3, 5, 6, 7, 11),
    "rebuild": (1, *_REGISTRY, 4, 5, 6),
    "autotune": (*_REGISTRY, 4, 5, 6),
    "inspect": _REGISTRY,
    "verify": (*_REGISTRY, 4),
    "diff": (1, *_REGISTRY),
    "ls": _REGISTRY,
    "registries": (3,),
    "completion": (),
    "specs": (),  # reads no project and no registry: only the models
    "copy": (*_REGISTRY, 4),
    "repair": (*_REGISTRY, 4),
    "gate": (1, *_LOADS, 6, 12, 13),
    "gate run": (1, *_LOADS, 12, 13),
    "gate merge": (1, *_REGISTRY, 4, 12, 13),
    "gate calibrate": (*_REGISTRY, 5, 6, 8, 12),
    "gate compile": (1, *_REGISTRY, 4, 6),
    "gate inputs": (4,),  # reads the project and the trust policy, no registry
    "promote": (1, *_REGISTRY, 4, 13),
    "rollback": (1, *_REGISTRY, 4),
    "approve": (1, *_REGISTRY, 4),
    "revoke": (*_REGISTRY, 4),
    "history": (*_REGISTRY, 4),
    "registry": (1, *_REGISTRY, 4),  # init/upgrade refuse a registry that has state (1); signed-state checks (4)
    "gc": _REGISTRY,
    "render": (*_LOADS, 9),
    "serve": _LOADS,
    "review": (1, *_REGISTRY, 4),
    "keys": (*_REGISTRY, 4),
    "analyze": (*_REGISTRY, 5, 6),
}


def codes_for(path: str) -> tuple[int, ...]:
    """The codes command ``path`` (``"gate run"``) can end with, in order; a subcommand without its
    own entry takes its group's."""
    own = COMMAND_CODES.get(path) or COMMAND_CODES.get(path.split(" ")[0], ())
    return tuple(sorted({0, 2, CRASH_EXIT_CODE, *own}))


def exit_codes_epilog(path: str) -> str:
    return "Exit codes: " + "; ".join(f"{c} {EXIT_MEANINGS[c]}" for c in codes_for(path)) + "."


def _path(ctx: click.Context) -> str:
    """``gate run`` from click's own ``avatar-release gate run``."""
    return ctx.command_path.partition(" ")[2]


def _write_codes(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    formatter.write_paragraph()
    with formatter.indentation():
        formatter.write_text(exit_codes_epilog(_path(ctx)))


class ExitCodesCommand(click.Command):
    """A command whose ``--help`` ends with the exit codes it can return."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        _write_codes(ctx, formatter)


class ExitCodesGroup(click.Group):
    """A command group whose commands (and subgroups) end their ``--help`` with their exit codes."""

    command_class = ExitCodesCommand

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if ctx.parent is not None:  # the top level's help lists commands, not outcomes
            _write_codes(ctx, formatter)


ExitCodesGroup.group_class = ExitCodesGroup
