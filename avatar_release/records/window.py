"""The support window of every stored record kind: which schema versions this avatar-release reads.

The rule is one line (``_base.oldest_supported``): the current version of a kind (its
``*_SCHEMA_VERSION``, what this tool writes) and the one before it. The constants below spell it
out per kind; each follows its kind's current version, so a new version moves the window with it.
A record outside the window is refused naming the kind, its version, the window and what to do
(``parse_record``); the docs site's record formats page lists this table (a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import STORED_KINDS
from ._base import RECORD_FORMATS_PAGE, SUPPORTED_VERSIONS, UPGRADE, oldest_supported, readable_versions
from .build import BUILD_SCHEMA_VERSION
from .channel import CHANNEL_SCHEMA_VERSION, HISTORY_SCHEMA_VERSION
from .gate import (
    BAND_SCHEMA_VERSION,
    COMPILE_GATE_SCHEMA_VERSION,
    GATE_RESULT_SCHEMA_VERSION,
    GATE_SHARD_SCHEMA_VERSION,
)
from .move import MOVE_SCHEMA_VERSION
from .review import REVIEW_SCHEMA_VERSION
from .statement import STATEMENT_SCHEMA_VERSION, TIMESTAMP_SCHEMA_VERSION

__all__ = [
    "SUPPORTED_VERSIONS",
    "UPGRADE",
    "RECORD_FORMATS_PAGE",
    "SupportWindow",
    "support_windows",
    "BUILD_OLDEST_SUPPORTED",
    "GATE_RESULT_OLDEST_SUPPORTED",
    "BAND_OLDEST_SUPPORTED",
    "COMPILE_GATE_OLDEST_SUPPORTED",
    "GATE_SHARD_OLDEST_SUPPORTED",
    "REVIEW_OLDEST_SUPPORTED",
    "STATEMENT_OLDEST_SUPPORTED",
    "TIMESTAMP_OLDEST_SUPPORTED",
    "CHANNEL_OLDEST_SUPPORTED",
    "HISTORY_OLDEST_SUPPORTED",
    "MOVE_OLDEST_SUPPORTED",
]

BUILD_OLDEST_SUPPORTED = oldest_supported(BUILD_SCHEMA_VERSION)
GATE_RESULT_OLDEST_SUPPORTED = oldest_supported(GATE_RESULT_SCHEMA_VERSION)
BAND_OLDEST_SUPPORTED = oldest_supported(BAND_SCHEMA_VERSION)
COMPILE_GATE_OLDEST_SUPPORTED = oldest_supported(COMPILE_GATE_SCHEMA_VERSION)
GATE_SHARD_OLDEST_SUPPORTED = oldest_supported(GATE_SHARD_SCHEMA_VERSION)
REVIEW_OLDEST_SUPPORTED = oldest_supported(REVIEW_SCHEMA_VERSION)
STATEMENT_OLDEST_SUPPORTED = oldest_supported(STATEMENT_SCHEMA_VERSION)
TIMESTAMP_OLDEST_SUPPORTED = oldest_supported(TIMESTAMP_SCHEMA_VERSION)
CHANNEL_OLDEST_SUPPORTED = oldest_supported(CHANNEL_SCHEMA_VERSION)
HISTORY_OLDEST_SUPPORTED = oldest_supported(HISTORY_SCHEMA_VERSION)
MOVE_OLDEST_SUPPORTED = oldest_supported(MOVE_SCHEMA_VERSION)


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
