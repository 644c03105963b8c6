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
    assert row["stored_bytes"] == row["raw_bytes"] > row["zstd_bytes"]  # raw chunks by default; zstd saves bytes
    modes = row["modes"]
    assert set(modes) == {"ours", "ours-zstd", "safetensors", "zstd-1-thread"}
    ours = modes["ours"]["runs"][0]["steps"]
    assert ours["raw_bytes"] == row["raw_bytes"] and ours["workers"] >= 1
    assert (ours["compression"], ours["read"], ours["decompress"]) == ("none", "node", 0.0) and ours["hash"] > 0
    assert modes["ours-zstd"]["runs"][0]["steps"]["compression"] == "zstd"
    for m in modes.values():
        assert m["seconds"]["min"] <= m["seconds"]["median"] <= m["seconds"]["max"] and m["seconds"]["min"] > 0
        assert all(r["peak_rss_bytes"] > 0 for r in m["runs"])
    assert row["ratios_of_medians"]["ours_vs_safetensors"] > 0 and row["one_layer_change"]["uploaded_bytes"] > 0
