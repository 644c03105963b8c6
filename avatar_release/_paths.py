"""Where this user's avatar-release settings live (keys, trust policy, registry config)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["config_dir", "state_dir"]


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$AVATAR_RELEASE_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/avatar-release``, else ``~/.config/avatar-release``."""
    env = os.environ if environ is None else environ
    explicit = env.get("AVATAR_RELEASE_CONFIG_DIR")
    if explicit:
        return Path(explicit)
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "avatar-release"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """What this machine remembers between runs (the newest signed release state it has seen per
    registry): ``$AVATAR_RELEASE_STATE_DIR``, else ``$XDG_STATE_HOME/avatar-release``, else
    ``~/.local/state/avatar-release``."""
    env = os.environ if environ is None else environ
    explicit = env.get("AVATAR_RELEASE_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "avatar-release"
