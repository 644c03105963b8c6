"""benchmarks/bench_checkouts.py keeps working: its smoke mode (this checkout, one round) runs the
release path through the CLI and writes its figures as JSON."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_compiles_and_renders_with_zero_compiles(tmp_path):
    out = tmp_path / "checkouts.json"
    doc = run_smoke("bench_checkouts.py", out=out)
    (row,) = doc["runs"]["after"]
    assert row["compiles"] == 0 and row["build_id"].startswith("tiny-cpu-8-")
    assert row["time_to_ready_seconds"] > 0 and row["steady_chunk_seconds"] > 0
    assert set(doc["medians"]["after"]) == {"compile_process_seconds", "time_to_ready_seconds", "steady_chunk_seconds"}
