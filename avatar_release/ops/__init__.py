"""Operations over whole stores, above every room that writes to them: garbage collection, copy, repair."""

from __future__ import annotations

from .copy import CopyReport, copy_build
from .gc import GcReport, collect_garbage
from .repair import RepairReport, repair_build

__all__ = ["GcReport", "collect_garbage", "CopyReport", "copy_build", "RepairReport", "repair_build"]
