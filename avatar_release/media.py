"""Media files in and out: PNG, WAV and H.264 MP4, with no torch, no JAX and no Pillow.

A serving pod reads a reference picture and a speech track, renders frames, and writes an
MP4. This module is everything it needs for that, on stdlib + numpy + the ffmpeg binary
that ``imageio-ffmpeg`` ships (imported lazily, only when a video is written or probed).

* PNG: written and read here with ``zlib`` + ``struct`` (8-bit RGB out; 8-bit gray,
  gray+alpha, RGB and RGBA in, non-interlaced). Anything else is refused with a message
  that says how to convert it.
* WAV: the stdlib ``wave`` module, 16-bit PCM. Samples are float32 in [-1, 1], mono.
* MP4: H.264 (libx264, yuv420p, BT.709) through the ffmpeg binary, raw rgb24 frames on
  its stdin, optional AAC audio muxed in.

Every file is written atomically: a temporary file in the target directory is renamed
over ``path`` only when it is complete, so a failure never leaves half a file there.
Bad input raises :class:`~avatar_release.errors.InputError` naming the file, what was
expected, what was found and how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import secrets
import struct
import subprocess
import tempfile
import wave
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from avatar_release.errors import InputError, MediaError

__all__ = [
    "MediaError",
    "Mp4File",
    "Mp4Probe",
    "read_png",
    "write_png",
    "encode_png",
    "decode_png",
    "encode_wav_bytes",
    "read_image",
    "read_wav",
    "write_wav",
    "check_audio",
    "write_mp4",
    "probe_mp4",
    "read_mp4_frames",
    "ffmpeg_exe",
    "frame_sha256",
    "psnr",
    "max_abs_diff",
]

PathLike = str | os.PathLike

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_NPY_MAGIC = b"\x93NUMPY"
_INT16_SCALE = 32767.0
# How much of ffmpeg's stderr an error message quotes.
_STDERR_TAIL_CHARS = 2000


# ---------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _atomic_path(path: PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a fresh temporary path next to ``path``; rename it over ``path`` on success.

    The temporary file is created empty with mode 0o666 minus the umask (the mode a plain
    ``open(path, "w")`` would give), so the final file gets ordinary permissions. On any
    exception the temporary file is removed and nothing appears at ``path``.
    """
    target = Path(path)
    if target.is_dir():
        raise InputError(f"output {target}: is a directory; give a file path instead")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"output {target}: cannot create directory {parent} ({exc.strerror or exc}); "
            "choose a writable location"
        ) from exc
    tmp = parent / f".{target.name}.{secrets.token_hex(6)}{suffix}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise InputError(
            f"output {target}: cannot write in {parent} ({exc.strerror or exc}); "
            "choose a writable location"
        ) from exc
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_bytes_atomic(path: PathLike, data: bytes) -> None:
    with _atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def _read_file(path: PathLike, kind: str) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{kind} {p}: file not found; check the path") from None
    except IsADirectoryError:
        raise InputError(f"{kind} {p}: is a directory, expected a file") from None
    except OSError as exc:
        raise InputError(f"{kind} {p}: cannot read ({exc.strerror or exc})") from exc


# ---------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def encode_png(rgb: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as an 8-bit RGB PNG (bytes)."""
    arr = _as_rgb_frame(rgb, "image")
    height, width, _ = arr.shape
    # Filter type 1 (Sub) on every row: compresses gradients well and is vectorised both
    # ways. Byte arithmetic wraps modulo 256 as the PNG spec requires.
    rows = arr.reshape(height, width * 3)
    sub = rows.copy()
    sub[:, 3:] = rows[:, 3:] - rows[:, :-3]
    raw = np.empty((height, width * 3 + 1), dtype=np.uint8)
    raw[:, 0] = 1
    raw[:, 1:] = sub
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        _PNG_SIGNATURE
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + _png_chunk(b"IEND", b"")
    )


def write_png(path: PathLike, rgb: np.ndarray) -> Path:
    """Write an (H, W, 3) uint8 array to ``path`` as an 8-bit RGB PNG, atomically."""
    data = encode_png(rgb)
    _write_bytes_atomic(path, data)
    return Path(path)


