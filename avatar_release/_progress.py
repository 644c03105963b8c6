"""Progress that a terminal can draw as a bar and a log reads as a line.

Long work reports through a ``progress(message)`` callable everywhere; a :class:`Tick` is such a
message (a ``str``, so every caller that prints or collects lines keeps working) that also carries
how far a task is: ``Tick("twin run 1 of 2", 3, 10, "chunk")`` reads ``twin run 1 of 2: 3/10 chunks``.
The command line draws ticks as bars on a terminal and prints them as throttled lines elsewhere.
"""

from __future__ import annotations

__all__ = ["Tick", "counted"]


def counted(n: int, noun: str) -> str:
    """``n noun`` with the noun in the plural unless ``n`` is 1: "1 frame", "2 frames", "0 compiles"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Tick(str):
    """``task: done/total units`` as text, with the numbers kept for a progress bar."""

    task: str
    done: int
    total: int | None
    unit: str

    def __new__(cls, task: str, done: int, total: int | None, unit: str = "") -> Tick:
        shown = f"{done}/{total}" if total is not None else f"{done}"
        if unit == "B":
            shown = f"{_mb(done)}/{_mb(total)} MB" if total is not None else f"{_mb(done)} MB"
        elif unit:
            shown += f" {unit}{'' if (total or done) == 1 else 's'}"
        self = super().__new__(cls, f"{task}: {shown}")
        self.task, self.done, self.total, self.unit = task, done, total, unit
        return self

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f}"
