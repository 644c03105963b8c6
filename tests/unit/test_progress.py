"""Progress on long work: a Tick is a line for a log and a bar for a terminal; stdout never sees it."""

from __future__ import annotations

import io

from avatar_release._progress import Tick
from avatar_release.cli._progress_view import PLAIN_EVERY_S, ProgressView


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_tick_is_a_line_that_keeps_its_numbers():
    t = Tick("twin run 1 of 2", 3, 10, "chunk")
    assert t == "twin run 1 of 2: 3/10 chunks" and (t.done, t.total, t.unit) == (3, 10, "chunk")
    assert not t.finished and Tick("x", 10, 10, "chunk").finished
    assert Tick("upload", 1_500_000, 3_000_000, "B") == "upload: 1.5/3.0 MB"
    assert Tick("compile", 1, 1, "stage") == "compile: 1/1 stage"


def test_off_a_terminal_ticks_are_throttled_lines_with_the_first_and_the_last():
    out, clock = io.StringIO(), _Clock()
    view = ProgressView(out, bars=False, clock=clock)
    view("loading")
    for done in range(1, 11):
        clock.t += PLAIN_EVERY_S / 4  # four ticks per throttle window
        view(Tick("twin run 1 of 2", done, 10, "chunk"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "  loading" and lines[1] == "  twin run 1 of 2: 1/10 chunks"
    assert lines[-1] == "  twin run 1 of 2: 10/10 chunks" and 3 <= len(lines) <= 6


def test_on_a_terminal_a_task_is_one_bar_closed_when_it_finishes():
    out = io.StringIO()
    view = ProgressView(out, bars=True)
    for done in range(1, 4):
        view(Tick("compile", done, 3, "stage"))
        if done == 2:
            view("dit/f8: compiled 1.0s")  # written above the open bar, not through it
    assert view._open == {} and "compile" in out.getvalue() and "3/3" in out.getvalue()
    assert "dit/f8: compiled 1.0s" in out.getvalue()
