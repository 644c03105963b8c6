"""Operations over a whole store, above every room that writes to it: garbage collection."""

from __future__ import annotations

from .gc import GcReport, collect_garbage

__all__ = ["GcReport", "collect_garbage"]
