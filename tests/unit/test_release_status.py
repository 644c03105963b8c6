"""What `ls` shows: every build with its gate status and the channels the signed release state puts
it in, and a channel whose plain pointer disagrees with the signed state (replayed or moved behind
avatar-release's back) flagged."""

from __future__ import annotations

from avatar_release.promote import promote
from avatar_release.promote.status import release_status
from avatar_release.registry import MemoryRegistry
from tests.helpers import with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


def test_builds_carry_gate_status_and_channels():
    reg = with_release_state(MemoryRegistry("status"))
    a, da, ma = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, ma)
    promote(reg, a, "staging")
    st = release_status(reg)
    rows = {r.build_id: r for r in st.builds}
    assert rows[a].gate == "passed" and rows[a].channels == ["staging"]
    assert rows[b].gate == "ungated" and rows[b].channels == []
    assert st.problems == [] and all(c.consistent for c in st.channels)
    assert (rows[a].compared_with, rows[b].compared_with) == ("nothing", None)
    signed_gate_result(reg, b, db, ma, status="failed", against=(a, da))
    assert {r.build_id: r for r in release_status(reg).builds}[b].compared_with == a  # each verdict says against what


def test_a_replayed_channel_pointer_is_flagged():
    reg = with_release_state(MemoryRegistry("replay"))
    a, da, ma = publish_stand_in(reg, "a")
    b, db, mb = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, ma)
    signed_gate_result(reg, b, db, mb)
    promote(reg, a, "staging")
    old_pointer = reg._read("channels/staging.json")
    promote(reg, b, "staging")
    reg._write_atomic("channels/staging.json", old_pointer)  # someone with write access replays it
    st = release_status(reg)
    assert reg.get_channel("staging").build_id == a
    (problem,) = st.problems
    assert f"points at {a}" in problem and f"the signed release state names {b}" in problem
    (check,) = st.to_json()["channel_checks"]
    assert check["consistent"] is False and check["against"] == "signed release state"
    rows = {r.build_id: r for r in st.builds}  # ls shows where the signed state (what decides) puts each build
    assert (rows[a].channels, rows[b].channels) == ([], ["staging"]) and st.to_json()["channels"] == {"staging": b}


def test_a_pointer_in_a_registry_not_yet_signed_is_checked_against_its_history():
    reg = MemoryRegistry("unsigned")  # before `registry upgrade`: ls still reads it
    a, da, ma = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    reg.move_channel("staging", reg.resolve(a), expected_digest=None, action="promote", who="t", reason="")
    st = release_status(reg)
    assert st.problems == [] and {r.build_id: r.channels for r in st.builds} == {a: ["staging"], b: []}
    reg._write_atomic(
        "channels/staging.json",
        reg._read("channels/staging.json").replace(a.encode(), b.encode()).replace(da.encode(), db.encode()),
    )
    (problem,) = release_status(reg).problems
    assert f"points at {b}" in problem and f"history says {a}" in problem
