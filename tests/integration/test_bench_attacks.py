"""benchmarks/bench_attacks.py keeps working: its smoke mode loads a real build in a fresh process,
plants two zstd bombs in copies of it and shows both refused before the loader allocates."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_refuses_both_bombs_below_a_normal_loads_memory(registry_copy, tmp_path):
    root, result = registry_copy
    out = tmp_path / "attacks.json"
    doc = run_smoke("bench_attacks.py", "--registry", str(root), out=out, timeout=600)
    assert doc["build_id"] == result.build_id and doc["runs"] == 1
    bombs = doc["bombs"]
    assert "at most 100x allowed" in bombs["honest 16 GiB"]["refused"]
    assert "decompresses to more than" in bombs["lying: 1 GiB under the real raw size"]["refused"]
    for name in bombs:  # refused before allocating: less than a normal load holds, far from the 16 GiB
        assert 0 < doc["ratios"][f"peak RSS: {name} / normal load"] < 2
    assert {"dit/f8", "sr/f8", "vae/f8"} <= set(doc["compression_ratios"])
    assert all(1 < r <= 100 for k, r in doc["compression_ratios"].items() if "/" in k)
    assert doc["cold_load_s"] > 0 and 0 < doc["ratios"]["added verification / cold load"] < 1
