"""The ASGI app (starlette): routes, admission, the streamed answer.

    GET  /livez    200 while the process serves HTTP at all
    GET  /readyz   200 when verified, loaded, warm with 0 compiles and not draining; else 503
    GET  /healthz  the detailed view (build, compiles, timings, follow state)
    GET  /metrics  Prometheus text
    POST /render   fragmented MP4 (H.264 + AAC), chunked, as chunks complete

Admission: one render at a time on the host; up to ``queue`` more wait their turn; past that,
429 with Retry-After. Media is decoded while waiting, so a queued request starts rendering the
moment the accelerator frees up. The response starts once the first chunk is rendered and
encoded: an error before that is a JSON error with its status; after it the stream is cut short
(the client sees an incomplete chunked body) and the log line says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import AvatarReleaseError, RecompileError
from ._errors import ServeError, clean_message
from ._log import log_event
from ._metrics import CONTENT_TYPE_LATEST
from ._probes import probe
from ._render import RenderJob
from ._request import Limits, decode_inputs, parse_request, read_body

__all__ = ["AppConfig", "create_app"]


@dataclass(frozen=True)
class AppConfig:
    limits: Limits = Limits()
    queue: int = 4  # renders that may wait behind the one running; past it, 429
    queue_timeout: float = 120.0  # longest wait for the accelerator before 503 queue_timeout
    request_timeout: float = 300.0  # admission to last byte; past it the render stops
    retry_after: int = 5  # seconds, sent with 429 and 503


_REQUEST_ID = re.compile(r"^[\w.-]{1,64}$")


def _shape(build) -> tuple:
    p = build.manifest.program
    return p.height, p.width, p.fps, p.sample_rate, p.samples_per_frame


def _error(exc: ServeError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)


class _Admission:
    """Counts renders waiting and running; the semaphore is the one accelerator."""

    def __init__(self, pod, cfg: AppConfig):
        self.pod, self.cfg = pod, cfg
        self.waiting = 0
        self.sem = asyncio.Semaphore(1)

    def enter(self) -> None:
        if self.waiting >= self.cfg.queue + (0 if self.sem.locked() else 1):
            raise ServeError("queue_full", f"{self.waiting} render(s) already waiting (queue {self.cfg.queue}); retry "
                             f"in {self.cfg.retry_after} s", headers={"Retry-After": str(self.cfg.retry_after)})
        self.waiting += 1
        self.pod.metrics.queue_depth.set(self.waiting)

    def leave(self) -> None:
        self.waiting -= 1
        self.pod.metrics.queue_depth.set(self.waiting)


def create_app(pod, cfg: AppConfig = AppConfig(), *, on_startup=None) -> Starlette:
    adm: _Admission | None = None

    def admission() -> _Admission:
        nonlocal adm
        if adm is None:  # made on the serving loop (asyncio primitives bind to it)
            adm = _Admission(pod, cfg)
        return adm

    def probe_response(path: str) -> JSONResponse:
        status, doc = probe(pod, path)  # the same answer as the probe port's
        return JSONResponse(doc, status_code=status)

    async def livez(request: Request) -> Response:
        return probe_response("/livez")

    async def readyz(request: Request) -> Response:
        return probe_response("/readyz")

    async def healthz(request: Request) -> Response:
        h = pod.health()
        a = admission()
        h.update(queue_depth=a.waiting, queue=cfg.queue,
                 max_seconds=cfg.limits.max_frames(pod.build.manifest.program.fps) / pod.build.manifest.program.fps)
        return JSONResponse(h)

    async def metrics(request: Request) -> Response:
        return Response(pod.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def render(request: Request):
        rid = request.headers.get("x-request-id", "")
        rid = rid if _REQUEST_ID.match(rid) else uuid.uuid4().hex[:16]
        t0 = time.perf_counter()
        line = {"id": rid, "build": pod.build.build_id}
        a = admission()
        try:
            if pod.draining:
                raise ServeError("draining", "this pod is shutting down; retry on another",
                                 headers={"Retry-After": str(cfg.retry_after)})
            body = await read_body(request.stream(), request.headers.get("content-length"), cfg.limits)
            req, image, audio = await parse_request(request.headers.get("content-type", ""), body, cfg.limits)
            del body
            a.enter()
            try:
                build = pod.build
                inputs = await asyncio.to_thread(decode_inputs, build, req, image, audio, cfg.limits)
                try:
                    await asyncio.wait_for(a.sem.acquire(), cfg.queue_timeout)
                except asyncio.TimeoutError:
                    raise ServeError("queue_timeout", f"waited {cfg.queue_timeout:g} s for the accelerator",
                                     headers={"Retry-After": str(cfg.retry_after)}) from None
            finally:
                a.leave()
            if pod.build is not build:  # swapped while waiting: render on the new build, refitted if it differs
                if _shape(pod.build) != _shape(build):
                    try:
                        inputs = await asyncio.to_thread(decode_inputs, pod.build, req, image, audio, cfg.limits)
                    except ServeError:
                        a.sem.release()
                        raise
                build = pod.build
            del image, audio
            line["build"] = build.build_id
            pod.requests += 1
            job = RenderJob(pod, build, inputs, asyncio.get_running_loop(), a.sem.release).start()
        except ServeError as exc:
            pod.metrics.rejected.labels(exc.code).inc()
            return _finish_error(exc, line, t0)
        except AvatarReleaseError as exc:  # e.g. ffmpeg failing on media it accepted: ours, not the client's
            line["reason"] = clean_message(f"{type(exc).__name__}: {exc}")
            return _finish_error(ServeError("render_failed", "the pod could not prepare this request; its log has "
                                            "the details"), line, t0)
        return _VideoStream(pod, cfg, job, line, t0)

    def _finish_error(exc: ServeError, line: dict, t0: float) -> JSONResponse:
        pod.metrics.requests.labels("/render", str(exc.status)).inc()
        log_event("request", **line, status=exc.status, error=exc.code,
                  duration=round(time.perf_counter() - t0, 4))
        return _error(exc)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        msg = {404: f"no route {request.url.path[:100]}", 405: f"{request.method} not allowed here"}.get(
            exc.status_code, clean_message(exc.detail))
        return JSONResponse({"error": code, "message": msg}, status_code=exc.status_code)

    async def internal(request: Request, exc: Exception) -> Response:
        log_event("internal_error", route=request.url.path[:100], kind=type(exc).__name__,
                  reason=clean_message(str(exc)))
        return JSONResponse({"error": "internal", "message": "internal error; the pod's log has the details"},
                            status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        admission()
        if on_startup is not None:
            on_startup()
        yield

    return Starlette(
        routes=[Route("/livez", livez), Route("/readyz", readyz), Route("/healthz", healthz),
                Route("/metrics", metrics), Route("/render", render, methods=["POST"])],
        exception_handlers={HTTPException: not_found, Exception: internal},
        lifespan=lifespan,
    )


class _VideoStream:
    """The streamed answer, as a raw ASGI response: headers once the first bytes exist, then every
    piece as ffmpeg writes it; a disconnect (seen on ``receive``) cancels the job between chunks."""

    def __init__(self, pod, cfg: AppConfig, job: RenderJob, line: dict, t0: float):
        self.pod, self.cfg, self.job, self.line, self.t0 = pod, cfg, job, line, t0

    async def __call__(self, scope, receive, send) -> None:
        pod, job, m = self.pod, self.job, self.pod.metrics
        deadline = self.t0 + self.cfg.request_timeout
        status, code, started, ttff, sent = 200, None, False, None, 0

        async def watch():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    job.cancel.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(job.events.get(), max(0.0, deadline - time.perf_counter()))
                except asyncio.TimeoutError:
                    job.cancel.set()
                    status, code = 504, "render_timeout"
                    if not started:
                        await self._send_error(send, ServeError("render_timeout", f"render took longer than "
                                                                f"{self.cfg.request_timeout:g} s"))
                    break
                if kind == "bytes":
                    if not started:
                        await send({"type": "http.response.start", "status": 200, "headers": self._headers()})
                        started = True
                    if ttff is None and b"moof" in value:
                        ttff = time.perf_counter() - self.t0
                        m.first_fragment.observe(ttff)
                    sent += len(value)
                    await send({"type": "http.response.body", "body": value, "more_body": True})
                elif kind == "chunk":
                    continue
                elif kind == "done":
                    if not started:  # (a render with no bytes cannot happen; answer anyway)
                        await send({"type": "http.response.start", "status": 200, "headers": self._headers()})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    m.request_seconds.observe(time.perf_counter() - self.t0)
                    break
                elif kind == "cancelled":
                    status, code = 499, "client_disconnected"
                    m.disconnects.inc()
                    break
                else:  # error
                    exc = value
                    status, code = 500, "render_failed"
                    reason = clean_message(f"{type(exc).__name__}: {exc}")
                    self.line["reason"] = reason
                    if not started:
                        public = (f"build {job.build.build_id} compiled while serving; this pod is no longer ready"
                                  if isinstance(exc, RecompileError) else
                                  clean_message(str(exc)) if isinstance(exc, AvatarReleaseError) else
                                  "render failed; the pod's log has the details")
                        await self._send_error(send, ServeError("render_failed", public))
                    break
        finally:
            watcher.cancel()
            job.cancel.set()
            s = job.stats
            m.requests.labels("/render", str(status)).inc()
            log_event("request", **self.line, status=status, **({"error": code} if code else {}),
                      duration=round(time.perf_counter() - self.t0, 4), chunks=s.chunks, frames=s.frames,
                      misses=s.misses, compiles=s.compiles, bytes=sent,
                      ttff=None if ttff is None else round(ttff, 4), streamed=started)

    def _headers(self) -> list[tuple[bytes, bytes]]:
        b = self.job.build
        return [(b"content-type", b"video/mp4"), (b"x-request-id", self.line["id"].encode()),
                (b"x-build-id", b.build_id.encode()), (b"x-frames", str(self.job.n_frames).encode()),
                (b"x-compiles", str(b.guard.count).encode()), (b"cache-control", b"no-store")]

    @staticmethod
    async def _send_error(send, exc: ServeError) -> None:
        r = JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)
        await send({"type": "http.response.start", "status": r.status_code, "headers": r.raw_headers})
        await send({"type": "http.response.body", "body": r.body, "more_body": False})
