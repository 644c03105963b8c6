"""benchmarks/bench_serving.py keeps working: its smoke mode runs every measurement at its smallest
against real `avatar-release serve` pods: time to first fragment, concurrent clients, a burst past
the queue, hostile input, a --follow swap under load and flat memory."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_mode_serves_refuses_and_swaps_without_a_failed_request(registry_copy, tmp_path):
    root, _ = registry_copy
    out = tmp_path / "serving.json"
    doc = run_smoke("bench_serving.py", "--registry", str(root), out=out, timeout=900)
    assert 0 < doc["ttff"]["ttff_s"] < doc["ttff"]["whole_s"] and 0 < doc["ttff"]["ratio"] < 1
    c = doc["concurrent"]
    assert (c["clients"], c["requests"], c["ok"], c["failed"]) == (2, 2, 2, 0)
    b = doc["burst"]  # 3 at once against a queue of 1: the one past it is told when to retry, nobody fails
    assert b["ok"] + b["rejected_429"] == 3 and b["ok"] >= 1 and b["rejected_429"] >= 1
    assert b["with_retry_after"] == b["rejected_429"] and b["other"] == 0
    for label in ("png_bomb", "seconds_1e6"):
        h = doc["hostile"][label]
        assert 400 <= h["status"] < 500 and h["answer_s"] < 5
    p = doc["promotion_under_load"]
    assert p["failed"] == 0 and p["swap_seconds"] is not None and p["served_new"] >= 1
    assert doc["flat_memory"]["peak_ratio"] > 0 and doc["rss_mib"]["VmHWM"] >= doc["rss_mib"]["VmRSS"] > 0
