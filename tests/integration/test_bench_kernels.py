"""benchmarks/bench_kernels.py keeps working: its smoke mode (3 frames, 2 heads) times the dense,
block-sparse, 128-tiled and bounded-softmax kernels and the Ulysses head groups side by side."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow  # seven XLA compiles of interpret-mode Pallas kernels: ~10 s


def test_smoke_mode_times_every_kernel_and_the_head_groups_move_equal_bytes(tmp_path):
    out = tmp_path / "kernels.json"
    doc = run_smoke("bench_kernels.py", out=out, timeout=600)
    assert doc["sr"]["frames"] == 3 and doc["sr"]["heads"] == 2 and 0 < doc["live_fraction"] < 1
    assert all(s > 0 for s in doc["seconds"].values()) and set(doc["seconds"]) >= {"dense", "blocksparse", "tiled_128"}
    assert all(r["value"] > 0 for r in doc["ratios"].values())
    assert doc["bounded"]["max_abs_error_f32"] <= 2e-6  # the bounded softmax is exact enough, at any size
    groups = doc["groups"]
    assert [g["G"] for g in groups] == [1, 2]
    assert all(g["bytes"] == g["analytic_bytes"] == groups[0]["bytes"] for g in groups)  # more, smaller all-to-alls
    assert [g["all_to_alls"] for g in groups] == [2, 4]
