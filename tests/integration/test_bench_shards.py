"""benchmarks/bench_shards.py keeps working: its smoke mode gates a real build as two shards run
side by side (`gate BUILD --shard K/2`), merges them and writes the times."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_gates_in_two_shards_and_merges(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "shards.json"
    doc = run_smoke("bench_shards.py", "--registry", str(root), out=out, timeout=900)
    assert doc["build_id"] == result.build_id and doc["unsharded_s"] is None
    (n, row), = doc["sharded"].items()
    assert n == "2" and row["vs_unsharded"] is None
    assert 0 < row["slowest_shard_worker_s"] <= row["shards_wall_s"] < row["total_s"]
    assert row["merge_s"] > 0 and row["merge_share_of_one_shard"] > 0