_PNG_COLOR_TYPES = {0: ("gray", 1), 2: ("RGB", 3), 3: ("palette", 1), 4: ("gray+alpha", 2), 6: ("RGBA", 4)}
_CONVERT_HINT = "convert it to 8-bit RGB, e.g. ffmpeg -i {src} -pix_fmt rgb24 out.png"


def _unfilter(data: bytes, height: int, width: int, bpp: int, where: str) -> np.ndarray:
    stride = width * bpp
    expected = height * (stride + 1)
    if len(data) < expected:
        raise InputError(
            f"image {where}: PNG pixel data is truncated ({len(data)} bytes, expected "
            f"{expected}); the file is damaged, re-export it"
        )
    raw = np.frombuffer(data, dtype=np.uint8, count=expected).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prior = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        ftype = int(raw[y, 0])
        line = raw[y, 1:]
        if ftype == 0:  # None
            cur = line.copy()
        elif ftype == 1:  # Sub: running sum per channel, modulo 256
            cur = (
                np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) & 0xFF
            ).astype(np.uint8).reshape(stride)
        elif ftype == 2:  # Up
            cur = line + prior
        elif ftype in (3, 4):  # Average, Paeth: sequential along the row
            cur_b = bytearray(line.tobytes())
            up = prior.tobytes()
            if ftype == 3:
                for i in range(stride):
                    left = cur_b[i - bpp] if i >= bpp else 0
                    cur_b[i] = (cur_b[i] + ((left + up[i]) >> 1)) & 0xFF
            else:
                for i in range(stride):
                    if i >= bpp:
                        a = cur_b[i - bpp]
                        c = up[i - bpp]
                    else:
                        a = c = 0
                    b = up[i]
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if (pa <= pb and pa <= pc) else (b if pb <= pc else c)
                    cur_b[i] = (cur_b[i] + pred) & 0xFF
            cur = np.frombuffer(bytes(cur_b), dtype=np.uint8)
        else:
            raise InputError(
                f"image {where}: PNG row {y} uses unknown filter type {ftype}; "
                "the file is damaged, re-export it"
            )
        out[y] = cur
        prior = cur
    return out


def decode_png(data: bytes, where: str = "<bytes>") -> np.ndarray:
    """Decode PNG bytes to (H, W, C) uint8 with C = 1 (gray), 2 (gray+alpha), 3 or 4.

    Only 8-bit, non-interlaced, non-palette images are read; others raise InputError.
    """
    if not data.startswith(_PNG_SIGNATURE):
        raise InputError(f"image {where}: not a PNG file (bad signature); {_CONVERT_HINT.format(src=where)}")
    pos = len(_PNG_SIGNATURE)
    header: tuple[int, ...] | None = None
    idat: list[bytes] = []
    seen_end = False
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        crc_bytes = data[pos + 8 + length : pos + 12 + length]
        if len(body) != length or len(crc_bytes) != 4:
            raise InputError(f"image {where}: PNG chunk {kind!r} is truncated; the file is damaged, re-export it")
        if struct.unpack(">I", crc_bytes)[0] != zlib.crc32(kind + body) & 0xFFFFFFFF:
            raise InputError(
                f"image {where}: PNG chunk {kind.decode('latin-1')} fails its CRC check; "
                "the file is damaged, re-export it"
            )
        pos += 12 + length
        if kind == b"IHDR":
            if length != 13:
                raise InputError(f"image {where}: PNG header has {length} bytes, expected 13; the file is damaged")
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            seen_end = True
            break
        elif kind == b"PLTE":
            pass  # only meaningful for palette images, which are refused below
        elif kind[:1].isupper():
            raise InputError(
                f"image {where}: PNG has unknown critical chunk {kind.decode('latin-1')!r}; "
                + _CONVERT_HINT.format(src=where)
            )
    if header is None:
        raise InputError(f"image {where}: PNG has no IHDR header; the file is damaged, re-export it")
    if not idat or not seen_end:
        raise InputError(f"image {where}: PNG is truncated (no image data or no IEND); re-export it")
    width, height, depth, color_type, compression, filter_method, interlace = header
    if color_type not in _PNG_COLOR_TYPES:
        raise InputError(f"image {where}: PNG color type {color_type} is invalid; the file is damaged")
    mode, channels = _PNG_COLOR_TYPES[color_type]
    if color_type == 3:
        raise InputError(
            f"image {where}: palette PNGs are not supported (expected 8-bit RGB, RGBA or gray); "
            + _CONVERT_HINT.format(src=where)
        )
    if depth != 8:
        raise InputError(
            f"image {where}: {depth}-bit {mode} PNG is not supported, expected 8 bits per channel; "
            + _CONVERT_HINT.format(src=where)
        )
    if interlace != 0:
        raise InputError(
            f"image {where}: interlaced (Adam7) PNG is not supported, expected non-interlaced; "
            + _CONVERT_HINT.format(src=where)
        )
    if compression != 0 or filter_method != 0:
        raise InputError(f"image {where}: PNG uses unknown compression/filter method; the file is damaged")
    if width == 0 or height == 0:
        raise InputError(f"image {where}: PNG is empty ({width}x{height})")
    try:
        pixels = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise InputError(f"image {where}: PNG pixel data does not decompress ({exc}); the file is damaged") from exc
    rows = _unfilter(pixels, height, width, channels, where)
    return rows.reshape(height, width, channels)


