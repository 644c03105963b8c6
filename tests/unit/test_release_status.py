"""What `ls` shows: every build with its gate status and channels, and a channel whose pointer
disagrees with its history (replayed or moved behind avatar-release's back) flagged."""

from __future__ import annotations

from avatar_release.promote import promote
from avatar_release.promote.status import release_status
from avatar_release.registry import MemoryRegistry
from tests.unit.test_promote_policy import _gate, _publish


def test_builds_carry_gate_status_and_channels():
    reg = MemoryRegistry("status")
    a, da, ma = _publish(reg, "a")
    b, db, _ = _publish(reg, "b")
    _gate(reg, a, da, ma)
    promote(reg, a, "staging")
    st = release_status(reg)
    rows = {r.build_id: r for r in st.builds}
    assert rows[a].gate == "passed" and rows[a].channels == ["staging"]
    assert rows[b].gate == "ungated" and rows[b].channels == []
    assert st.problems == [] and all(c.consistent for c in st.channels)
    assert (rows[a].compared_with, rows[b].compared_with) == ("nothing", None)
    _gate(reg, b, db, ma, status="failed", against=(a, da))
    assert {r.build_id: r for r in release_status(reg).builds}[b].compared_with == a  # each verdict says against what


def test_a_replayed_channel_pointer_is_flagged():
    reg = MemoryRegistry("replay")
    a, da, ma = _publish(reg, "a")
    b, db, mb = _publish(reg, "b")
    _gate(reg, a, da, ma)
    _gate(reg, b, db, mb)
    promote(reg, a, "staging")
    old_pointer = reg._read("channels/staging.json")
    promote(reg, b, "staging")
    reg._write_atomic("channels/staging.json", old_pointer)  # someone with write access replays it
    st = release_status(reg)
    assert reg.get_channel("staging").build_id == a
    (problem,) = st.problems
    assert f"points at {a}" in problem and f"history says {b}" in problem
    assert st.to_json()["channel_checks"][0]["consistent"] is False
