"""The feed: a request's length cut into the chunks a build renders, with each chunk's share of the audio.

A build with an audio input is driven by its track (below); one without is driven by a number of
frames the request asks for (:func:`feed_frames`), cut by the same :func:`plan_chunks`.

The track's length is never needed up front. A bucket is chosen once the feed holds a largest
bucket's worth of samples (then the largest bucket fits, as it would in the whole track) or the
track has ended (then what is left is known exactly), so the chunks are those
:func:`plan_chunks` gives for the whole track, and at most one largest chunk of samples plus one
incoming piece is held at a time: memory does not grow with the track.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..records import Manifest

__all__ = ["ChunkAudio", "feed_chunks", "feed_frames", "plan_chunks"]


@dataclass(frozen=True)
class ChunkAudio:
    """One chunk's share of the track."""

    index: int
    bucket: str
    frames: int  # frames the bucket renders
    deliver: int  # frames kept: ``frames``, except for a tail shorter than the smallest bucket
    first_frame: int
    audio: np.ndarray  # (frames * samples_per_frame,) float32, silence after the track's end; (0,) without audio


def plan_chunks(manifest: Manifest, n_frames: int) -> list[tuple[str, int, int]]:
    """Cover ``n_frames`` with buckets: (bucket, frames it renders, frames it delivers).

    Each chunk uses the largest bucket that fits the frames left; a tail shorter than the
    smallest bucket is rendered at that bucket, padded with silence, and trimmed.
    """
    plan, left = [], n_frames
    while left > 0:
        name, frames = _choose(manifest, left)
        plan.append((name, frames, min(frames, left)))
        left -= frames
    return plan


def _choose(manifest: Manifest, left: int) -> tuple[str, int]:
    """The bucket for a chunk with ``left`` frames still to render: the largest that fits, else the smallest."""
    buckets = sorted(manifest.buckets, key=lambda b: -b.frames)
    fit = [b for b in buckets if b.frames <= left]
    b = fit[0] if fit else buckets[-1]
    return b.name, b.frames


def feed_frames(manifest: Manifest, n_frames: int, *, where: str = "frames") -> Iterator[ChunkAudio]:
    """The chunks of a request of ``n_frames`` frames with no audio driving it (as :func:`plan_chunks` plans them)."""
    if n_frames <= 0:
        raise InputError(f"{where}: {n_frames} frames; a request renders at least one frame")
    first = 0
    for index, (bucket, frames, deliver) in enumerate(plan_chunks(manifest, n_frames)):
        yield ChunkAudio(index, bucket, frames, deliver, first, np.zeros(0, np.float32))
        first += frames


def _pieces(audio: np.ndarray | Iterable[np.ndarray], where: str) -> Iterator[np.ndarray]:
    if isinstance(audio, np.ndarray):
        audio = (audio,)
    for piece in audio:
        arr = np.asarray(piece)
        if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.floating) or arr.size == 0):
            raise InputError(
                f"{where}: a piece of shape {arr.shape} and dtype {arr.dtype}; expected mono float samples (1-D)"
            )
        if arr.size:
            yield arr


def feed_chunks(
    manifest: Manifest, audio: np.ndarray | Iterable[np.ndarray], *, where: str = "audio"
) -> Iterator[ChunkAudio]:
    """The chunks of ``audio`` (one array, or any iterable of 1-D float pieces), as :func:`plan_chunks` plans them."""
    spf = manifest.program.samples_per_frame
    largest = max(b.frames for b in manifest.buckets) * spf
    pending: deque[np.ndarray] = deque()
    held = 0  # samples in ``pending``
    pieces = _pieces(audio, where)
    ended = False
    index = first = 0
    while True:
        while not ended and held < largest:
            piece = next(pieces, None)
            if piece is None:
                ended = True
            else:
                pending.append(piece)
                held += piece.size
        if held == 0:
            break
        left = largest // spf if held >= largest else -(-held // spf)  # at least this many frames remain
        bucket, frames = _choose(manifest, left)
        chunk = np.zeros(frames * spf, np.float32)
        filled = 0
        while filled < chunk.size and pending:
            head = pending[0]
            n = min(head.size, chunk.size - filled)
            chunk[filled : filled + n] = head[:n]
            filled += n
            if n == head.size:
                pending.popleft()
            else:
                pending[0] = head[n:]
        held -= filled
        yield ChunkAudio(index, bucket, frames, min(frames, left), first, chunk)
        index += 1
        first += frames
    if index == 0:
        raise InputError(
            f"{where}: no samples; expected a non-empty mono float32 waveform at {manifest.program.sample_rate} Hz"
        )
