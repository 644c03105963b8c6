"""The review seal: an AES-256-GCM key of this machine that hides a secret until it is revealed.

The key is derived (HKDF-SHA256) from a 32-byte random secret: ``AVATAR_RELEASE_REVIEW_SEAL_KEY``
names its file, else ``<config>/keys/review-seal.key``, made on first use (0600, hex). Its id
(``seal:`` + 16 hex of sha256 over the secret) is stored beside what it sealed, so an opener on
another machine is told which key it needs instead of a bare decryption failure.

A sealed text is base64(nonce(12) || ciphertext || tag); the caller's associated data binds it to
its place (a sealed text copied elsewhere does not open).

Nothing here runs at import; ``cryptography`` is imported only when a key is used.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from .. import _atomic
from ..errors import InputError, TrustError
from .policy import config_dir

__all__ = ["SEAL_KEY_ENV", "SealKey", "seal_key_path", "load_seal_key", "seal", "unseal"]

SEAL_KEY_ENV = "AVATAR_RELEASE_REVIEW_SEAL_KEY"
_HKDF_INFO = b"avatar-release/review-seal/v1"
_NONCE_BYTES = 12


@dataclass(frozen=True)
class SealKey:
    """This machine's seal key: the AES key, the id of the secret it came from, and its file."""

    key: bytes = field(repr=False)  # AES-256 key: never in a repr or a log
    key_id: str
    path: Path


def seal_key_path() -> Path:
    """Where this machine's seal secret lives: the environment's choice, else the config folder."""
    explicit = os.environ.get(SEAL_KEY_ENV)
    if explicit:
        return Path(explicit)
    return config_dir() / "keys" / "review-seal.key"


def load_seal_key() -> SealKey:
    """This machine's seal key, its secret made on first use (unless the environment names a file)."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    path = seal_key_path()
    if not path.is_file():
        if os.environ.get(SEAL_KEY_ENV):
            raise InputError(f"review seal key {path}: no such file ({SEAL_KEY_ENV})")
        _create_secret(path)
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except ValueError:
        secret = b""
    if len(secret) < 32:
        raise InputError(f"review seal key {path}: expected at least 64 hex digits (32 random bytes)")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(secret)
    return SealKey(key, "seal:" + hashlib.sha256(secret).hexdigest()[:16], path)


def seal(key: SealKey, plaintext: bytes, aad: bytes) -> str:
    """``plaintext`` encrypted and bound to ``aad``, as base64 text."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = secrets.token_bytes(_NONCE_BYTES)
    return base64.b64encode(nonce + AESGCM(key.key).encrypt(nonce, plaintext, aad)).decode()


def unseal(key: SealKey, sealed: str, aad: bytes) -> bytes:
    """The plaintext of ``sealed``, or TrustError when it does not open under this key and ``aad``
    (another key, another place, or altered)."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        raw = base64.b64decode(sealed, validate=True)
        return AESGCM(key.key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], aad)
    except (InvalidTag, ValueError):
        raise TrustError(f"sealed text does not open under seal key {key.key_id}") from None


def _create_secret(path: Path) -> None:
    """Write 32 random bytes (hex, 0600) at ``path`` unless a concurrent first use already did:
    linked into place, so a secret that sealed something is never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{_atomic.TMP_PREFIX}{path.name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        _atomic.fsync_dir(path.parent)
    finally:
        os.unlink(tmp)