def _to_rgb(arr: np.ndarray, where: str, kind: str) -> np.ndarray:
    """(H,W), (H,W,1|2|3|4) uint8 -> (H,W,3) uint8: alpha dropped, gray repeated."""
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 2, 3, 4):
        raise InputError(
            f"{kind} {where}: array shape {tuple(arr.shape)}, expected (height, width, 3) RGB "
            "(or (height, width) gray, (height, width, 4) RGBA)"
        )
    c = arr.shape[2]
    if c in (1, 2):  # gray, gray+alpha
        arr = np.repeat(arr[:, :, :1], 3, axis=2)
    elif c == 4:  # RGBA
        arr = arr[:, :, :3]
    return np.ascontiguousarray(arr)


def read_png(path: PathLike) -> np.ndarray:
    """Read an 8-bit PNG as (H, W, 3) uint8 RGB (alpha dropped, gray repeated)."""
    where = str(path)
    return _to_rgb(decode_png(_read_file(path, "image"), where), where, "image")


def _describe_size(width: int, height: int) -> str:
    return f"{width}x{height}"


def read_image(
    path: PathLike, *, height: int, width: int, pipeline: str | None = None
) -> np.ndarray:
    """Read a reference image (.png or .npy) as (height, width, 3) uint8 RGB.

    RGBA loses its alpha, gray is repeated into three channels. Any other dtype or bit
    depth, and any size other than exactly ``width`` x ``height``, raise InputError.
    ``pipeline`` only names the pipeline in the size message.
    """
    where = str(path)
    p = Path(path)
    suffix = p.suffix.lower()
    data = _read_file(p, "image")
    if suffix == ".png" or (suffix != ".npy" and data.startswith(_PNG_SIGNATURE)):
        rgb = _to_rgb(decode_png(data, where), where, "image")
    elif suffix == ".npy" or data.startswith(_NPY_MAGIC):
        rgb = _load_npy_image(data, where)
    else:
        what = {
            ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WebP", ".bmp": "BMP", ".gif": "GIF",
            ".tif": "TIFF", ".tiff": "TIFF",
        }.get(suffix, f"'{suffix or '(no extension)'}'")
        raise InputError(
            f"image {where}: {what} files are not supported, expected .png or .npy; "
            f"convert it, e.g. ffmpeg -i {where} -pix_fmt rgb24 reference.png"
        )
    got_h, got_w = rgb.shape[:2]
    if (got_h, got_w) != (int(height), int(width)):
        for_pipeline = f" for pipeline '{pipeline}'" if pipeline else ""
        raise InputError(
            f"image {where}: size {_describe_size(got_w, got_h)}, expected "
            f"{_describe_size(int(width), int(height))} (width x height){for_pipeline}; "
            "resize it or pick a pipeline with that resolution"
        )
    return rgb


