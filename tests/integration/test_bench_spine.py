"""benchmarks/bench_spine.py keeps working: its smoke mode (one chunk, no serial compile) runs the
compile, serve, JIT and eager paths, each in a fresh process, and writes the ratios benchmarks/README.md quotes."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow  # two compiles of tiny (the compile and JIT scenarios)


def test_smoke_mode_runs_every_path_and_the_served_build_never_compiles(tmp_path):
    out = tmp_path / "spine.json"
    doc = run_smoke("bench_spine.py", out=out, timeout=900)
    s = doc["scenarios"]
    assert set(s) == {"compile", "serve", "jit", "eager"} and doc["chunks"] == 1
    compiled = s["compile"]
    assert compiled["build_id"].startswith("tiny-cpu-8-")
    assert {e["key"] for e in compiled["per_executable"]} == {"dit/f8", "sr/f8", "vae/f8"}
    assert all(0 < e["zstd_bytes"] < e["raw_bytes"] and e["compile_s"] > 0 for e in compiled["per_executable"])
    assert compiled["compile_wall_serial_s"] is None  # --smoke skips the serial compile
    served = s["serve"]
    assert served["compiles"] == 0 and served["torch_imported"] is False
    assert 0 < served["load"]["total"] < compiled["trace_lower_compile_s"]
    assert s["jit"]["steady_chunk_s"] > 0 and s["eager"]["chunk_s"] > 0
    ratios = {name: r["value"] for name, r in doc["ratios"].items()}
    assert ratios.pop("concurrent / serial compile wall") is None
    assert len(ratios) == 8 and all(v > 0 for v in ratios.values()), ratios
