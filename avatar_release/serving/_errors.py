"""Every answer that is not a video: JSON ``{"error": "<stable code>", "message": "..."}``.

The code is the contract (clients branch on it); the message is for people and never carries a
traceback, an exception class or a path on the server.
"""

from __future__ import annotations

import re

__all__ = ["ServeError", "CODES", "clean_message"]

# code -> HTTP status. Adding a code is fine; renaming one breaks clients.
CODES: dict[str, int] = {
    "not_found": 404,
    "method_not_allowed": 405,
    "body_timeout": 408,
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "invalid_json": 400,
    "invalid_request": 400,
    "invalid_image": 400,
    "invalid_audio": 400,
    "duration_too_long": 400,
    "queue_full": 429,
    "too_many_connections": 429,  # one address past --max-connections-per-client (written by the protocol)
    "queue_timeout": 503,
    "draining": 503,
    "not_ready": 503,
    "trust_expired": 503,
    "render_timeout": 504,
    "render_failed": 500,
    "internal": 500,
}

# Anything that looks like an absolute path of two or more parts (a temp file, the registry).
_PATH = re.compile(r"(?<![\w/])/(?:[\w.@+-]+/)+[\w.@+-]*")


def clean_message(text: str, limit: int = 600) -> str:
    """A message safe to send: server paths replaced, one paragraph, bounded."""
    text = _PATH.sub("<path>", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ServeError(Exception):
    """An answer with a stable code; ``headers`` go out with it (Retry-After on 429/503)."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None):
        if code not in CODES:
            raise ValueError(f"unknown serve error code {code!r}")
        super().__init__(message)
        self.code = code
        self.status = CODES[code]
        self.message = clean_message(message)
        self.headers = headers or {}

    def to_json(self) -> dict:
        return {"error": self.code, "message": self.message}
