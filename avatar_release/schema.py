"""JSON Schema of every on-disk record, exported to ``manifests/schema/`` and checked in.

A test regenerates them and fails if the checked-in files are stale, so a change to a
record is always a visible diff under ``manifests/schema/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .gates.records import Band, CompileGateResult, GateResult, ReviewRecord
from .records import ChannelState, HistoryEntry, Manifest
from .trust.statements import SignedStatement

__all__ = ["SCHEMAS", "render_schemas", "write_schemas"]

SCHEMAS = {
    "build-manifest.v1.json": Manifest,
    "channel-state.v1.json": ChannelState,
    "history-entry.v1.json": HistoryEntry,
    "gate-result.v1.json": GateResult,
    "review.v1.json": ReviewRecord,
    "band.v1.json": Band,
    "signed-statement.v1.json": SignedStatement,
    "compile-gate.v1.json": CompileGateResult,
}


def render_schemas() -> dict[str, str]:
    return {name: json.dumps(cls.model_json_schema(), indent=2, sort_keys=True) + "\n" for name, cls in SCHEMAS.items()}


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in render_schemas().items():
        (directory / name).write_text(text)
        out.append(directory / name)
    return out
