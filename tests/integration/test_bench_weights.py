"""benchmarks/bench_weights.py keeps working: its smoke mode (16 MiB) writes chunked weights, loads
them with the streaming loader in a fresh process, beside the safetensors and one-thread zstd
anchors, and writes every figure benchmarks/README.md quotes."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_loads_chunked_weights_beside_both_anchors(tmp_path):
    out = tmp_path / "weights.json"
    doc = run_smoke("bench_weights.py", out=out, timeout=600)
    (row,) = doc["sizes"]
    assert row["raw_bytes"] == 16 << 20 and row["chunks"] >= 1
    ours = row["runs"]["ours"]
    assert ours["steps"]["raw_bytes"] == row["raw_bytes"] and ours["steps"]["workers"] >= 1
    assert set(row["runs"]) == {"ours", "safetensors", "zstd-1-thread"}
    assert all(r["seconds"] > 0 and r["peak_rss_bytes"] > 0 for r in row["runs"].values())
    assert row["ours_vs_safetensors"] > 0 and row["one_layer_change"]["uploaded_bytes"] > 0
