"""The suite's own schedule (tests/durations.py): groups start longest first, each group whole."""

from __future__ import annotations

import json

from tests import durations


def test_groups_start_longest_first_whole_and_unknown_groups_count_by_their_tests(tmp_path, monkeypatch):
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"b.py": 100.0, "smoke-x": 300.0}))
    monkeypatch.setattr(durations, "DURATIONS", table)
    items = ["a.py::1", "b.py::1", "a.py::2", "smoke-x::1", "c.py::1", "b.py::2"]
    group = {"smoke-x::1": "smoke-x"}

    ordered = durations.longest_first(items, lambda i: group.get(i, i.split("::")[0]))

    # smoke-x (300 s) before b.py (100 s); a.py (2 tests) before c.py (1 test), both unmeasured
    assert ordered == ["smoke-x::1", "b.py::1", "b.py::2", "a.py::1", "a.py::2", "c.py::1"]


def test_a_missing_table_keeps_collection_order_within_the_count_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(durations, "DURATIONS", tmp_path / "absent.json")
    assert durations.longest_first(["a::1", "b::1", "b::2"], lambda i: i.split("::")[0]) == ["b::1", "b::2", "a::1"]


def test_reported_node_ids_map_to_their_xdist_group():
    assert durations.group_of_nodeid("tests/x.py::test_a[p@q]") == "tests/x.py"
    assert durations.group_of_nodeid("tests/x.py::test_a[row]@smoke-row") == "smoke-row"
    assert durations.group_of_nodeid("tests/x.py::test_b@tests/x.py") == "tests/x.py"
