"""Independent writers for the media tests: the bundled ffmpeg's encoders and a tiny Adam7 PNG
writer, so the readers are checked against files they did not write themselves."""

from __future__ import annotations

import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np

from avatar_release.media import ffmpeg_exe


def ffmpeg(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run([ffmpeg_exe(), "-v", "error", *args], input=data, capture_output=True, check=True).stdout


def gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x * y) % 256], -1).astype(np.uint8)


def encode_still(raw: bytes, pix_fmt: str, width: int, height: int, codec: str, *extra: str) -> bytes:
    """One frame of raw pixels encoded by ffmpeg (png, mjpeg, libwebp) to bytes."""
    return ffmpeg(
        "-f",
        "rawvideo",
        "-pix_fmt",
        pix_fmt,
        "-s",
        f"{width}x{height}",
        "-i",
        "-",
        "-frames:v",
        "1",
        "-c:v",
        codec,
        *extra,
        "-f",
        "image2pipe",
        "-",
        data=raw,
    )


def tone(path: Path, *args: str, seconds: float = 1.0, rate: int = 44100, freq: int = 440) -> Path:
    """A sine tone from ffmpeg's lavfi source, encoded by the output options in ``args``."""
    ffmpeg("-f", "lavfi", "-i", f"sine=frequency={freq}:duration={seconds}:sample_rate={rate}", *args, "-y", str(path))
    return path


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


# Adam7 passes: (x start, y start, x step, y step)
_ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def adam7_png(rgb: np.ndarray) -> bytes:
    """An interlaced 8-bit RGB PNG (filter 0 on every row), written from the spec."""
    h, w, _ = rgb.shape
    raw = b""
    for x0, y0, dx, dy in _ADAM7:
        sub = rgb[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\x00" + row.tobytes() for row in sub)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` with one tiny IDAT: a decompression bomb's shape."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _chunk(b"IEND", b"")
    )
