"""Speech tracks in (any common format, through the bundled ffmpeg), WAV out (stdlib).

Decoding runs the ffmpeg binary that imageio-ffmpeg ships as a subprocess that writes raw
16-bit mono samples at the pipeline's rate to a pipe; :class:`AudioStream` reads that pipe
a chunk at a time, so memory does not grow with the file's length, and stops (killing
ffmpeg) as soon as the decoded audio passes ``max_seconds``.

The same file gives the same samples, on this machine and the next:

* the container is recognised from its first bytes (:mod:`._containers`) and ffmpeg is told
  which demuxer to use (``-f``), with only the ``file`` protocol allowed: a playlist or a
  concat script cannot make ffmpeg open other files or URLs;
* downmix and resampling are one ``aresample`` filter whose every option is pinned
  (``RESAMPLER``), working on 16-bit integers (``tsf=s16p``), so the arithmetic after
  decoding is integer and exact;
* ``-cpuflags 0`` turns off ffmpeg's hand-written SIMD: its float decoders (MP3, AAC, Opus)
  otherwise sum in a different order on CPUs with different vector units. We measured the
  MP3 decoder giving different samples with and without it; off, it costs about 2x decode
  time (a 10-minute MP3 in ~2 s), which buys samples that do not depend on the CPU;
* 16-bit samples become float32 as ``k / 32767``, the scale our WAV writer uses, so a WAV
  written by :func:`write_wav` at the pipeline's rate reads back as exactly the floats written.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import subprocess
import tempfile
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .._digest import StreamDigest
from ..errors import InputError, MediaError
from ._containers import sniff_container
from ._ffmpeg import ffmpeg_exe, ffmpeg_version, file_tail, stderr_tail
from ._files import PathLike, describe_head, input_file, write_output

__all__ = [
    "ACCEPTED_AUDIO",
    "DEFAULT_MAX_AUDIO_SECONDS",
    "RESAMPLER",
    "AudioProbe",
    "AudioSource",
    "AudioStream",
    "LoadedAudio",
    "check_audio",
    "encode_wav_bytes",
    "load_audio",
    "load_audio_bytes",
    "pcm16",
    "read_audio",
    "stream_audio",
    "write_wav",
]

ACCEPTED_AUDIO = (
    "WAV (8/16/24/32-bit PCM or float, any rate, any channels), MP3, M4A/AAC "
    "(or the audio of an MP4), FLAC, Ogg (Vorbis, Opus), WebM/Matroska, AIFF"
)
# 30 minutes: 115 MB of float32 at 16 kHz. A bound, so one request cannot fill the host when the
# track is read whole; a streamed render (``avatar_release.serving.render_to_files``) sets its own.
DEFAULT_MAX_AUDIO_SECONDS = 1800.0
# A header's duration may be an estimate (an MP3 without a Xing header: from its bitrate), so a
# file is refused from its header only when past the bound by more than this; decoding is exact.
_HEADER_SLACK_SECONDS = 1.0
_INT16_SCALE = 32767.0
_CHUNK_SECONDS = 1.0
_EXPORT_AS = "export it as WAV, MP3, M4A or FLAC (any recorder or audio editor does it)"

# Every option of ffmpeg's resampler that can change a sample, pinned (values are swr's
# documented defaults except linear_interp, pinned off, and the internal format, pinned to
# 16-bit so the downmix and resampling arithmetic is integer).
RESAMPLER = (
    ("resampler", "swr"),
    ("tsf", "s16p"),
    ("filter_type", "kaiser"),
    ("kaiser_beta", "9"),
    ("filter_size", "32"),
    ("phase_shift", "10"),
    ("linear_interp", "0"),
    ("exact_rational", "1"),
    ("cutoff", "0.97"),
    ("dither_method", "0"),
    ("matrix_encoding", "none"),
    ("clev", "0.707107"),
    ("slev", "0.707107"),
    ("lfe_mix_level", "0"),
    ("rmvol", "1"),
    ("rematrix_maxval", "0"),
)


@dataclasses.dataclass(frozen=True)
class AudioSource:
    """What was decoded and how: for messages and the render report."""

    path: str
    container: str  # from the file's first bytes: "MP3", "WAV", ...
    codec: str | None  # as ffmpeg names it: "mp3", "pcm_s16le", "aac", ...
    source_rate: int | None  # Hz, in the file
    channels: str | None  # "mono", "stereo", "5.1", ...
    sample_rate: int  # Hz, decoded
    samples: int  # decoded
    sha256: str  # of the decoded float32 little-endian samples
    decoder: str  # ffmpeg version and the pinned options

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seconds"] = round(self.seconds, 6)
        return d


@dataclasses.dataclass(frozen=True)
class AudioProbe:
    """What a file's header says, before any sample is decoded (see :meth:`AudioStream.probe`)."""

    container: str
    codec: str | None
    source_rate: int | None
    channels: str | None
    seconds: float | None  # the header's duration (ffmpeg's estimate for some MP3s); None if it has none


