"""The video track of an MP4: libx264 on the bundled ffmpeg's stdin, fed raw RGB frames one at a time.

:class:`~.video.Mp4Writer` drives it; the muxing of the audio track stays there. ffmpeg's log
goes to a temporary file, not a pipe, so however much it prints it can never block the encoder.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import InputError, MediaError
from ._ffmpeg import stderr_tail

__all__ = ["BT709_ARGS", "H264Pipe"]

# Output colour, shared by every H.264 the project writes (render's MP4, serve's fMP4): RGB -> BT.709
# limited (tv) range 4:2:0, said in the stream as well as done by the scaler, so players convert back.
BT709_ARGS = (
    "-vf",
    "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p",
    "-pix_fmt",
    "yuv420p",
    "-colorspace",
    "bt709",
    "-color_primaries",
    "bt709",
    "-color_trc",
    "bt709",
    "-color_range",
    "tv",
)


class H264Pipe:
    """libx264 on ffmpeg's stdin, writing a video-only MP4 to ``out``; frames one at a time."""

    def __init__(self, exe: str, out: Path, shape: tuple[int, ...], fps: float, crf: int, preset: str, where: str):
        height, width, _ = shape
        self.shape, self.where, self.count = shape, where, 0
        self._pad = ((0, height % 2), (0, width % 2), (0, 0))  # yuv420p needs even sizes
        cmd = [
            exe,
            "-hide_banner",
            "-nostdin",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-s",
            f"{width + width % 2}x{height + height % 2}",
            "-r",
            repr(fps),
            "-i",
            "pipe:0",
            "-map",
            "0:v:0",
            "-c:v",
            "libx264",
            "-preset",
            preset,
            "-crf",
            str(int(crf)),
            *BT709_ARGS,
            "-movflags",
            "+faststart",
            "-f",
            "mp4",
            str(out),
        ]
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: ffmpeg's log can never block it
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._err)
        except OSError as exc:
            self._err.close()
            raise MediaError(f"video {where}: cannot start ffmpeg ({exe}): {exc}") from exc

    @property
    def _stdin(self) -> IO[bytes]:
        stdin = self._proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        return stdin

    def _stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode("utf-8", "replace")

    def write(self, frame: np.ndarray) -> None:
        if frame.shape != self.shape:
            raise InputError(
                f"video {self.where}: frame {self.count} has shape {tuple(frame.shape)}, expected "
                f"{tuple(self.shape)} like frame 0; all frames must have the same size"
            )
        if self._pad[0][1] or self._pad[1][1]:  # repeat the last row/column
            frame = np.pad(frame, self._pad, mode="edge")
        try:
            # numpy's stubs give ndarray __buffer__ only for Python >= 3.12; it has the buffer protocol on 3.11 too
            self._stdin.write(memoryview(frame).cast("B"))  # type: ignore[arg-type]
        except BrokenPipeError:
            self._proc.wait()
            raise MediaError(
                f"video {self.where}: ffmpeg stopped after {self.count} frames (exit {self._proc.returncode}):\n"
                + stderr_tail(self._stderr())
            ) from None
        self.count += 1

    def close(self) -> int:
        """Flush and wait for ffmpeg; the number of frames written."""
        with contextlib.suppress(BrokenPipeError):
            self._stdin.close()
        rc = self._proc.wait()
        try:
            if rc != 0:
                raise MediaError(
                    f"video {self.where}: ffmpeg failed (exit {rc}) encoding {self.count} frames:\n"
                    + stderr_tail(self._stderr())
                )
        finally:
            self._err.close()
        return self.count

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        with contextlib.suppress(Exception):
            self._stdin.close()
        self._proc.wait()
        self._err.close()
