"""A render job: the runtime's chunks into the fMP4 encoder on a worker thread, events to the event loop
(a build that delivers audio or tensors: into ``_delivered``'s WAV or npz encoder instead).

The thread holds the pod's device lock for the whole render (one render per host) and checks
``cancel`` between chunks: a client that leaves, or a request past its timeout, stops the render
at the next chunk boundary and kills ffmpeg. Each chunk's frames are written to ffmpeg and dropped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..runtime import Chunk, LoadedBuild, PaceTally, pace_of, plan_chunks, stream
from ._delivered import NpzEncoder, WavEncoder
from ._fmp4 import FragmentEncoder
from ._pod import Pod
from ._request import RenderInputs

__all__ = ["RenderJob", "JobStats"]


@dataclass
class JobStats:
    frames: int = 0
    compiles: int = 0
    pace: PaceTally = field(default_factory=PaceTally)  # its chunks, their render time and those over deadline


class RenderJob:
    """Events on ``self.events``: ("bytes", b), ("chunk", Chunk), ("done", None), ("error", exc), ("cancelled", None).

    ``on_finish()`` runs on ``loop`` once the started thread ends, whatever ended it (the app's
    turn passes it the accelerator slot's release); a job never started never calls it."""

    def __init__(
        self,
        pod: Pod,
        build: LoadedBuild,
        inputs: RenderInputs,
        loop: asyncio.AbstractEventLoop,
        on_finish: Callable[[], None],
    ) -> None:
        self.pod, self.build, self.inputs, self._loop, self._on_finish = pod, build, inputs, loop, on_finish
        self.events: asyncio.Queue = asyncio.Queue()
        self.pace = pace_of(build.manifest)  # what a chunk over its playback time means for this build here
        self.cancel = threading.Event()
        self.stats = JobStats()
        self.n_frames = inputs.frames
        # Keyframes at frame 0 and at the last frame of every chunk but the final one: the muxer
        # cuts a fragment when a keyframe arrives, so writing chunk k's frames releases a fragment
        # at once (up to its last frame) instead of waiting for chunk k+1 to be rendered.
        self.keyframes, end = [0], 0
        for _bucket, _frames, deliver in plan_chunks(build.manifest, self.n_frames)[:-1]:
            end += deliver
            self.keyframes.append(end - 1)
        self.keyframes = sorted(set(self.keyframes))
        self._thread = threading.Thread(target=self._run, name="render", daemon=True)

    def start(self) -> RenderJob:
        self._thread.start()
        return self

    def _put(self, kind: str, value: object = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (process shutting down)
            self.cancel.set()

    def _run(self) -> None:
        m = self.pod.metrics
        enc: FragmentEncoder | WavEncoder | NpzEncoder | None = None
        try:
            with self.pod.device_lock:
                m.in_flight.inc()
                try:
                    enc = self._encoder()
                    for chunk in stream(
                        self.build,
                        self.inputs.image,
                        self.inputs.audio,
                        seed=self.inputs.seed,
                        frames=self.inputs.frames,
                        values=self.inputs.values,
                    ):
                        self._account(chunk)
                        if isinstance(enc, FragmentEncoder):
                            enc.write(chunk.frames)
                        else:
                            enc.write(chunk)
                        self._put("chunk", chunk)
                        del chunk
                        if self.cancel.is_set():
                            break
                finally:
                    m.in_flight.dec()
            if self.cancel.is_set():
                enc.abort()
                self._put("cancelled")
            else:
                enc.close()
                self._put("done")
        except BaseException as exc:  # noqa: BLE001 - handed to the request, which answers and logs it
            if enc is not None:
                enc.abort()
            self._put("error", exc)
        finally:
            try:
                self._loop.call_soon_threadsafe(self._on_finish)
            except RuntimeError:
                pass

    def _encoder(self) -> FragmentEncoder | WavEncoder | NpzEncoder:
        """The encoder of the build's delivery: WAV for audio, npz for tensors, else fragmented MP4; each
        hands its bytes to the event loop as they are ready."""
        p = self.build.manifest.program
        d = p.delivery()
        if d.kind == "audio":
            return WavEncoder(
                sample_rate=d.sample_rate,
                samples=self.n_frames * d.samples_per_frame,
                on_bytes=lambda b: self._put("bytes", b),
            )
        if d.kind == "tensors":
            return NpzEncoder(on_bytes=lambda b: self._put("bytes", b))
        return FragmentEncoder(
            width=p.width,
            height=p.height,
            fps=p.fps,
            audio=self.inputs.audio,
            sample_rate=p.sample_rate,
            n_frames=self.n_frames,
            keyframes=self.keyframes,
            on_bytes=lambda b: self._put("bytes", b),
        )

    def _account(self, chunk: Chunk) -> None:
        m, s = self.pod.metrics, self.stats
        s.frames += chunk.n_frames if chunk.n_frames >= 0 else int(chunk.frames.shape[0])
        s.compiles += chunk.compiles
        s.pace.add(chunk.seconds, chunk.deadline)
        self.pod.pace.add(chunk.seconds, chunk.deadline)
        m.chunk_seconds.labels(chunk.bucket).observe(chunk.seconds)
        if chunk.compiles:
            m.compiles.inc(chunk.compiles)
        if chunk.missed:
            m.over_playback.labels(chunk.bucket).inc()
            if not self.pace.emulated:  # on emulated devices: the host is slower, not a miss
                m.deadline_misses.labels(chunk.bucket).inc()
