"""benchmarks/bench_state.py keeps working: its smoke mode builds a short and a longer signed
history, then times a promotion's signed-state work, the history read and a pod's poll."""

from __future__ import annotations

from tests.helpers import run_smoke


def test_smoke_mode_times_promote_and_a_poll_whose_bytes_do_not_grow_with_history(tmp_path):
    doc = run_smoke("bench_state.py", out=tmp_path / "state.json", timeout=300)
    assert doc["smoke"] and doc["long"]["moves"] == 30 and doc["short"]["moves"] == 3
    assert doc["long"]["prod_history_moves"] == 10 and doc["short"]["prod_history_moves"] == 1
    for size in ("short", "long"):
        assert doc[size]["promote_s"]["median"] > 0 and doc[size]["poll_s"]["median"] > 0
    # A poll reads the timestamp, snapshot and (prod) its two evidence envelopes: the same bytes
    # whatever the history (a version number's digits aside).
    assert doc["long"]["poll_bytes"]["max"] <= doc["short"]["poll_bytes"]["max"] + 64
    assert doc["meets_goals"]["poll_bytes_flat"]
