"""What ``POST /render`` answers for a build that delivers no video, by its declared delivery.

* ``audio``: a 16-bit mono PCM WAV (``audio/wav``) at the delivered sample rate. Its length is
  known when the render starts (the request's frames x samples per frame), so the header goes out
  first and each chunk's samples follow as the chunk completes (chunked, like the video's fragments).
* ``tensors``: an ``.npz`` (``application/x-npz``, what ``numpy.load`` reads) of every chunk's
  delivered outputs, named ``<output>/<chunk index>``. An npz is a zip whose directory comes last,
  so it is sent whole after the last chunk.

Both take the render job's chunks as ``_fmp4.FragmentEncoder`` takes frames (``write``, ``close``,
``abort``) and hand their bytes to ``on_bytes``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..runtime import Chunk

__all__ = ["CONTENT_TYPES", "WavEncoder", "NpzEncoder", "pcm16"]

CONTENT_TYPES = {"video": "video/mp4", "audio": "audio/wav", "tensors": "application/x-npz"}


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as little-endian 16-bit PCM (clipped, rounded), as ``render``'s WAV has them."""
    return np.clip(np.round(np.asarray(samples, np.float32) * 32767), -32768, 32767).astype("<i2").tobytes()


def _wav_header(sample_rate: int, samples: int) -> bytes:
    data = samples * 2
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


class WavEncoder:
    """A WAV of ``samples`` mono samples at ``sample_rate``, streamed chunk by chunk."""

    def __init__(self, *, sample_rate: int, samples: int, on_bytes: Callable[[bytes], None]) -> None:
        self.expected, self.sent, self._on_bytes = samples, 0, on_bytes
        on_bytes(_wav_header(sample_rate, samples))

    def write(self, chunk: Chunk) -> None:
        samples = np.asarray(chunk.frames).reshape(-1)[: self.expected - self.sent]
        self.sent += samples.shape[0]
        self._on_bytes(pcm16(samples))

    def close(self) -> None:
        if self.sent < self.expected:  # the header promised them (cannot happen: the chunks cover the request)
            self._on_bytes(bytes(2 * (self.expected - self.sent)))

    def abort(self) -> None:
        pass


class NpzEncoder:
    """Every chunk's delivered outputs, sent as one ``.npz`` when the render ends."""

    def __init__(self, *, on_bytes: Callable[[bytes], None]) -> None:
        self._kept: dict[str, np.ndarray] = {}
        self._on_bytes = on_bytes

    def write(self, chunk: Chunk) -> None:
        self._kept.update({f"{name}/{chunk.index}": np.asarray(a) for name, a in chunk.outputs.items()})

    def close(self) -> None:
        buf = io.BytesIO()
        np.savez(buf, **cast("dict[str, Any]", self._kept))  # by name; numpy's stubs mistype **kwds
        self._kept = {}
        self._on_bytes(buf.getvalue())

    def abort(self) -> None:
        self._kept = {}