def _load_npy_image(data: bytes, where: str) -> np.ndarray:
    import io

    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # ValueError for pickled/object arrays, others for damage
        raise InputError(
            f"image {where}: cannot read as a .npy array ({exc}); save it with "
            "numpy.save(path, uint8_array_of_shape_HxWx3)"
        ) from exc
    if not isinstance(arr, np.ndarray):
        raise InputError(f"image {where}: expected a single .npy array, found {type(arr).__name__}")
    if arr.dtype != np.uint8:
        raise InputError(
            f"image {where}: dtype {arr.dtype}, expected uint8 (0..255 per channel); convert it, "
            "e.g. numpy.save(path, numpy.clip(a * 255, 0, 255).round().astype(numpy.uint8)) "
            "for floats in [0, 1]"
        )
    return _to_rgb(arr, where, "image")


# ---------------------------------------------------------------------------------------
# WAV
# ---------------------------------------------------------------------------------------


def _resample_hint(where: str, sample_rate: int) -> str:
    return f"ffmpeg -i {where} -ar {sample_rate} -ac 1 -c:a pcm_s16le out.wav"


def read_wav(path: PathLike, *, sample_rate: int) -> np.ndarray:
    """Read a 16-bit PCM WAV (mono, or stereo downmixed) as float32 mono in [-1, 1].

    The file's sample rate must equal ``sample_rate``; empty audio is an error.
    """
    where = str(path)
    p = Path(path)
    if not p.exists():
        raise InputError(f"audio {where}: file not found; check the path")
    if p.is_dir():
        raise InputError(f"audio {where}: is a directory, expected a file")
    try:
        with wave.open(str(p), "rb") as wf:
            channels = wf.getnchannels()
            width = wf.getsampwidth()
            rate = wf.getframerate()
            nframes = wf.getnframes()
            raw = wf.readframes(nframes)
    except OSError as exc:
        raise InputError(f"audio {where}: cannot read ({exc.strerror or exc})") from exc
    except (wave.Error, EOFError, struct.error) as exc:
        raise InputError(
            f"audio {where}: not a 16-bit PCM WAV file ({exc}); convert it, e.g. "
            + _resample_hint(where, sample_rate)
        ) from exc
    if width != 2:
        raise InputError(
            f"audio {where}: {8 * width}-bit samples, expected 16-bit PCM; convert it, e.g. "
            + _resample_hint(where, sample_rate)
        )
    if channels not in (1, 2):
        raise InputError(
            f"audio {where}: {channels} channels, expected mono or stereo; downmix it, e.g. "
            + _resample_hint(where, sample_rate)
        )
    if rate != int(sample_rate):
        raise InputError(
            f"audio {where}: sample rate {rate} Hz, expected {int(sample_rate)} Hz; resample it, e.g. "
            + _resample_hint(where, sample_rate)
        )
    usable = len(raw) - len(raw) % (2 * channels)
    ints = np.frombuffer(raw[:usable], dtype="<i2").reshape(-1, channels)
    if ints.shape[0] == 0:
        raise InputError(f"audio {where}: contains no samples (0 seconds); give a file with speech in it")
    if channels == 2:
        mixed = ints.astype(np.float64).mean(axis=1)
    else:
        mixed = ints[:, 0].astype(np.float64)
    out = np.clip(mixed / _INT16_SCALE, -1.0, 1.0).astype(np.float32)
    return out


