"""The ffmpeg binary that imageio-ffmpeg ships: found lazily, never looked up on PATH.

Importing this module starts nothing; :func:`ffmpeg_exe` imports imageio-ffmpeg on first use.
"""

from __future__ import annotations

import functools
import subprocess
from typing import IO

from ..errors import MediaError

__all__ = ["ffmpeg_exe", "ffmpeg_version", "stderr_tail", "file_tail"]

# How much of ffmpeg's stderr an error message quotes.
_STDERR_TAIL_CHARS = 2000


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary bundled with imageio-ffmpeg (imported lazily)."""
    try:
        # Lazy: imageio-ffmpeg loads on first use; the media room imports numpy only.
        import imageio_ffmpeg
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise MediaError(
            "imageio-ffmpeg is not installed; install it (pip install imageio-ffmpeg), "
            "it ships the ffmpeg binary used to decode audio and write MP4"
        ) from exc
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as exc:  # pragma: no cover - broken install
        raise MediaError(f"no usable ffmpeg binary: {exc}; reinstall imageio-ffmpeg") from exc


@functools.lru_cache(maxsize=1)
def ffmpeg_version() -> str:
    """``ffmpeg -version``'s first words, e.g. ``n9.0.2-17-g2a571b6068-20260930``."""
    try:
        out = subprocess.run([ffmpeg_exe(), "-hide_banner", "-version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MediaError(f"cannot run the bundled ffmpeg ({exc}); reinstall imageio-ffmpeg") from exc
    words = out.decode("utf-8", "replace").split()
    return words[2] if len(words) > 2 and words[:2] == ["ffmpeg", "version"] else "unknown"


def stderr_tail(text: str) -> str:
    text = text.strip()
    if len(text) > _STDERR_TAIL_CHARS:
        text = "..." + text[-_STDERR_TAIL_CHARS:]
    return text or "(ffmpeg printed nothing)"


def file_tail(fh: IO[bytes]) -> str:
    """The last part of a file ffmpeg wrote its stderr into, as text."""
    fh.seek(0, 2)
    size = fh.tell()
    fh.seek(max(0, size - 4 * _STDERR_TAIL_CHARS))
    return fh.read().decode("utf-8", "replace")
