"""Pointing dev at a build that was just published: a channel move that needs the registry only."""

from __future__ import annotations

from ..machine import who as who_is_acting
from ..records import HistoryEntry
from ._protocol import Registry, Resolved

__all__ = ["publish_to_dev"]


def publish_to_dev(registry: Registry, resolved: Resolved, *, reason: str,
                   who: str | None = None) -> HistoryEntry | None:
    """Point dev at a build that was just published (history action "publish").

    Dev takes any compiled build, so no policy is consulted. The compare-and-swap is against
    where dev is read here: a concurrent move in between is a ConflictError, nothing changed.
    None when dev already pointed at the build.
    """
    current = registry.get_channel("dev")
    return registry.move_channel("dev", resolved, expected_digest=current.digest if current else None,
                                 action="publish", who=who or who_is_acting(), reason=reason)
