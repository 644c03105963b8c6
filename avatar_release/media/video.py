"""H.264 MP4 out (and probed, and decoded back for tests) through the bundled ffmpeg binary.

:class:`Mp4Writer` takes frames and samples as they are made: frames go to libx264 as raw rgb24
on ffmpeg's stdin (yuv420p, BT.709, limited range; the encoder pipe is :mod:`._h264`), one at a
time, and mono samples go to a 16-bit scratch file beside the output, so neither is held in
memory however long the video.
``finish`` then muxes the samples in as AAC, cut or padded with silence to the video's length
(only known once every frame is in; ffmpeg's own apad + -shortest overshoots by up to a
second). :func:`write_mp4` does the same for frames and audio already in hand. The file appears
atomically (``_atomic``): a failed encode leaves ``path`` as it was, and no scratch behind.
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
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, MediaError
from ._ffmpeg import ffmpeg_exe, stderr_tail
from ._files import PathLike, check_output, output_path, scratch_beside
from ._h264 import H264Pipe
from .audio import check_audio, pcm16

__all__ = ["Mp4File", "Mp4Probe", "Mp4Writer", "write_mp4", "probe_mp4", "read_mp4_frames"]

# Silence is appended this many samples at a time when the audio is shorter than the video.
_PAD_SAMPLES = 1 << 16


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


def _check_fps(fps: Any, where: str) -> float:
    try:
        fps_f = float(fps)
    except (TypeError, ValueError):
        raise InputError(f"video {where}: fps {fps!r}, expected a positive number") from None
    if not math.isfinite(fps_f) or fps_f <= 0:
        raise InputError(f"video {where}: fps {fps!r}, expected a positive number")
    return fps_f


class Mp4Writer:
    """An H.264 (+ AAC) MP4 written while frames and samples are still being made.

    ``add_frames``/``add_frame`` stream RGB frames to the encoder; ``add_audio`` appends mono
    float samples in [-1, 1] (any number of calls, any sizes) when the writer was given a
    ``sample_rate``; ``finish`` muxes and publishes ``path`` and returns what was written.
    Use it as a context manager: leaving the block without ``finish`` (an exception, a
    consumer that stopped) kills ffmpeg and removes every scratch file, and ``path`` is left
    as it was (scratch files carry ``_atomic.TMP_PREFIX``, so a killed process's are swept). Odd widths/heights are padded to even by repeating the last column/row.
    """

    def __init__(
        self, path: PathLike, *, fps: float, sample_rate: int | None = None, crf: int = 18, preset: str = "veryfast"
    ):
        self.where, self.target = str(path), Path(path)
        self.fps = _check_fps(fps, self.where)
        self.sample_rate = None if sample_rate is None else int(sample_rate)
        if self.sample_rate is not None and self.sample_rate <= 0:
            raise InputError(f"video {path}: sample rate {sample_rate} Hz, expected a positive integer")
        check_output(self.target)
        self._crf, self._preset, self._exe = crf, preset, ffmpeg_exe()
        self._scratch: list[Path] = []  # created with the first frame and the first samples
        self._video_path: Path | None = None
        self._video: H264Pipe | None = None
        self._pcm: BinaryIO | None = None
        self.samples = 0  # samples added so far
        self._done = False

    def _new_scratch(self, suffix: str) -> Path:
        p = scratch_beside(self.target, suffix)
        self._scratch.append(p)
        return p

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.abort()

    # ------------------------------------------------------------------ input
    @property
    def frames(self) -> int:
        return self._video.count if self._video is not None else 0

    def add_frame(self, frame: Any) -> None:
        frame = _as_rgb_frame(frame, f"video {self.where}: frame {self.frames}")
        if self._video is None:
            self._video_path = self._new_scratch(".video.mp4")
            self._video = H264Pipe(
                self._exe, self._video_path, frame.shape, self.fps, self._crf, self._preset, self.where
            )
        self._video.write(frame)

    def add_frames(self, frames: Iterable[np.ndarray] | np.ndarray) -> None:
        """An (N, H, W, 3) uint8 array or any iterable of (H, W, 3) uint8 frames."""
        for frame in _iter_frames(frames):
            self.add_frame(frame)

    def add_audio(self, samples: Any) -> None:
        """Append mono float samples in [-1, 1] to the audio track (written to disk at once)."""
        if self.sample_rate is None:
            raise InputError(
                f"video {self.where}: audio given without sample_rate; pass sample_rate=16000 (or the audio's rate)"
            )
        arr = np.asarray(samples)
        if arr.ndim == 1 and arr.size == 0:
            return
        arr = check_audio(arr, sample_rate=self.sample_rate, where=f"audio for video {self.where}")
        if self._pcm is None:
            self._pcm = open(self._new_scratch(".s16"), "wb")
        self._pcm.write(pcm16(arr))
        self.samples += arr.size

    # ------------------------------------------------------------------ output
    def finish(self) -> Mp4File:
        """Close the video, fit the audio to its length, mux, and publish ``path`` atomically."""
        if self._video is None:
            raise InputError(f"video {self.where}: no frames to write; expected at least one frame")
        assert self._video_path is not None  # made together with self._video
        count = self._video.close()
        with output_path(self.target, suffix=".mp4") as tmp_mp4:
            if self.sample_rate is None:
                os.replace(self._video_path, tmp_mp4)
            else:
                pcm = self._fit_audio(max(1, int(round(count / self.fps * self.sample_rate))))
                _run_ffmpeg(
                    [
                        self._exe,
                        "-hide_banner",
                        "-nostdin",
                        "-loglevel",
                        "error",
                        "-y",
                        "-i",
                        str(self._video_path),
                        "-f",
                        "s16le",
                        "-ar",
                        str(self.sample_rate),
                        "-ch_layout",
                        "mono",
                        "-i",
                        str(pcm),
                        "-map",
                        "0:v:0",
                        "-map",
                        "1:a:0",
                        "-c:v",
                        "copy",
                        "-c:a",
                        "aac",
                        "-b:a",
                        "128k",
                        "-movflags",
                        "+faststart",
                        "-f",
                        "mp4",
                        str(tmp_mp4),
                    ],
                    f"video {self.where}: ffmpeg failed adding the audio track",
                )
            size = os.path.getsize(tmp_mp4)
        self._done = True
        self._remove_scratch()
        return Mp4File(path=self.target, frames=count, seconds=count / self.fps, bytes=size)

    def _fit_audio(self, n: int) -> Path:
        """The scratch samples cut or padded with silence to exactly ``n`` samples; their path."""
        if self._pcm is None:
            self._pcm = open(self._new_scratch(".s16"), "wb")
        if self.samples > n:
            self._pcm.truncate(2 * n)
        else:
            left = n - self.samples
            while left > 0:
                k = min(left, _PAD_SAMPLES)
                self._pcm.write(bytes(2 * k))
                left -= k
        self._pcm.close()
        return Path(self._pcm.name)

    def abort(self) -> None:
        """Stop: kill ffmpeg, remove every scratch file; ``path`` is left as it was."""
        self._done = True
        if self._video is not None:
            self._video.kill()
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._pcm is not None:
            self._pcm.close()
        for p in self._scratch:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


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
    For frames and samples that arrive over time, use :class:`Mp4Writer`.
    """
    _check_fps(fps, str(path))
    if audio is not None:
        if sample_rate is None:
            raise InputError(
                f"video {path}: audio given without sample_rate; pass sample_rate=16000 (or the audio's rate)"
            )
        audio = check_audio(audio, sample_rate=sample_rate, where=f"audio for video {path}")
    it = _iter_frames(frames)
    with Mp4Writer(
        path, fps=fps, sample_rate=sample_rate if audio is not None else None, crf=crf, preset=preset
    ) as writer:
        if audio is not None:
            writer.add_audio(audio)
        writer.add_frames(it)
        return writer.finish()


def _run_ffmpeg(cmd: list[str], failure: str) -> None:
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as exc:
        raise MediaError(f"{failure}: cannot start ffmpeg ({cmd[0]}): {exc}") from exc
    if res.returncode != 0:
        raise MediaError(f"{failure} (exit {res.returncode}):\n" + stderr_tail(res.stderr.decode("utf-8", "replace")))


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
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
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
        ffmpeg_exe(),
        "-hide_banner",
        "-nostdin",
        "-loglevel",
        "error",
        "-i",
        str(p),
        "-map",
        "0:v:0",
        "-fps_mode",
        "passthrough",
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "pipe:1",
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
            raise MediaError(
                f"video {p}: ffmpeg could not decode it (exit {rc}):\n"
                + stderr_tail(err.read().decode("utf-8", "replace"))
            )
    return total // frame_bytes


def read_mp4_frames(path: PathLike) -> np.ndarray:
    """Decode every frame of a video's first video stream as (N, H, W, 3) uint8 RGB.

    Sizes are those stored in the file (odd sizes come back padded to even).
    """
    p = Path(path)
    info = probe_mp4(p, count_frames=False)
    if not info.width or not info.height:
        raise MediaError(f"video {p}: cannot tell the frame size from ffmpeg's output")
    res = subprocess.run(_decode_cmd(p), stdin=subprocess.DEVNULL, capture_output=True)
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
