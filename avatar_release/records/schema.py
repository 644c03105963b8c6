"""JSON Schema of every stored record kind, exported to ``manifests/schema/`` and checked in.

One file per kind and version (``build-manifest.v2.json``); files of released older versions
stay as they were. A test regenerates the current ones and fails if a checked-in file is
stale, so a change to a record is always a visible diff under ``manifests/schema/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import _atomic
from . import STORED_KINDS
from ._base import Record, readable_versions

__all__ = ["schema_files", "render_schemas", "write_schemas"]


def schema_files() -> dict[str, type[Record]]:
    """{file name: record class} for the version of every kind this tool writes."""
    out: dict[str, type[Record]] = {}
    for stem, cls in STORED_KINDS.items():
        _, _, newest = readable_versions(cls)
        out[f"{stem}.v{newest}.json"] = cls
    return out


def render_schemas() -> dict[str, str]:
    return {
        name: json.dumps(cls.model_json_schema(), indent=2, sort_keys=True) + "\n"
        for name, cls in schema_files().items()
    }


def write_schemas(directory: Path) -> list[Path]:
    out: list[Path] = []
    for name, text in render_schemas().items():
        _atomic.write_text(Path(directory) / name, text)
        out.append(Path(directory) / name)
    return out
