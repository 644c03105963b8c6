"""benchmarks/bench_compile_wall.py keeps working: its smoke mode (this checkout, the example
project, one round) compiles through the CLI and writes its figures as JSON."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_compiles_the_example_project_and_writes_its_figures(tmp_path):
    doc = run_smoke("bench_compile_wall.py", out=tmp_path / "compile_wall.json")
    entry = doc["projects"]["puppet-tiny"]
    (row,) = entry["runs"]["after"]
    assert row["build_id"].startswith("puppet-tiny-cpu-8-") and row["compiled"] == row["executables"] == 2
    assert entry["medians"]["after"]["process_seconds"] > entry["medians"]["after"]["compile_wall_seconds"] > 0
