"""benchmarks/bench_flash.py keeps working: its smoke mode compiles the tiny pipeline's DiT attention
layer for tpu-v6e-8 through libtpu, dense and flash, and writes XLA's estimates beside the kernel's."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = [pytest.mark.extra("tpu")]  # two libtpu compiles of one attention layer: seconds, in the fast lane


def test_smoke_mode_compiles_dense_and_flash_attention_for_tpu(tmp_path):
    out = tmp_path / "flash.json"
    (row,) = run_smoke("bench_flash.py", out=out, timeout=600)
    assert row["pipeline"] == "tiny" and row["label"] == "compiler estimates, not measurements"
    assert row["heads_per_chip"] * 8 == row["heads"] and row["calls_per_chunk"] > 0
    for name in ("dense", "flash"):
        r = row[name]
        assert r["xla_flops_per_chip_chunk"] > 0 and r["xla_bytes_per_chip_chunk"] > 0 and r["compile_seconds"] > 0
        assert r["memory_floor_s"] > 0 and r["compute_floor_s"] > 0
    bq, bk = row["flash"]["blocks"]
    assert row["seq"] % bq == 0 and row["seq"] % bk == 0 and row["flash"]["estimate_flops_per_chip_chunk"] > 0
    assert row["dense"]["floor_bytes_per_chip_chunk"] > 0 and row["deadline_s"] > 0
