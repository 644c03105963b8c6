"""Where a benchmark's figures go: one JSON document, written atomically and (if asked) printed.

The committed figures live in ``benchmarks/results/``; benchmarks/README.md quotes them. A ``--smoke`` run
proves that a benchmark still runs against the package (seconds, the smallest sizes): its figures
are not results, so it writes only where ``--out`` says, and never into ``benchmarks/results/``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the package (and the bundled pipeline) from this checkout

from avatar_release._atomic import write_text  # noqa: E402 (after the path above)

RESULTS = ROOT / "benchmarks" / "results"

__all__ = ["RESULTS", "out_path", "write_results"]


def out_path(out: str | Path | None, name: str | None, *, smoke: bool) -> Path | None:
    """``--out`` if given; else ``benchmarks/results/NAME.json`` for a full run (``name`` None:
    print only), and nowhere for a smoke run."""
    if out is not None:
        return Path(out)
    if smoke or name is None:
        return None
    return RESULTS / f"{name}.json"


def write_results(
    doc: dict | list, out: str | Path | None, *, smoke: bool, echo: bool = False, sort_keys: bool = False, default=None
) -> dict | list:
    """Write ``doc`` as indented JSON to ``out`` (if not None) and print it (``echo``) or where it went."""
    text = json.dumps(doc, indent=2, sort_keys=sort_keys, default=default)
    if out is not None:
        out = Path(out).resolve()
        if smoke and out.is_relative_to(RESULTS.resolve()):
            raise SystemExit(f"{out}: a --smoke run's figures are not results; give --out a path outside {RESULTS}")
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, text + "\n")
    if echo:
        print(text)
    elif out is not None:
        print(f"written to {out}")
    return doc
