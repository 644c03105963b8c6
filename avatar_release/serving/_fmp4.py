"""Fragmented MP4 out of ffmpeg while frames are still being rendered.

One ffmpeg process per request (the binary ``avatar_release.media.ffmpeg_exe()`` ships, never
one from PATH) reads raw RGB frames on stdin, the request audio from a private WAV, and writes
``ftyp`` + an empty ``moov`` and then one ``moof``/``mdat`` fragment per chunk to stdout:
``frag_keyframe`` cuts a fragment when a keyframe arrives, and the caller forces keyframes where
it wants the cuts (the render job: the last frame of each chunk, so a chunk's fragment leaves as
soon as the chunk is written); ``-tune zerolatency`` keeps x264 from holding frames back. Bytes go to ``on_bytes`` from a reader
thread as ffmpeg writes them, so nothing waits for the end of the video.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from typing import IO

import numpy as np

from ..errors import MediaError
from ..media import BT709_ARGS, encode_wav_bytes, ffmpeg_exe

__all__ = ["FragmentEncoder", "MOVFLAGS"]

MOVFLAGS = "frag_keyframe+empty_moov+default_base_moof"
_READ = 64 * 1024


class FragmentEncoder:
    """``write(frames)`` per chunk, then ``close()``; every byte of the fMP4 goes to ``on_bytes``."""

    def __init__(
        self,
        *,
        width: int,
        height: int,
        fps: int,
        audio: np.ndarray | None,
        sample_rate: int,
        n_frames: int,
        keyframes: list[int],
        on_bytes: Callable[[bytes], None],
        crf: int = 20,
        preset: str = "veryfast",
    ):
        self._tmp = tempfile.mkdtemp(prefix="avatar-serve-")
        self._on_bytes = on_bytes
        # None: a video without an audio track (a build with no audio input).
        sound = [] if audio is None else ["-i", _write_wav(self._tmp, audio, n_frames / fps, sample_rate)]
        self._pad_w, self._pad_h = width % 2, height % 2
        cmd = _command(
            size=f"{width + self._pad_w}x{height + self._pad_h}",
            fps=fps,
            sound=sound,
            keyframe_times=",".join(f"{k / fps:.6f}" for k in keyframes),
            gop=max(1, n_frames),
            crf=crf,
            preset=preset,
        )
        self._err = tempfile.TemporaryFile(dir=self._tmp)
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, bufsize=0
            )
        except OSError as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise MediaError(f"cannot start ffmpeg: {exc.strerror}") from None
        self._reader = threading.Thread(target=self._pump, name="fmp4-reader", daemon=True)
        self._reader.start()
        self.bytes_out = 0

    @property
    def _stdin(self) -> IO[bytes]:
        stdin = self._proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        return stdin

    def _pump(self) -> None:
        out = self._proc.stdout
        assert out is not None  # started with stdout=PIPE
        while True:
            data = out.read(_READ)
            if not data:
                return
            self.bytes_out += len(data)
            self._on_bytes(data)

    def write(self, frames: np.ndarray) -> None:
        """One chunk of (n, H, W, 3) uint8 frames; the caller may drop them afterwards."""
        if self._pad_h or self._pad_w:
            frames = np.pad(frames, ((0, 0), (0, self._pad_h), (0, self._pad_w), (0, 0)), mode="edge")
        try:
            self._stdin.write(np.ascontiguousarray(frames).tobytes())
        except (BrokenPipeError, OSError):
            raise MediaError(f"ffmpeg stopped reading frames: {self._stderr_tail()}") from None

    def close(self) -> None:
        """End of video: flush the last fragment and wait for ffmpeg; raises if it failed."""
        try:
            self._stdin.close()
        except OSError:
            pass
        rc = self._proc.wait()
        self._reader.join()
        try:
            if rc != 0:
                raise MediaError(f"ffmpeg failed encoding the stream (exit {rc}): {self._stderr_tail()}")
        finally:
            self._cleanup()

    def abort(self) -> None:
        """Stop now (client gone, render failed): kill ffmpeg, remove the scratch files."""
        if self._proc.poll() is None:
            self._proc.kill()
        try:
            self._stdin.close()
        except OSError:
            pass
        self._proc.wait()
        self._reader.join(5)
        self._cleanup()

    def _stderr_tail(self) -> str:
        try:
            self._err.seek(0)
            return self._err.read()[-400:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def _cleanup(self) -> None:
        try:
            self._err.close()
        except OSError:
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)


def _write_wav(tmp: str, audio: np.ndarray, seconds: float, sample_rate: int) -> str:
    """The audio as a WAV in ``tmp``, cut or padded with silence to exactly the video's length."""
    n = int(round(seconds * sample_rate))
    fitted = np.zeros(n, np.float32)
    fitted[: min(n, audio.size)] = audio[:n]
    wav = os.path.join(tmp, "audio.wav")
    with open(wav, "wb") as fh:
        fh.write(encode_wav_bytes(fitted, sample_rate))
    return wav


def _command(
    *, size: str, fps: int, sound: list[str], keyframe_times: str, gop: int, crf: int, preset: str
) -> list[str]:
    """ffmpeg's arguments: raw RGB frames on stdin (+ the WAV in ``sound``), fragmented MP4 on stdout."""
    frames_in = ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", size, "-r", str(fps), "-i", "pipe:0"]
    return [
        ffmpeg_exe(),
        *("-hide_banner", "-nostdin", "-loglevel", "error"),
        *frames_in,
        *sound,
        *("-map", "0:v:0"),
        *(["-map", "1:a:0"] if sound else []),
        *("-c:v", "libx264", "-preset", preset, "-tune", "zerolatency", "-crf", str(int(crf))),
        *("-force_key_frames", keyframe_times, "-g", str(gop)),
        *BT709_ARGS,
        *(["-c:a", "aac", "-b:a", "128k"] if sound else []),
        *("-movflags", MOVFLAGS, "-f", "mp4", "pipe:1"),
    ]
