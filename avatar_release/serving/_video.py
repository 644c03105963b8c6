"""The streamed answer of ``POST /render``: a raw ASGI response fed by a started `RenderJob` (an MP4,
or the WAV or npz of a build that delivers audio or tensors: ``_delivered``).

Headers go out once the first bytes exist, then every piece as ffmpeg writes it. An error before
the first bytes is a JSON error with its status; after them the stream is cut short (the client
sees an incomplete chunked body) and the request's log line says why. A disconnect (seen on
``receive``) cancels the job between chunks; so does ``request_timeout`` (admission to last byte).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ..errors import AvatarReleaseError, RecompileError
from ._delivered import CONTENT_TYPES
from ._errors import ServeError, clean_message
from ._log import log_event
from ._pod import Pod
from ._render import RenderJob

__all__ = ["VideoStream", "error_response"]


def error_response(exc: ServeError) -> JSONResponse:
    """The JSON answer of ``exc``: ``{"error": code, "message": ...}``, its status and headers."""
    return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)


class VideoStream:
    """One render's answer; ``line`` (the request's log fields) is written once, when it ends."""

    def __init__(self, pod: Pod, request_timeout: float, job: RenderJob, line: dict[str, Any], t0: float) -> None:
        self.pod, self.request_timeout, self.job, self.line, self.t0 = pod, request_timeout, job, line, t0
        self.deadline = t0 + request_timeout
        self.status = 200  # what the log and the requests counter say
        self.code: str | None = None
        self.started, self.sent = False, 0
        self.ttff: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            while await self._next(send):
                pass
        finally:
            watcher.cancel()
            self.job.cancel.set()
            self._account()

    async def _watch(self, receive: Receive) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.job.cancel.set()
                return

    async def _next(self, send: Send) -> bool:
        """Wait for the job's next event and answer it; False once the answer is over."""
        try:
            kind, value = await asyncio.wait_for(self.job.events.get(), max(0.0, self.deadline - time.perf_counter()))
        except TimeoutError:
            self.job.cancel.set()
            await self._fail(
                send, 504, ServeError("render_timeout", f"render took longer than {self.request_timeout:g} s")
            )
            return False
        if kind == "bytes":
            await self._send_bytes(send, value)
            return True
        if kind == "chunk":
            return True
        if kind == "done":
            if not self.started:  # (a render with no bytes cannot happen; answer anyway)
                await self._start(send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.pod.metrics.request_seconds.observe(time.perf_counter() - self.t0)
            return False
        if kind == "cancelled":
            self.status, self.code = 499, "client_disconnected"
            self.pod.metrics.disconnects.inc()
            return False
        await self._render_failed(send, value)
        return False

    async def _start(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._headers()})
        self.started = True

    async def _send_bytes(self, send: Send, value: bytes) -> None:
        if not self.started:
            await self._start(send)
        if self.ttff is None and (b"moof" in value or self.job.build.manifest.program.delivery().kind != "video"):
            self.ttff = time.perf_counter() - self.t0
            self.pod.metrics.first_fragment.observe(self.ttff)
        self.sent += len(value)
        await send({"type": "http.response.body", "body": value, "more_body": True})

    async def _render_failed(self, send: Send, exc: BaseException) -> None:
        self.line["reason"] = clean_message(f"{type(exc).__name__}: {exc}")
        public = (
            f"build {self.job.build.build_id} compiled while serving; this pod is no longer ready"
            if isinstance(exc, RecompileError)
            else clean_message(str(exc))
            if isinstance(exc, AvatarReleaseError)
            else "render failed; the pod's log has the details"
        )
        await self._fail(send, 500, ServeError("render_failed", public))

    async def _fail(self, send: Send, status: int, exc: ServeError) -> None:
        """Record why the answer ends; a JSON error when no video bytes went out yet."""
        self.status, self.code = status, exc.code
        if not self.started:
            r = error_response(exc)
            await send({"type": "http.response.start", "status": r.status_code, "headers": r.raw_headers})
            await send({"type": "http.response.body", "body": r.body, "more_body": False})

    def _account(self) -> None:
        s = self.job.stats
        self.pod.metrics.requests.labels("/render", str(self.status)).inc()
        log_event(
            "request",
            **self.line,
            status=self.status,
            **({"error": self.code} if self.code else {}),
            duration=round(time.perf_counter() - self.t0, 4),
            chunks=s.pace.chunks,
            frames=s.frames,
            misses=self.job.pace.misses(s.pace),
            over_playback=s.pace.over_deadline,
            realtime_factor=s.pace.realtime_factor,
            compiles=s.compiles,
            bytes=self.sent,
            ttff=None if self.ttff is None else round(self.ttff, 4),
            streamed=self.started,
        )

    def _headers(self) -> list[tuple[bytes, bytes]]:
        b = self.job.build
        return [
            (b"content-type", CONTENT_TYPES[b.manifest.program.delivery().kind].encode()),
            (b"x-request-id", self.line["id"].encode()),
            (b"x-build-id", b.build_id.encode()),
            (b"x-frames", str(self.job.n_frames).encode()),
            (b"x-compiles", str(b.guard.count).encode()),
            (b"cache-control", b"no-store"),
        ]
