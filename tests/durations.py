"""The order test groups start in: longest first, by the seconds a full run measured.

Under ``--dist loadgroup`` each group (a test file, or a benchmark smoke row) runs whole on one
worker, and a worker takes the next group when it frees up. Started in xdist's default order (most
tests first), the suite's longest single-test groups (the 720p TPU compile, the example workflow,
the smoke rows) started last, and one core finished them while the other sat idle. Longest first
is the classic greedy schedule: the short groups at the end fill the gaps.

``tests/durations.json`` holds each group's seconds (setup + call + teardown of its tests) from a
full run on 2 cores. A group missing from it (a new file) counts ``UNKNOWN_TEST_S`` per test. It
is refreshed by running the README's test command with ``--store-durations``; stale figures only
cost balance, never correctness.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DURATIONS", "UNKNOWN_TEST_S", "group_of_nodeid", "longest_first", "record_duration", "store_durations"]

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_TEST_S = 0.3  # a typical test of the fast lane
_measured: dict[str, float] = {}


def _table() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no table (or an unreadable one): xdist's order by test count decides


def longest_first(items: Sequence[Any], group_of: Callable[[Any], str]) -> list[Any]:
    """``items`` with each group's tests together, groups by their recorded seconds, longest first;
    a group keeps its tests' order, and groups of equal cost keep the order they were collected in."""
    groups: dict[str, list[Any]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    seconds = _table()
    cost = {g: seconds.get(g, UNKNOWN_TEST_S * len(members)) for g, members in groups.items()}
    ordered = sorted(groups, key=lambda g: -cost[g])  # sorted() is stable: ties keep collection order
    return [item for g in ordered for item in groups[g]]


def group_of_nodeid(nodeid: str) -> str:
    """The group of a reported test: xdist's ``@group`` suffix, else its file (tests/conftest.py's rule)."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    return nodeid.split("::")[0]


def record_duration(report: Any) -> None:
    """Add one phase's seconds (setup, call or teardown) to its group's total."""
    group = group_of_nodeid(report.nodeid)
    _measured[group] = _measured.get(group, 0.0) + float(report.duration)


def store_durations() -> None:
    """Write the run's group totals over the table (groups this run did not reach keep theirs)."""
    table = _table()
    table.update({g: round(s, 1) for g, s in _measured.items()})
    ordered = dict(sorted(table.items(), key=lambda kv: (-kv[1], kv[0])))
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")
