"""benchmarks/bench_gpu.py keeps working: its smoke mode compiles tiny for gpu-h100-8 on this CPU
host (a fresh `avatar-release compile` process, XLA's H100 description through the CUDA plugin) and
reads the HBM fit and the per-chunk estimate against the H100's published peaks from the build."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = [pytest.mark.slow, pytest.mark.extra("gpu")]


def test_smoke_mode_compiles_tiny_for_the_h100s_and_estimates_each_stage(tmp_path):
    out = tmp_path / "gpu.json"
    doc = run_smoke("bench_gpu.py", out=out, timeout=600)
    assert "not measurements" in doc["label"]
    (row,) = doc["compiles"]
    assert row["exit_code"] == 0 and row["build_id"].startswith("tiny-gpu-h100-8-") and row["peak_rss_gib"] > 0
    assert row["memory_fit"]["fits"] and row["memory_fit"]["capacity_bytes"] == 84942979072  # the description's
    (chunk,) = row["chunks"]
    assert {s["key"] for s in chunk["stages"]} == set(row["compile_seconds"]) == {"dit/f8", "sr/f8", "vae/f8"}
    assert 0 < chunk["estimated_seconds"] < chunk["deadline_seconds"] == 8 / 25
