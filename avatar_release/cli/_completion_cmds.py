"""``avatar-release completion SHELL``: the shell's completion script, as kubectl and docker print theirs.

Completion itself is click's: the script calls back into ``avatar-release`` with
``_AVATAR_RELEASE_COMPLETE`` set, and each REF argument completes from the registry the
command would use (channels that hold a build, then build ids); channel options complete
from the fixed list.
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from ._app import cli

_SHELLS = ("bash", "zsh", "fish")
_INSTALL = {
    "bash": "echo 'eval \"$(avatar-release completion bash)\"' >> ~/.bashrc",
    "zsh": "echo 'eval \"$(avatar-release completion zsh)\"' >> ~/.zshrc",
    "fish": "avatar-release completion fish > ~/.config/fish/completions/avatar-release.fish",
}


@cli.command("completion", epilog="\b\nInstall:\n" + "\n".join(f"  {s}: {c}" for s, c in _INSTALL.items()))
@click.argument("shell", type=click.Choice(_SHELLS))
def completion_cmd(shell: str) -> None:
    """Print the completion script for SHELL (commands, options, channels, and build ids from the registry)."""
    cls = get_completion_class(shell)
    assert cls is not None  # every name in _SHELLS is one click ships
    click.echo(cls(cli, {}, "avatar-release", "_AVATAR_RELEASE_COMPLETE").source())
