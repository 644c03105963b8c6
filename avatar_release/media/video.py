"""H.264 MP4 out (and probed, and decoded back for tests) through the bundled ffmpeg binary.

Frames go to libx264 as raw rgb24 on ffmpeg's stdin (yuv420p, BT.709, limited range), one at a
time, so a generator of frames is never held in memory; mono audio is muxed in as AAC, cut or
padded with silence to the video's length. The file appears atomically (``_atomic``): a failed
encode leaves ``path`` as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import TMP_PREFIX
from ..errors import InputError, MediaError
from ._ffmpeg import ffmpeg_exe, stderr_tail
from ._files import PathLike, output_path
from .audio import check_audio, encode_wav_bytes

__all__ = ["Mp4File", "Mp4Probe", "write_mp4", "probe_mp4", "read_mp4_frames"]


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
        tmp_mp4 = stack.enter_context(output_path(target, suffix=".mp4"))
        if audio is None:
            count = _encode_h264(exe, tmp_mp4, first, it, fps_f, crf, preset, where=str(path))
        else:
            # Pass 1: video only. Pass 2: copy the video and add the audio, cut or padded
            # with silence to exactly the video's length (only known once every frame is in;
            # ffmpeg's own apad + -shortest overshoots by up to a second).
            tmp_video = _scratch(stack, target.parent, f"{TMP_PREFIX}{target.name[:48]}.", ".video.mp4")
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
            f"{failure} (exit {res.returncode}):\n" + stderr_tail(res.stderr.decode("utf-8", "replace"))
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
                        + stderr_tail(stderr_text())
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
                    + stderr_tail(stderr_text())
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
        raise InputError(f"video {where}: ffmpeg finds no audio or video stream:\n" + stderr_tail(text))
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
            raise MediaError(f"video {p}: ffmpeg could not decode it (exit {rc}):\n" + stderr_tail(err.read().decode("utf-8", "replace")))
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
            + stderr_tail(res.stderr.decode("utf-8", "replace"))
        )
    frame_bytes = info.width * info.height * 3
    n = len(res.stdout) // frame_bytes
    return np.frombuffer(res.stdout[: n * frame_bytes], dtype=np.uint8).reshape(n, info.height, info.width, 3)


# ---------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------
