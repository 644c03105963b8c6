"""benchmarks/bench_gates.py keeps working: its smoke mode renders the gate set once as a plain
serving process would, gates the build (both twins, fresh processes) and writes the ratio."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_gates_the_build_and_times_it_against_a_plain_render(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "gates.json"
    doc = run_smoke("bench_gates.py", "--registry", str(root), out=out, timeout=900)
    assert doc["build_id"] == result.build_id and doc["gate_alone_status"] == "passed"
    assert doc["gate_set"]["requests"] >= 1 and doc["gate_set"]["frames"] >= doc["gate_set"]["requests"]
    assert doc["plain_render_s"] > 0 and doc["gate_alone_s"] > 0
    assert {"twin_1", "twin_2", "total"} <= set(doc["gate_breakdown_s"])
    assert doc["gate_vs_baseline_s"] is None  # --smoke: no tier-2 candidate
    (ratio,) = doc["ratios"].values()
    assert ratio["value"] > 0 and ratio["goal_max"] == 3.0
