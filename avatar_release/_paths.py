"""Where this user's avatar-release settings live (keys, trust policy, registry config) and what
this machine remembers between runs: the platform's directories, as ``platformdirs`` knows them
(on Linux ``$XDG_CONFIG_HOME`` / ``$XDG_STATE_HOME``, else ``~/.config`` / ``~/.local/state``),
unless an ``AVATAR_RELEASE_*_DIR`` variable names one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

__all__ = ["config_dir", "state_dir", "APP"]

APP = "avatar-release"


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$AVATAR_RELEASE_CONFIG_DIR``, else the user's config directory for avatar-release
    (Linux: ``$XDG_CONFIG_HOME/avatar-release``, else ``~/.config/avatar-release``)."""
    explicit = (os.environ if environ is None else environ).get("AVATAR_RELEASE_CONFIG_DIR")
    return Path(explicit).expanduser() if explicit else platformdirs.user_config_path(APP, appauthor=False)


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """What this machine remembers between runs (the newest signed release state it has seen per
    registry): ``$AVATAR_RELEASE_STATE_DIR``, else the user's state directory for avatar-release
    (Linux: ``$XDG_STATE_HOME/avatar-release``, else ``~/.local/state/avatar-release``)."""
    explicit = (os.environ if environ is None else environ).get("AVATAR_RELEASE_STATE_DIR")
    return Path(explicit).expanduser() if explicit else platformdirs.user_state_path(APP, appauthor=False)