@dataclasses.dataclass(frozen=True)
class LoadedAudio:
    samples: np.ndarray  # (n,) float32 mono in [-1, 1]
    source: AudioSource


_INPUT_RE = re.compile(r"^Input #0, ([^,]+(?:,[^ ,]+)*), from", re.M)
_DURATION_RE = re.compile(r"^\s*Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)", re.M)
_AUDIO_RE = re.compile(r"Stream #0:\d+[^:]*: Audio: ([A-Za-z0-9_]+)[^,]*, (\d+) Hz, ([^,\n]+)")


def _found(text: str) -> tuple[str | None, int | None, str | None]:
    """(codec, rate, channels) of the first audio stream of the input, from ffmpeg's log."""
    head = text.split("Stream mapping:")[0].split("Output #0")[0]
    m = _AUDIO_RE.search(head)
    if not m:
        return None, None, None
    return m.group(1), int(m.group(2)), m.group(3).strip()


def _pcm16_chunks(pipe: IO[bytes], samples: int) -> Iterator[np.ndarray]:
    """int16 arrays of up to ``samples`` each, read from ffmpeg's stdout until it closes."""
    while buf := pipe.read(2 * samples):
        yield np.frombuffer(buf[: len(buf) - len(buf) % 2], "<i2")


class AudioStream:
    """Decoded mono float32 samples of one file, yielded in chunks as ffmpeg produces them.

    Iterate it (each pass runs the decoder afresh), or call :meth:`read` for one array.
    ``source`` describes the file and the decoded result after a complete pass.
    With ``cut`` the first ``max_seconds`` are kept; without it a longer file is refused.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        sample_rate: int,
        max_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
        chunk_seconds: float = _CHUNK_SECONDS,
        cut: bool = False,
        longer_fix: str | None = None,
    ):
        self.where = str(path)
        self.longer_fix = longer_fix  # the caller's own way past the bound, added to the refusal
        try:
            self.sample_rate = int(sample_rate)
            max_s, chunk_s = float(max_seconds), float(chunk_seconds)
        except (TypeError, ValueError):
            raise InputError(f"audio {path}: sample_rate, max_seconds and chunk_seconds must be numbers") from None
        if self.sample_rate <= 0 or not (math.isfinite(max_s) and max_s > 0) or not chunk_s > 0:
            raise InputError(
                f"audio {path}: sample rate {sample_rate} Hz, max {max_seconds} s, chunk "
                f"{chunk_seconds} s; expected positive numbers"
            )
        self.max_seconds = max_s
        self.max_samples = int(round(max_s * self.sample_rate))
        self.chunk_samples = max(1, int(round(chunk_s * self.sample_rate)))
        self.cut = bool(cut)
        self.path = input_file(path, "audio")
        try:
            with open(self.path, "rb") as fh:
                kind = sniff_container(fh)
                fh.seek(0)
                head = fh.read(64)
        except OSError as exc:
            raise InputError(f"audio {path}: cannot read ({exc.strerror or exc})") from exc
        if kind is None:
            raise InputError(f"audio {path}: found {describe_head(head)}, expected {ACCEPTED_AUDIO}; {_EXPORT_AS}")
        self.container, self.demuxer = kind
        self.source: AudioSource | None = None

    def _input(self) -> list[str]:
        return [
            ffmpeg_exe(),
            "-hide_banner",
            "-nostdin",
            "-nostats",
            "-loglevel",
            "info",
            "-cpuflags",
            "0",
            "-protocol_whitelist",
            "file",
            "-f",
            self.demuxer,
            "-i",
            "file:" + str(self.path.absolute()),
        ]

    def _command(self) -> list[str]:
        af = "aresample=" + ":".join(
            [f"osr={self.sample_rate}", "ochl=mono", "osf=s16"] + [f"{k}={v}" for k, v in RESAMPLER]
        )
        return self._input() + ["-map", "0:a:0", "-af", af, "-c:a", "pcm_s16le", "-f", "s16le", "pipe:1"]

    def probe(self) -> AudioProbe:
        """The header: format, rate, channels and duration, read without decoding a sample (~50 ms).

        Refuses a file ffmpeg cannot open or one without an audio stream, as decoding would.
        """
        cmd = self._input()  # and no output: ffmpeg prints what it found and stops
        try:
            res = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MediaError(f"audio {self.where}: cannot run ffmpeg ({cmd[0]}) to read the header: {exc}") from exc
        log = res.stderr.decode("utf-8", "replace")
        if not _INPUT_RE.search(log):
            raise InputError(
                f"audio {self.where}: cannot read this {self.container} file's header; the file is "
                f"damaged or truncated; {_EXPORT_AS}:\n" + stderr_tail(log)
            )
        codec, rate, channels = _found(log)
        if codec is None:
            raise InputError(
                f"audio {self.where}: {self.container} file has no audio stream; give a file "
                f"with speech in it ({ACCEPTED_AUDIO})"
            )
        m = _DURATION_RE.search(log)
        seconds = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) if m else None
        return AudioProbe(self.container, codec, rate, channels, seconds)

    def check_header(self) -> AudioProbe:
        """:meth:`probe`, refusing at once a file whose header puts it past ``max_seconds`` (unless ``cut``):
        a long render is refused before it starts, not when decoding reaches the bound."""
        found = self.probe()
        if not self.cut and found.seconds is not None and found.seconds > self.max_seconds + _HEADER_SLACK_SECONDS:
            parts = [found.container] + [
                x for x in (found.codec, f"{found.source_rate} Hz" if found.source_rate else None, found.channels) if x
            ]
            raise InputError(
                f"audio {self.where}: {', '.join(parts)} of {found.seconds:.1f} s (from its header) is longer than "
                f"the bound of {self.max_seconds:g} s; {self._keep_first()}"
            )
        return found

    def _keep_first(self) -> str:
        fix = (
            f"keep the first {self.max_seconds:g} s with: python -m avatar_release.media audio {self.where} "
            f"short.wav --seconds {self.max_seconds:g}"
        )
        return fix + (f", or {self.longer_fix}" if self.longer_fix else "")

    def _describe(self, log: str) -> str:
        codec, rate, channels = _found(log)
        parts = [self.container] + [x for x in (codec, f"{rate} Hz" if rate else None, channels) if x]
        return ", ".join(parts)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._chunks()

    def _chunks(self) -> Iterator[np.ndarray]:
        self.source = None
        with tempfile.TemporaryFile() as err:  # a file, not a pipe: ffmpeg's log can never block it
            cmd = self._command()
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            except OSError as exc:
                raise MediaError(f"audio {self.where}: cannot start ffmpeg ({cmd[0]}): {exc}") from exc
            assert proc.stdout is not None  # started with stdout=PIPE
            total, digest, stopped, rc = 0, StreamDigest(), False, None
            try:
                for ints in _pcm16_chunks(proc.stdout, self.chunk_samples):
                    if total + ints.size > self.max_samples:
                        if not self.cut:
                            raise self._too_long(file_tail(err))
                        ints, stopped = ints[: self.max_samples - total], True
                    total += ints.size
                    # float64 then float32: the same rounding as samples.sample_audio's k / 32767 grid.
                    chunk = np.maximum(ints / _INT16_SCALE, -1.0).astype(np.float32)
                    digest.update(chunk.astype("<f4").tobytes())
                    if chunk.size:
                        yield chunk
                    if stopped:
                        break
                if not stopped:
                    rc = proc.wait()
            finally:  # also on an exception or a consumer that stopped early: never leave ffmpeg behind
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stdout.close()
            log = file_tail(err)
        self.source = self._finish(rc, log, total, digest)

    def _too_long(self, log: str) -> InputError:
        return InputError(
            f"audio {self.where}: {self._describe(log)} is longer than the bound of {self.max_seconds:g} s "
            f"(decoding stopped there); {self._keep_first()}"
        )

    def _finish(self, rc: int | None, log: str, total: int, digest: StreamDigest) -> AudioSource:
        """The record of a complete pass, or the InputError that says why there is none."""
        if rc not in (0, None):  # None: we stopped ffmpeg ourselves at max_seconds
            if "matches no streams" in log:
                raise InputError(
                    f"audio {self.where}: {self.container} file has no audio stream; give a file "
                    f"with speech in it ({ACCEPTED_AUDIO})"
                )
            raise InputError(
                f"audio {self.where}: cannot decode this {self._describe(log)} file (ffmpeg exit {rc}); "
                f"the file is damaged or truncated; {_EXPORT_AS}:\n" + stderr_tail(log)
            )
        if total == 0:
            raise InputError(
                f"audio {self.where}: {self._describe(log)} contains no samples (0 seconds); "
                "give a file with speech in it"
            )
        codec, rate, channels = _found(log)
        return AudioSource(
            path=self.where,
            container=self.container,
            codec=codec,
            source_rate=rate,
            channels=channels,
            sample_rate=self.sample_rate,
            samples=total,
            sha256=digest.digest,
            decoder=f"ffmpeg {ffmpeg_version()} -cpuflags 0 aresample "
            + ":".join(f"{k}={v}" for k, v in RESAMPLER)
            + " s16 -> k/32767",
        )

    def read(self) -> np.ndarray:
        """Every sample as one float32 array."""
        chunks = list(self)
        return np.concatenate(chunks) if len(chunks) != 1 else chunks[0]


def stream_audio(
    path: PathLike,
    *,
    sample_rate: int,
    max_seconds: float = DEFAULT_MAX_AUDIO_SECONDS,
    chunk_seconds: float = _CHUNK_SECONDS,
    cut: bool = False,
    longer_fix: str | None = None,
) -> AudioStream:
    """A speech track decoded incrementally: see :class:`AudioStream`."""
    return AudioStream(
        path,
        sample_rate=sample_rate,
        max_seconds=max_seconds,
        chunk_seconds=chunk_seconds,
        cut=cut,
        longer_fix=longer_fix,
    )


def load_audio(path: PathLike, *, sample_rate: int, max_seconds: float = DEFAULT_MAX_AUDIO_SECONDS) -> LoadedAudio:
    """Decode a whole speech track: float32 mono samples at ``sample_rate`` and what was read."""
    s = AudioStream(path, sample_rate=sample_rate, max_seconds=max_seconds)
    samples = s.read()
    assert s.source is not None
    return LoadedAudio(samples, s.source)


def load_audio_bytes(
    data: bytes, *, sample_rate: int, where: str = "<bytes>", max_seconds: float = DEFAULT_MAX_AUDIO_SECONDS
) -> LoadedAudio:
    """:func:`load_audio` for bytes in memory (an HTTP request body), through a private temp file."""
    if not data:
        raise InputError(f"audio {where}: no bytes (empty audio); expected {ACCEPTED_AUDIO}")
    with tempfile.TemporaryDirectory(prefix="avatar-audio-") as tmp:
        p = Path(tmp) / "input"
        p.write_bytes(data)
        try:
            loaded = load_audio(p, sample_rate=sample_rate, max_seconds=max_seconds)
        except InputError as exc:
            raise InputError(str(exc).replace(str(p), where)) from None
    return LoadedAudio(loaded.samples, dataclasses.replace(loaded.source, path=where))


def read_audio(path: PathLike, *, sample_rate: int, max_seconds: float = DEFAULT_MAX_AUDIO_SECONDS) -> np.ndarray:
    """Decode a speech track (any accepted format) as float32 mono in [-1, 1] at ``sample_rate``."""
    return load_audio(path, sample_rate=sample_rate, max_seconds=max_seconds).samples


# ------------------------------------------------------------------------------- checking, writing


def check_audio(
    samples: npt.ArrayLike,
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
            f"{where}: dtype {arr.dtype}, expected float samples in [-1, 1]; for int16 PCM divide by 32767"
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
        raise InputError(f"{where}: {seconds:.3f} s long, expected at least {min_seconds:g} s; give a longer clip")
    if max_seconds is not None and seconds > max_seconds:
        raise InputError(
            f"{where}: {seconds:.3f} s long, expected at most {max_seconds:g} s; keep the first "
            f"{max_seconds:g} s (samples[:{int(max_seconds * int(sample_rate))}])"
        )
    return np.ascontiguousarray(arr, dtype=np.float32)


def encode_wav_bytes(samples: npt.ArrayLike, sample_rate: int) -> bytes:
    """16-bit PCM mono WAV bytes for float samples in [-1, 1] (clipped)."""
    arr = check_audio(samples, sample_rate=sample_rate)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(int(sample_rate))
        wf.writeframes(pcm16(arr))
    return buf.getvalue()


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as 16-bit little-endian PCM, clipped: ``round(x * 32767)``, so
    the decoder's ``k / 32767`` floats come back as exactly ``k``."""
    return np.round(np.clip(np.asarray(samples, np.float64), -1.0, 1.0) * _INT16_SCALE).astype("<i2").tobytes()


def write_wav(path: PathLike, samples: npt.ArrayLike, sample_rate: int) -> Path:
    """Write float mono samples in [-1, 1] as a 16-bit PCM mono WAV, atomically."""
    return write_output(path, encode_wav_bytes(samples, sample_rate))
