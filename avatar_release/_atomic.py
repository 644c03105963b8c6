"""The one way avatar-release writes a file: a temporary name, fsync, rename, fsync the directory.

A reader sees the old bytes or the new bytes, never a torn file, whatever happens to the
writer (kill -9, a full disk, an exception half way). Every temporary name starts with
``TMP_PREFIX`` so that ``sweep`` can remove what a killed writer left behind, without ever
touching a finished file.

Two placements, one rule:
  * beside the target (the default): the rename never crosses a file system;
  * in a given ``tmp_dir`` (the local registry's ``tmp/``): leftovers stay out of the
    directories readers list. ``tmp_dir`` must be on the same file system as the target.

Errors are the operating system's ``OSError``: each caller knows which of its own errors
(a registry fault, a bad output path) a failed write is, and wraps it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TMP_PREFIX", "atomic_path", "write_bytes", "write_text", "write_json", "sweep", "fsync_dir"]

TMP_PREFIX = ".avatar-tmp."


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable (POSIX: the directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike, *, tmp_dir: str | os.PathLike | None = None, suffix: str = "", mode: int = 0o666
) -> Iterator[Path]:
    """Yield a fresh, empty temporary path; on success it is fsynced and renamed over ``path``.

    The caller (or a subprocess such as ffmpeg) writes the temporary path however it likes.
    The file is created with ``mode`` minus the umask (0o666: as ``open(path, "w")`` would;
    0o600 for a secret, which is then never readable by others, not even for a moment).
    On any exception the temporary file is removed and ``path`` is left as it was.
    ``suffix`` keeps an extension on the temporary name for tools that read it (``.mp4``).
    """
    target = Path(path)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    where = Path(tmp_dir) if tmp_dir is not None else parent
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f"{TMP_PREFIX}{target.name[:48]}.{secrets.token_hex(6)}{suffix}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(parent)


def write_bytes(
    path: str | os.PathLike, data: bytes, *, tmp_dir: str | os.PathLike | None = None, mode: int = 0o666
) -> None:
    with atomic_path(path, tmp_dir=tmp_dir, mode=mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def write_text(path: str | os.PathLike, text: str, *, tmp_dir: str | os.PathLike | None = None) -> None:
    write_bytes(path, text.encode("utf-8"), tmp_dir=tmp_dir)


def write_json(path: str | os.PathLike, obj: object, *, indent: int | None = 1, sort_keys: bool = True) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def sweep(directory: str | os.PathLike, *, older_than: float = 3600.0, recursive: bool = False) -> list[Path]:
    """Remove temporary files a killed writer left in ``directory``; return what was removed.

    Only names with ``TMP_PREFIX`` older than ``older_than`` seconds are touched, so a write
    in progress in another process is never pulled from under it.
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    now = time.time()
    pattern = f"**/{TMP_PREFIX}*" if recursive else f"{TMP_PREFIX}*"
    removed = []
    for p in root.glob(pattern):
        try:
            if p.is_file() and now - p.stat().st_mtime >= older_than:
                p.unlink()
                removed.append(p)
        except FileNotFoundError:
            continue
    return removed
