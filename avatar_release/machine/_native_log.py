"""XLA's and libtpu's C++ logging, turned into lines a user can read.

The compiler logs through glog straight to file descriptor 2 (``W1201 10:08:06.669259 5184
spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization ... Contact Shardy or XLA
team``), past Python's ``sys.stderr``. While `native_log_filter` is open, fd 2 goes through a pipe:
glog lines become one short note each (deduplicated, with a count) and are kept as
`NativeNote`s for ``--json``; every other line (our progress, Python warnings) passes unchanged
and in order.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_GLOG = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ ([\w.+-]+):\d+\] (.*)$")
_SEVERITY = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}
# Lines that only ever follow a glog line or announce it: dropped with it.
_NOISE = (
    re.compile(r"^WARNING: Logging before InitGoogle\(\) is written to STDERR$"),
    re.compile(r"^=== Source Location Trace: ===\s*$"),
    re.compile(r"^[\w/.-]+\.cc:\d+$"),
)
_REMAT = re.compile(
    r"cannot go from sharding (\{.*?\}) to (\{.*?\}) efficiently for HLO operation %[\w.]+ = "
    r"(\S+) (\w+)\("
)


@dataclass
class NativeNote:
    severity: str  # info | warning | error | fatal
    source: str  # the C++ file that logged it
    message: str  # shortened, without the "contact us" tail
    count: int = 1

    def line(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"  xla {self.severity} [{self.source}]{times}: {self.message}"

    def to_json(self) -> dict:
        return {"severity": self.severity, "source": self.source, "message": self.message, "count": self.count}


def summarize(source: str, message: str) -> str:
    """The gist of a compiler log message, in one line."""
    m = _REMAT.search(message)
    if "Involuntary full rematerialization" in message and m:
        return (
            f"involuntary full rematerialization of {m.group(3)} {m.group(4)}: the SPMD partitioner cannot "
            f"reshard {m.group(1)} -> {m.group(2)}, so it replicates the tensor first (a sharding the "
            f"program should express differently; it costs memory and time, not correctness)"
        )
    message = re.sub(r"\s*(This issue will be fixed|Contact Shardy|As the last resort).*$", "", message)
    return message if len(message) <= 240 else message[:237] + "..."


@contextmanager
def native_log_filter(enabled: bool = True) -> Iterator[list[NativeNote]]:
    """Route fd 2 through a filter while the block runs; yields the notes collected so far."""
    notes: list[NativeNote] = []
    if not enabled:
        yield notes
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    by_key: dict[tuple[str, str, str], NativeNote] = {}

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
                m = _GLOG.match(text)
                if m is None:
                    if not any(p.match(text) for p in _NOISE):
                        os.write(saved, raw)
                    continue
                severity, source = _SEVERITY[m.group(1)], m.group(2)
                if severity == "info":
                    continue
                key = (severity, source, summarize(source, m.group(3)))
                if key in by_key:
                    by_key[key].count += 1
                    continue
                note = by_key[key] = NativeNote(*key)
                notes.append(note)
                os.write(saved, (note.line() + "\n").encode())

    thread = threading.Thread(target=pump, name="native-log-filter", daemon=True)
    thread.start()
    try:
        yield notes
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump reads to the end and stops
        thread.join(10)
        if not thread.is_alive():  # a child still holding the pipe keeps the pump (and `saved`) alive
            os.close(saved)
