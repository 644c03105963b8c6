"""How progress reaches the person running a command: bars on a terminal, lines in a log.

Always on stderr (stdout carries only the result, ``--json`` included). On a terminal a
:class:`~avatar_release._progress.Tick` moves a tqdm bar, one per task, and other messages are
written above the bars; anywhere else (CI, a pipe, ``TERM=dumb``, ``AVATAR_RELEASE_PROGRESS=plain``)
each message is a line, and a task's ticks are printed at most every few seconds plus its last.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from .._progress import Tick

__all__ = ["ProgressView", "PLAIN_EVERY_S"]

PLAIN_EVERY_S = 5.0  # plain mode: at most one line per task this often (its first and last always)


def _wants_bars(stream: IO[str]) -> bool:
    if os.environ.get("AVATAR_RELEASE_PROGRESS", "").lower() in ("plain", "0", "off"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


class ProgressView:
    """A ``progress(message)`` callable for the command line (see the module's docstring)."""

    def __init__(self, stream: IO[str] | None = None, *, bars: bool | None = None, clock: Any = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bars = _wants_bars(self.stream) if bars is None else bars
        self._clock = clock
        self._open: dict[str, Any] = {}  # task -> its tqdm bar
        self._printed: dict[str, float] = {}  # task -> when its last plain line went out

    def __call__(self, message: str) -> None:
        if isinstance(message, Tick):
            self._tick(message)
        elif self.bars and self._open:
            from tqdm import tqdm  # a terminal with bars drawn: write above them

            tqdm.write(f"  {message}", file=self.stream)
        else:
            print(f"  {message}", file=self.stream, flush=True)

    def _tick(self, t: Tick) -> None:
        if self.bars:
            self._bar(t)
            return
        now, last = self._clock(), self._printed.get(t.task)
        if t.finished or last is None or now - last >= PLAIN_EVERY_S:
            self._printed[t.task] = now
            print(f"  {t}", file=self.stream, flush=True)
        if t.finished:
            self._printed.pop(t.task, None)

    def _bar(self, t: Tick) -> None:
        from tqdm import tqdm  # only on a terminal, where a bar is drawn

        bar = self._open.get(t.task)
        if bar is None:
            scale = t.unit == "B"
            bar = tqdm(
                total=t.total,
                desc=f"  {t.task}",
                unit=t.unit or "it",
                unit_scale=scale,
                unit_divisor=1000 if scale else 1,
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
            )
            self._open[t.task] = bar
        bar.n = t.done
        bar.refresh()
        if t.finished:
            bar.close()
            del self._open[t.task]

    def close(self) -> None:
        """Close any bar left open (a task that stopped early)."""
        for bar in self._open.values():
            bar.close()
        self._open.clear()
