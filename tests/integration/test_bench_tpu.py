"""benchmarks/bench_tpu.py keeps working: its smoke mode compiles tiny for tpu-v6e-8 on this CPU host
(a fresh `avatar-release compile` process), reads the HBM fit and the per-chunk estimate from the
build, and probes the Ulysses schedule for G = 1, 2."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = [pytest.mark.slow, pytest.mark.extra("tpu")]  # a libtpu compile of tiny: minutes on 2 cores


def test_smoke_mode_compiles_tiny_for_tpu_and_probes_the_schedule(tmp_path):
    out = tmp_path / "tpu.json"
    doc = run_smoke("bench_tpu.py", out=out, timeout=900)
    (row,) = doc["compiles"]
    assert row["exit_code"] == 0 and row["build_id"].startswith("tiny-tpu-v6e-8-") and row["peak_rss_gib"] > 0
    assert row["memory_fit"]["fits"] and 0 < row["memory_fit"]["total_bytes"] < row["memory_fit"]["capacity_bytes"]
    (chunk,) = row["chunks"][:1]
    assert {s["key"] for s in chunk["stages"]} == set(row["compile_seconds"]) == {"dit/f8", "sr/f8", "vae/f8"}
    assert 0 < chunk["estimated_seconds"] and chunk["deadline_seconds"] > 0
    probes = doc["schedule"]["tiny"]
    assert [p["groups"] for p in probes] == [1, 2]
    assert all(p["all_to_alls"] == p["hidden"] + p["exposed"] > 0 for p in probes)
