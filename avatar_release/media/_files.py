"""Files in and out for the media room: input checks, atomic outputs, naming unknown bytes.

Inputs are the user's files, so every failure is an InputError naming the file. Outputs go
through the project's one atomic writer (``avatar_release._atomic``), which raises the
operating system's OSError; here a bad output path becomes an InputError with the path and
the reason, while an OSError raised *inside* the block (a crashed encoder) passes untouched.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .. import _atomic
from ..errors import InputError

__all__ = [
    "PathLike",
    "input_file",
    "read_head",
    "output_path",
    "check_output",
    "scratch_beside",
    "write_output",
    "describe_head",
]

PathLike = str | os.PathLike


def input_file(path: PathLike, kind: str) -> Path:
    """``path`` as a Path if it is a readable regular file; otherwise an InputError."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{kind} {p}: file not found; check the path") from None
    except OSError as exc:
        raise InputError(f"{kind} {p}: cannot read ({exc.strerror or exc})") from exc
    if p.is_dir():
        raise InputError(f"{kind} {p}: is a directory, expected a file")
    if st.st_size == 0:
        raise InputError(f"{kind} {p}: the file is empty (0 bytes)")
    return p


def read_head(path: Path, kind: str, n: int = 64) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise InputError(f"{kind} {path}: cannot read ({exc.strerror or exc})") from exc


def _bad_output(target: Path, exc: OSError) -> InputError:
    return InputError(f"output {target}: cannot write it ({exc.strerror or exc}); choose a writable location")


@contextlib.contextmanager
def output_path(path: PathLike, suffix: str = "") -> Iterator[Path]:
    """``_atomic.atomic_path`` with a bad destination reported as an InputError."""
    target = Path(path)
    if target.is_dir():
        raise InputError(f"output {target}: is a directory; give a file path instead")
    cm = _atomic.atomic_path(target, suffix=suffix)
    try:
        tmp = cm.__enter__()
    except OSError as exc:
        raise _bad_output(target, exc) from exc
    try:
        yield tmp
    except BaseException:
        cm.__exit__(*sys.exc_info())  # removes the temporary file; the exception goes on
        raise
    try:
        cm.__exit__(None, None, None)
    except OSError as exc:  # fsync or rename failed: nothing was published
        raise _bad_output(target, exc) from exc


def check_output(target: Path) -> None:
    """Refuse, before any work, an output that is a folder or whose folder cannot be made."""
    if target.is_dir():
        raise InputError(f"output {target}: is a directory; give a file path instead")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _bad_output(target, exc) from exc


def scratch_beside(target: Path, suffix: str) -> Path:
    """A new empty temporary file in ``target``'s folder (created if missing), named with
    ``_atomic.TMP_PREFIX`` so that a killed writer's leftovers are swept; the caller removes it.

    Beside the output rather than in the system temp folder: a long render's scratch (a video
    track, hours of samples) then lands on the disk the output goes to, never in a RAM-backed /tmp.
    """
    check_output(target)
    try:
        fd, name = tempfile.mkstemp(prefix=f"{_atomic.TMP_PREFIX}{target.name[:48]}.", suffix=suffix, dir=target.parent)
    except OSError as exc:
        raise _bad_output(target, exc) from exc
    os.close(fd)
    return Path(name)


def write_output(path: PathLike, data: bytes) -> Path:
    with output_path(path) as tmp:
        try:
            tmp.write_bytes(data)
        except OSError as exc:
            raise _bad_output(Path(path), exc) from exc
    return Path(path)


# First bytes of formats people hand us by mistake, to say what a refused file *is*.
_KNOWN_HEADS: list[tuple[bytes, int, str]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "a PNG image"),
    (b"\xff\xd8\xff", 0, "a JPEG image"),
    (b"GIF87a", 0, "a GIF image"),
    (b"GIF89a", 0, "a GIF image"),
    (b"BM", 0, "a BMP image"),
    (b"II*\x00", 0, "a TIFF image"),
    (b"MM\x00*", 0, "a TIFF image"),
    (b"WEBP", 8, "a WebP image"),
    (b"WAVE", 8, "a WAV file"),
    (b"AVI ", 8, "an AVI video"),
    (b"ftypheic", 4, "a HEIC image"),
    (b"ftypheix", 4, "a HEIC image"),
    (b"ftypmif1", 4, "a HEIF image"),
    (b"ftypavif", 4, "an AVIF image"),
    (b"ftyp", 4, "an MP4/MOV/M4A file"),
    (b"%PDF", 0, "a PDF document"),
    (b"PK\x03\x04", 0, "a ZIP archive"),
    (b"\x93NUMPY", 0, "a .npy array"),
    (b"fLaC", 0, "a FLAC file"),
    (b"OggS", 0, "an Ogg file"),
    (b"ID3", 0, "an MP3 file (ID3 tag)"),
    (b"\x1aE\xdf\xa3", 0, "a WebM/Matroska file"),
    (b"#EXTM3U", 0, "an M3U playlist"),
]


def describe_head(head: bytes) -> str:
    """A short phrase for what a file looks like from its first bytes."""
    for magic, offset, what in _KNOWN_HEADS:
        if head[offset : offset + len(magic)] == magic:
            return what
    stripped = head.lstrip()
    if stripped[:1] in (b"<", b"{", b"[") or (head and all(32 <= b < 127 or b in (9, 10, 13) for b in head[:32])):
        return "text, not media data"
    return "unrecognised data (first bytes " + (head[:8].hex(" ") or "none") + ")"
