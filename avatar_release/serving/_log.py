"""One JSON object per line on stderr: a line per request, per swap, per lifecycle step."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

from ._errors import clean_message

__all__ = ["log_event", "route_server_logs"]

_lock = threading.Lock()


def log_event(event: str, **fields: object) -> None:
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str, separators=(",", ":"))
    with _lock:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: logging must never take a render down
            pass


class _JsonHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log_event(
            "server",
            level=record.levelname.lower(),
            logger=record.name,
            message=clean_message(record.getMessage()),
            **({"kind": record.exc_info[0].__name__} if record.exc_info and record.exc_info[0] else {}),
        )


def route_server_logs(level: int = logging.WARNING) -> None:
    """uvicorn's own messages (a response cut short, a protocol error) as JSON lines too."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.asgi"):
        logger = logging.getLogger(name)
        logger.handlers = [_JsonHandler()]
        logger.setLevel(level)
        logger.propagate = False
