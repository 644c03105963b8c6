"""One JSON object per line on stderr: a line per request, per swap, per lifecycle step."""

from __future__ import annotations

import json
import sys
import threading
import time

__all__ = ["log_event"]

_lock = threading.Lock()


def log_event(event: str, **fields) -> None:
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str, separators=(",", ":"))
    with _lock:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: logging must never take a render down
            pass