def check_audio(
    samples: Any,
    *,
    sample_rate: int,
    min_seconds: float | None = None,
    max_seconds: float | None = None,
    where: str = "audio",
) -> np.ndarray:
    """Validate mono float audio and return it as contiguous float32.

    Checks: 1-D, a float dtype, non-empty, all finite, peak within [-1, 1], and the
    duration ``len / sample_rate`` within ``[min_seconds, max_seconds]`` when given.
    ``where`` names the source in messages (a file path, or "audio").
    """
    if int(sample_rate) <= 0:
        raise InputError(f"{where}: sample rate {sample_rate} Hz, expected a positive integer")
    arr = np.asarray(samples)
    if arr.ndim != 1:
        raise InputError(
            f"{where}: shape {tuple(arr.shape)}, expected mono 1-D samples; downmix it first "
            "(e.g. samples.mean(axis=1) for (n, channels))"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise InputError(
            f"{where}: dtype {arr.dtype}, expected float samples in [-1, 1]; "
            "for int16 PCM divide by 32767"
        )
    if arr.size == 0:
        raise InputError(f"{where}: contains no samples (0 seconds); give audio with speech in it")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise InputError(f"{where}: {bad} samples are NaN or infinite; expected finite values in [-1, 1]")
    peak = float(np.max(np.abs(arr)))
    if peak > 1.0 + 1e-6:
        raise InputError(
            f"{where}: peak amplitude {peak:.4g}, expected within [-1, 1]; normalise it "
            "(e.g. samples / abs(samples).max())"
        )
    seconds = arr.size / float(sample_rate)
    if min_seconds is not None and seconds < min_seconds:
        raise InputError(
            f"{where}: {seconds:.3f} s long, expected at least {min_seconds:g} s; give a longer clip"
        )
    if max_seconds is not None and seconds > max_seconds:
        raise InputError(
            f"{where}: {seconds:.3f} s long, expected at most {max_seconds:g} s; trim it, e.g. "
            f"ffmpeg -i in.wav -t {max_seconds:g} out.wav"
        )
    return np.ascontiguousarray(arr, dtype=np.float32)


def encode_wav_bytes(samples: Any, sample_rate: int) -> bytes:
    """16-bit PCM mono WAV bytes for float samples in [-1, 1] (clipped)."""
    import io

    arr = check_audio(samples, sample_rate=sample_rate)
    ints = np.round(np.clip(arr.astype(np.float64), -1.0, 1.0) * _INT16_SCALE).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(int(sample_rate))
        wf.writeframes(ints.tobytes())
    return buf.getvalue()


def write_wav(path: PathLike, samples: Any, sample_rate: int) -> Path:
    """Write float mono samples in [-1, 1] as a 16-bit PCM mono WAV, atomically."""
    _write_bytes_atomic(path, encode_wav_bytes(samples, sample_rate))
    return Path(path)


# ---------------------------------------------------------------------------------------
# MP4 through the ffmpeg binary
# ---------------------------------------------------------------------------------------


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary bundled with imageio-ffmpeg (imported lazily)."""
    try:
        import imageio_ffmpeg
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise MediaError(
            "imageio-ffmpeg is not installed; install it (pip install imageio-ffmpeg), "
            "it ships the ffmpeg binary used to write MP4"
        ) from exc
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as exc:  # pragma: no cover - broken install
        raise MediaError(f"no usable ffmpeg binary: {exc}; reinstall imageio-ffmpeg") from exc


@dataclasses.dataclass(frozen=True)
class Mp4File:
    """What :func:`write_mp4` wrote."""

    path: Path
    frames: int
    seconds: float
    bytes: int


@dataclasses.dataclass(frozen=True)
class Mp4Probe:
    """What ffmpeg reports about an MP4 (see :func:`probe_mp4`)."""

    video_codec: str | None
    audio_codec: str | None
    width: int | None
    height: int | None
    fps: float | None
    duration: float | None
    audio_sample_rate: int | None
    frames: int | None


def _as_rgb_frame(frame: Any, where: str) -> np.ndarray:
    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        raise InputError(
            f"{where}: dtype {arr.dtype}, expected uint8 RGB; convert it, e.g. "
            "numpy.clip(x * 255, 0, 255).round().astype(numpy.uint8) for floats in [0, 1]"
        )
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"{where}: shape {tuple(arr.shape)}, expected (height, width, 3) RGB")
    return np.ascontiguousarray(arr)


def _stderr_tail(text: str) -> str:
    text = text.strip()
    if len(text) > _STDERR_TAIL_CHARS:
        text = "..." + text[-_STDERR_TAIL_CHARS:]
    return text or "(ffmpeg printed nothing)"


def _iter_frames(frames: Any) -> Iterator[Any]:
    if isinstance(frames, np.ndarray):
        if frames.ndim != 4:
            raise InputError(
                f"video frames: array shape {tuple(frames.shape)}, expected (frames, height, width, 3) uint8"
            )
        return iter(frames)
    if not isinstance(frames, Iterable):
        raise InputError(f"video frames: got {type(frames).__name__}, expected an array or an iterable of frames")
    return iter(frames)


def write_mp4(
    path: PathLike,
    frames: Iterable[np.ndarray] | np.ndarray,
    *,
    fps: float,
    audio: np.ndarray | None = None,
    sample_rate: int | None = None,
    crf: int = 18,
    preset: str = "veryfast",
) -> Mp4File:
    """Encode RGB frames (and optionally mono audio) as an H.264/AAC MP4, atomically.

    ``frames`` is an (N, H, W, 3) uint8 array or any iterable of (H, W, 3) uint8 frames
    (streamed to ffmpeg one at a time, so a generator never holds the video in memory).
    Odd widths/heights are padded to even by repeating the last column/row (yuv420p
    needs even sizes). Audio, when given, is padded with silence or cut to the video's
    length. On any failure the temporary file is removed and ``path`` is left untouched.
    """
    try:
        fps_f = float(fps)
    except (TypeError, ValueError):
        raise InputError(f"video {path}: fps {fps!r}, expected a positive number") from None
    if not math.isfinite(fps_f) or fps_f <= 0:
        raise InputError(f"video {path}: fps {fps!r}, expected a positive number")
    if audio is not None:
        if sample_rate is None:
            raise InputError(f"video {path}: audio given without sample_rate; pass sample_rate=16000 (or the audio's rate)")
        audio = check_audio(audio, sample_rate=sample_rate, where=f"audio for video {path}")

    it = _iter_frames(frames)
    try:
        first = next(it)
    except StopIteration:
        raise InputError(f"video {path}: no frames to write; expected at least one frame") from None
    first = _as_rgb_frame(first, f"video {path}: frame 0")

    exe = ffmpeg_exe()
    target = Path(path)
    with contextlib.ExitStack() as stack:
        tmp_mp4 = stack.enter_context(_atomic_path(target, suffix=".tmp.mp4"))
        if audio is None:
            count = _encode_h264(exe, tmp_mp4, first, it, fps_f, crf, preset, where=str(path))
        else:
            # Pass 1: video only. Pass 2: copy the video and add the audio, cut or padded
            # with silence to exactly the video's length (only known once every frame is in;
            # ffmpeg's own apad + -shortest overshoots by up to a second).
            tmp_video = _scratch(stack, target.parent, f".{target.name}.", ".video.mp4")
            count = _encode_h264(exe, tmp_video, first, it, fps_f, crf, preset, where=str(path))
            n = max(1, int(round(count / fps_f * int(sample_rate))))
            fitted = np.zeros(n, dtype=np.float32)
            fitted[: min(n, audio.size)] = audio[:n]
            tmp_wav = _scratch(stack, None, "avatar-audio-", ".wav")
            with open(tmp_wav, "wb") as fh:
                fh.write(encode_wav_bytes(fitted, int(sample_rate)))
            _run_ffmpeg(
                [
                    exe, "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
                    "-i", str(tmp_video), "-i", str(tmp_wav),
                    "-map", "0:v:0", "-map", "1:a:0", "-c:v", "copy", "-c:a", "aac", "-b:a", "128k",
                    "-movflags", "+faststart", "-f", "mp4", str(tmp_mp4),
                ],
                f"video {path}: ffmpeg failed adding the audio track",
            )
        size = os.path.getsize(tmp_mp4)
    return Mp4File(path=target, frames=count, seconds=count / fps_f, bytes=size)


def _scratch(stack: contextlib.ExitStack, directory: Path | None, prefix: str, suffix: str) -> Path:
    """A temporary file (in ``directory``, or the system temp dir) removed when ``stack`` closes."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    os.close(fd)
    stack.callback(lambda: os.path.exists(name) and os.unlink(name))
    return Path(name)


def _run_ffmpeg(cmd: list[str], failure: str) -> None:
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as exc:
        raise MediaError(f"{failure}: cannot start ffmpeg ({cmd[0]}): {exc}") from exc
    if res.returncode != 0:
        raise MediaError(
            f"{failure} (exit {res.returncode}):\n" + _stderr_tail(res.stderr.decode("utf-8", "replace"))
        )


def _encode_h264(
    exe: str,
    out: Path,
    first: np.ndarray,
    it: Iterator[Any],
    fps: float,
    crf: int,
    preset: str,
    *,
    where: str,
) -> int:
    """Stream ``first`` then the rest of ``it`` into libx264; return the frame count."""
    height, width, _ = first.shape
    pad_h, pad_w = height % 2, width % 2
    cmd = [
        exe, "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24",
        "-s", f"{width + pad_w}x{height + pad_h}", "-r", repr(fps), "-i", "pipe:0",
        "-map", "0:v:0",
        "-c:v", "libx264", "-preset", preset, "-crf", str(int(crf)),
        # RGB -> BT.709 limited-range YUV, tagged as such so players convert back correctly.
        "-vf", "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p",
        "-pix_fmt", "yuv420p",
        "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv",
        "-movflags", "+faststart", "-f", "mp4", str(out),
    ]
    with tempfile.TemporaryFile() as err_file:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err_file)
        except OSError as exc:
            raise MediaError(f"video {where}: cannot start ffmpeg ({exe}): {exc}") from exc
        assert proc.stdin is not None

        def stderr_text() -> str:
            err_file.seek(0)
            return err_file.read().decode("utf-8", "replace")

        count = 0
        ok = False
        try:
            frame = first
            while True:
                if pad_h or pad_w:  # yuv420p needs even sizes: repeat the last row/column
                    frame = np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
                try:
                    proc.stdin.write(memoryview(frame).cast("B"))
                except BrokenPipeError:
                    proc.wait()
                    raise MediaError(
                        f"video {where}: ffmpeg stopped after {count} frames (exit {proc.returncode}):\n"
                        + _stderr_tail(stderr_text())
                    ) from None
                count += 1
                try:
                    nxt = next(it)
                except StopIteration:
                    break
                nxt = _as_rgb_frame(nxt, f"video {where}: frame {count}")
                if nxt.shape != first.shape:
                    raise InputError(
                        f"video {where}: frame {count} has shape {tuple(nxt.shape)}, expected "
                        f"{tuple(first.shape)} like frame 0; all frames must have the same size"
                    )
                frame = nxt
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
            rc = proc.wait()
            if rc != 0:
                raise MediaError(
                    f"video {where}: ffmpeg failed (exit {rc}) encoding {count} frames:\n"
                    + _stderr_tail(stderr_text())
                )
            ok = True
        finally:
            if not ok:
                if proc.poll() is None:
                    proc.kill()
                with contextlib.suppress(Exception):
                    proc.stdin.close()
                proc.wait()
    return count


