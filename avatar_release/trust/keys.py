"""Ed25519 keys for signed promotions: generate, load, identify.

The private key signs promotion statements on the release machine; the public key is all a
serving pod needs. Files are PEM (PKCS#8 private, SubjectPublicKeyInfo public); the private
key is written 0600 and never overwritten.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _atomic
from ..errors import InputError, TrustError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "generate_keypair",
    "write_public_key",
    "load_private_key",
    "load_public_key",
    "key_id",
    "refuse_loose_permissions",
]


def key_id(public_key: Ed25519PublicKey) -> str:
    """'ed25519:' + first 16 hex of sha256 over the raw public key bytes."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(directory: str | Path, name: str = "release") -> tuple[Path, Path, str]:
    """Write ``NAME.key`` (0600) and ``NAME.pub`` into ``directory``; refuse to overwrite."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists():
            raise InputError(f"{p} already exists; keys are never overwritten (choose another --out or --name)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    # The private key appears complete and exactly once: written to a temporary file, then linked to
    # its name, which fails if the name exists (two first uses at once: one wins, the other is told).
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.key.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, priv_path)
        except FileExistsError:
            raise InputError(
                f"{priv_path} already exists; keys are never overwritten (choose another --out or --name)"
            ) from None
    finally:
        os.unlink(tmp)
    write_public_key(priv_path)
    return priv_path, pub_path, key_id(key.public_key())


def write_public_key(priv_path: str | Path) -> Path:
    """``NAME.pub`` beside ``NAME.key``, derived from it (so every writer writes the same bytes);
    rewritten only when missing or not the key's."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    priv_path = Path(priv_path)
    pub_path = priv_path.with_suffix(".pub")
    want = load_private_key(priv_path).public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    try:
        have = pub_path.read_bytes()
    except OSError:
        have = None
    if have != want:
        _atomic.write_bytes(pub_path, want)
    return pub_path


def refuse_loose_permissions(path: Path, what: str) -> None:
    """A file that decides which keys are trusted (a trust policy, a key) must not be writable by
    group or others, as ssh refuses a loose authorized_keys: whoever can write it picks the keys."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the caller's own "no such file" says it better
    if mode & 0o022:
        raise TrustError(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(mode):04o}): anyone who "
            f"can change it chooses which keys are trusted, so it is not used. Fix: chmod go-w {path}"
        )


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    p = Path(path)
    if not p.is_file():
        raise InputError(f"signing key {p}: no such file (create one with `avatar-release keys generate`)")
    refuse_loose_permissions(p, "signing key")
    try:
        key = load_pem_private_key(p.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise InputError(f"signing key {p}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"signing key {p}: expected an Ed25519 key, got {type(key).__name__}")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    p = Path(path)
    if not p.is_file():
        raise InputError(f"trust key {p}: no such file")
    refuse_loose_permissions(p, "trust key")
    try:
        key = load_pem_public_key(p.read_bytes())
    except (ValueError, TypeError) as e:
        raise InputError(f"trust key {p}: not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"trust key {p}: expected an Ed25519 public key, got {type(key).__name__}")
    return key
