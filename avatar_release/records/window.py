"""The support window of every stored record kind: which schema versions this avatar-release reads.

The rule is one line (``_base.oldest_supported``): the current version of a kind (its
``*_SCHEMA_VERSION``, what this tool writes) and the one before it. ``support_windows`` applies it
to every stored kind from its current version, so a new version moves the window with it.
A record outside the window is refused naming the kind, its version, the window and what to do
(``parse_record``); the docs site's record formats page lists this table (a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import STORED_KINDS
from ._base import RECORD_FORMATS_PAGE, SUPPORTED_VERSIONS, UPGRADE, oldest_supported, readable_versions

__all__ = [
    "SUPPORTED_VERSIONS",
    "UPGRADE",
    "RECORD_FORMATS_PAGE",
    "SupportWindow",
    "support_windows",
    "oldest_supported",
]


@dataclass(frozen=True)
class SupportWindow:
    """One kind's window: the versions read (``oldest``..``current``) and what to do with an older record."""

    stem: str  # the file-name stem of its schema and stored examples, e.g. "build-manifest"
    kind: str  # e.g. "avatar-release/build"
    oldest: int
    current: int
    upgrade: str


def support_windows() -> list[SupportWindow]:
    """Every stored kind's window, in the order of ``STORED_KINDS``."""
    out = []
    for stem, cls in STORED_KINDS.items():
        kind, oldest, current = readable_versions(cls)
        out.append(SupportWindow(stem, kind, oldest, current, UPGRADE.get(kind, "")))
    return out