_STREAM_RE = re.compile(r"Stream #\d+:\d+[^:]*: (Video|Audio): ([A-Za-z0-9_]+)(.*)")
_SIZE_RE = re.compile(r"(?:^|[ ,])(\d{1,5})x(\d{1,5})(?:[ ,\[]|$)")
_FPS_RE = re.compile(r"([\d.]+)(k?) fps")
_DURATION_RE = re.compile(r"Duration: (\d+):(\d+):([\d.]+)")
_HZ_RE = re.compile(r"(\d+) Hz")


def probe_mp4(path: PathLike, *, count_frames: bool = True) -> Mp4Probe:
    """Codecs, frame size, fps and duration of a video, from ``ffmpeg -i`` output.

    With ``count_frames`` the video stream is also decoded to count its frames exactly.
    """
    where = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError(f"video {where}: file not found; check the path")
    res = subprocess.run(
        [ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(p)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    text = res.stderr.decode("utf-8", "replace")
    video_codec = audio_codec = None
    width = height = rate = None
    fps: float | None = None
    for line in text.splitlines():
        m = _STREAM_RE.search(line)
        if not m:
            continue
        kind, codec, rest = m.groups()
        if kind == "Video" and video_codec is None:
            video_codec = codec
            sm = _SIZE_RE.search(rest)
            if sm:
                width, height = int(sm.group(1)), int(sm.group(2))
            fm = _FPS_RE.search(rest)
            if fm:
                fps = float(fm.group(1)) * (1000.0 if fm.group(2) else 1.0)
        elif kind == "Audio" and audio_codec is None:
            audio_codec = codec
            hm = _HZ_RE.search(rest)
            if hm:
                rate = int(hm.group(1))
    if video_codec is None and audio_codec is None:
        raise InputError(f"video {where}: ffmpeg finds no audio or video stream:\n" + _stderr_tail(text))
    duration = None
    dm = _DURATION_RE.search(text)
    if dm:
        duration = int(dm.group(1)) * 3600 + int(dm.group(2)) * 60 + float(dm.group(3))
    frames = None
    if count_frames and video_codec is not None:
        frames = _count_frames(p)
    return Mp4Probe(video_codec, audio_codec, width, height, fps, duration, rate, frames)


def _decode_cmd(p: Path) -> list[str]:
    return [
        ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(p),
        "-map", "0:v:0", "-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1",
    ]


def _count_frames(p: Path) -> int:
    """Number of frames in the first video stream, by decoding it to rgb24 on a pipe."""
    info = probe_mp4(p, count_frames=False)
    if not info.width or not info.height:
        raise MediaError(f"video {p}: cannot tell the frame size from ffmpeg's output")
    frame_bytes = info.width * info.height * 3
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(_decode_cmd(p), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        total = 0
        assert proc.stdout is not None
        while chunk := proc.stdout.read(1 << 20):
            total += len(chunk)
        rc = proc.wait()
        if rc != 0:
            err.seek(0)
            raise MediaError(f"video {p}: ffmpeg could not decode it (exit {rc}):\n" + _stderr_tail(err.read().decode("utf-8", "replace")))
    return total // frame_bytes


def read_mp4_frames(path: PathLike) -> np.ndarray:
    """Decode every frame of a video's first video stream as (N, H, W, 3) uint8 RGB.

    Sizes are those stored in the file (odd sizes come back padded to even).
    """
    p = Path(path)
    info = probe_mp4(p, count_frames=False)
    if not info.width or not info.height:
        raise MediaError(f"video {p}: cannot tell the frame size from ffmpeg's output")
    res = subprocess.run(_decode_cmd(p), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if res.returncode != 0:
        raise MediaError(
            f"video {p}: ffmpeg could not decode it (exit {res.returncode}):\n"
            + _stderr_tail(res.stderr.decode("utf-8", "replace"))
        )
    frame_bytes = info.width * info.height * 3
    n = len(res.stdout) // frame_bytes
    return np.frombuffer(res.stdout[: n * frame_bytes], dtype=np.uint8).reshape(n, info.height, info.width, 3)


# ---------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------


def frame_sha256(frame: np.ndarray) -> str:
    """Hex SHA-256 of a uint8 frame's bytes in C order (layout independent)."""
    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        raise InputError(f"frame_sha256: dtype {arr.dtype}, expected uint8")
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _same_shape(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise InputError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}; compare frames of the same size")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 images; ``inf`` when equal."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != np.uint8 or b.dtype != np.uint8:
        raise InputError(f"psnr: dtypes {a.dtype} and {b.dtype}, expected uint8 for both")
    _same_shape(a, b, "psnr")
    if a.size == 0:
        raise InputError("psnr: empty arrays")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(255.0 * 255.0 / mse)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> int | float:
    """Largest absolute elementwise difference (an int for integer inputs, else a float)."""
    a = np.asarray(a)
    b = np.asarray(b)
    _same_shape(a, b, "max_abs_diff")
    if a.size == 0:
        return 0
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return int(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64))))
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
