"""Plain text tables, as kubectl prints them: a header row, columns as wide as their widest cell,
two spaces between, no trailing blanks. Nothing else (no colour, no box drawing): output that
``grep``, ``awk`` and ``cut`` read as well as people do."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, header: bool = True) -> str:
    """``rows`` under ``headers`` in aligned columns (the last column is never padded)."""
    shown = [list(headers), *map(list, rows)] if header else [list(r) for r in rows]
    if not shown:
        return ""
    widths = [max(len(r[i]) for r in shown) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in shown)
