"""Content digests: the one spelling of a sha256 used everywhere (``sha256:<64 hex>``)."""

from __future__ import annotations

import hashlib
import json
import re

__all__ = ["sha256_digest", "canonical_json", "is_digest", "hex_of", "DIGEST_RE"]

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def is_digest(text: str) -> bool:
    return bool(DIGEST_RE.match(text))


def hex_of(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r} (expected 'sha256:' + 64 lowercase hex)")
    return digest.split(":", 1)[1]
