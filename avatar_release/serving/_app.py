"""The ASGI app (starlette): routes, admission, the render's start.

    GET  /livez    200 while the process serves HTTP at all
    GET  /readyz   200 when verified, loaded, warm with 0 compiles and not draining; else 503
    GET  /healthz  the detailed view (build, compiles, timings, follow state)
    GET  /metrics  Prometheus text
    POST /render   fragmented MP4 (H.264 + AAC), chunked, as chunks complete (``_video``)
    GET  /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}, /v2/models/{name}/ready
                   the Open Inference Protocol's (KServe v2) server and model metadata and health (``_oip``)
    GET  /openapi.json  OpenAPI 3.1 of all of these, from the parser's own model and limits (``_openapi``)

Admission: one render at a time on the host; up to ``queue`` more wait their turn; past that,
429 with Retry-After. Media is decoded while waiting, so a queued request starts rendering the
moment the accelerator frees up. The response starts once the first chunk is rendered and
encoded: an error before that is a JSON error with its status; after it the stream is cut short
(the client sees an incomplete chunked body) and the log line says why.

Every answer of ``/render``, the ``/v2`` routes and ``/openapi.json`` is counted in
``avatar_serve_requests_total``, a wrong method (405) too, labelled with the route's template
(``/v2/models/{name}``, never the name asked for); a path no route matches is not counted, so no
client can grow the label set. ``/livez``, ``/readyz``, ``/healthz`` and ``/metrics`` are not
counted (as before the OIP routes came); the OIP health routes are, under their own labels, so
what a gateway's probing costs shows apart from the renders.

``create_app`` wires a `_Service` (the app's state, one method per route) into starlette. A
render's place in the queue and then on the accelerator is one `_Turn` (``async with``): the
slot is acquired in one place and released in one place, exactly once, by the render job once it
has started, or by the end of the block on any other path (an error of any kind, a cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import AvatarReleaseError
from ..runtime import LoadedBuild
from ._errors import ServeError, clean_message
from ._log import log_event
from ._metrics import CONTENT_TYPE_LATEST, Metrics
from ._oip import check_model, model_metadata, model_ready, server_metadata
from ._openapi import openapi_document
from ._pod import Pod
from ._probes import probe
from ._render import RenderJob
from ._request import (
    REQUEST_ID,
    Limits,
    RenderInputs,
    RenderRequest,
    decode_inputs,
    parse_request,
    read_body,
    request_model,
)
from ._video import VideoStream, error_response

__all__ = ["AppConfig", "create_app", "renders_busy"]

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class AppConfig:
    limits: Limits = Limits()
    queue: int = 4  # renders that may wait behind the one running; past it, 429
    queue_timeout: float = 120.0  # longest wait for the accelerator before 503 queue_timeout
    request_timeout: float = 300.0  # admission to last byte; past it the render stops
    retry_after: int = 5  # seconds, sent with 429 and 503


_INTERNAL = "internal error; the pod's log has the details"


def _shape(build: LoadedBuild) -> tuple:
    p = build.manifest.program
    return p.height, p.width, p.fps, p.sample_rate, p.samples_per_frame, tuple(map(repr, p.request_inputs()))


def _reason(exc: BaseException) -> str:
    return clean_message(f"{type(exc).__name__}: {exc}")


def _log_internal(route: str, exc: BaseException) -> None:
    log_event("internal_error", route=route[:100], kind=type(exc).__name__, reason=clean_message(str(exc)))


class _Admission:
    """The queue and the one accelerator: ``waiting`` renders queued, ``sem`` held by the one running."""

    def __init__(self, metrics: Metrics, cfg: AppConfig) -> None:
        self.metrics, self.cfg = metrics, cfg
        self.waiting = 0
        self.sem = asyncio.BoundedSemaphore(1)  # a second release would be a defect: it raises

    @property
    def busy(self) -> bool:
        """A render running or waiting for the accelerator."""
        return self.waiting > 0 or self.sem.locked()

    def turn(self) -> _Turn:
        return _Turn(self)

    def join(self) -> None:
        if self.waiting >= self.cfg.queue + (0 if self.sem.locked() else 1):
            raise ServeError(
                "queue_full",
                f"{self.waiting} render(s) already waiting (queue {self.cfg.queue}); retry in {self.cfg.retry_after} s",
                headers={"Retry-After": str(self.cfg.retry_after)},
            )
        self.waiting += 1
        self.metrics.queue_depth.set(self.waiting)

    def leave(self) -> None:
        self.waiting -= 1
        self.metrics.queue_depth.set(self.waiting)


class _Turn:
    """One render's turn: a place in the queue, then the accelerator slot.

    ``async with admission.turn() as turn`` joins the queue (``queue_full`` past it);
    ``await turn.acquire(timeout)`` waits for the accelerator and leaves the queue;
    ``turn.start(make_job)`` starts the render job with this turn's release as its ``on_finish``,
    and from then on the slot is the job's. Until the job has started the slot is the block's:
    whatever ends the block releases it. ``_release`` is the one release and runs at most once.
    """

    def __init__(self, admission: _Admission) -> None:
        self._adm = admission
        self._queued = self._held = self._handed = False

    async def __aenter__(self) -> _Turn:
        self._adm.join()
        self._queued = True
        return self

    async def acquire(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._adm.sem.acquire(), timeout)
            self._held = True
        except TimeoutError:
            retry = self._adm.cfg.retry_after
            raise ServeError(
                "queue_timeout", f"waited {timeout:g} s for the accelerator", headers={"Retry-After": str(retry)}
            ) from None
        finally:
            self._leave_queue()

    def start(self, make_job: Callable[[Callable[[], None]], RenderJob]) -> RenderJob:
        """``make_job(on_finish)``, started; the job releases the slot when its thread ends."""
        if not self._held:
            raise RuntimeError("a render job started without the accelerator slot (acquire first)")
        job = make_job(self._release).start()
        self._handed = True
        return job

    def _leave_queue(self) -> None:
        if self._queued:
            self._queued = False
            self._adm.leave()

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._adm.sem.release()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._leave_queue()
        if not self._handed:
            self._release()


class _Service:
    """The app's state (the pod, its config, the admission) and one method per route."""

    def __init__(self, pod: Pod, cfg: AppConfig, on_startup: Callable[[], None] | None) -> None:
        self.pod, self.cfg, self.on_startup = pod, cfg, on_startup
        self._admission: _Admission | None = None
        self.counted: frozenset[str] = frozenset({"/render"})  # route templates in requests_total (create_app)

    @property
    def admission(self) -> _Admission:
        if self._admission is None:  # made on the serving loop (the lifespan's startup)
            self._admission = _Admission(self.pod.metrics, self.cfg)
        return self._admission

    @property
    def busy(self) -> bool:
        return self._admission is not None and self._admission.busy

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        _ = self.admission  # made now, on the loop that serves
        if self.on_startup is not None:
            self.on_startup()
        yield

    # ------------------------------------------------------------------------------ probes etc.
    async def livez(self, request: Request) -> Response:
        return self._probe("/livez")

    async def readyz(self, request: Request) -> Response:
        return self._probe("/readyz")

    def _probe(self, path: str) -> JSONResponse:
        status, doc = probe(self.pod, path)  # the same answer as the probe port's
        return JSONResponse(doc, status_code=status)

    async def healthz(self, request: Request) -> Response:
        h = self.pod.health()
        fps = self.pod.build.manifest.program.fps
        h.update(
            queue_depth=self.admission.waiting, queue=self.cfg.queue, max_seconds=self.cfg.limits.max_frames(fps) / fps
        )
        return JSONResponse(h)

    async def metrics(self, request: Request) -> Response:
        return Response(self.pod.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------------------ OIP, OpenAPI
    async def v2_live(self, request: Request) -> Response:
        return self._probe("/v2/health/live")

    async def v2_ready(self, request: Request) -> Response:
        return self._probe("/v2/health/ready")

    async def v2_server(self, request: Request) -> Response:
        return JSONResponse(server_metadata())

    async def v2_model(self, request: Request) -> Response:
        return self._for_model(request, lambda build: (200, model_metadata(self.pod, build, self.cfg.limits)))

    async def v2_model_ready(self, request: Request) -> Response:
        return self._for_model(request, lambda build: model_ready(self.pod, build))

    def _for_model(self, request: Request, answer: Callable[[LoadedBuild], tuple[int, dict[str, Any]]]) -> Response:
        """``answer(build)`` when the path names the model served; else 404 ``not_found``."""
        try:
            build = check_model(self.pod, request.path_params["name"])
        except ServeError as exc:
            return error_response(exc)
        status, doc = answer(build)
        return JSONResponse(doc, status_code=status)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(self.pod.build, self.cfg.limits))

    def counting(self, handler: Handler) -> Handler:
        """``handler`` with its every answer counted under its route's template (a bounded label)."""

        async def endpoint(request: Request) -> Response:
            try:
                response = await handler(request)
            except HTTPException:
                raise  # counted by http_error
            except Exception:
                self._count(request, 500)  # then answered by internal_error
                raise
            self._count(request, response.status_code)
            return response

        return endpoint

    def _count(self, request: Request, status: int) -> None:
        self.pod.metrics.requests.labels(request.scope["route"].path, str(status)).inc()

    # ------------------------------------------------------------------------------ /render
    async def render(self, request: Request) -> Response | VideoStream:
        rid = request.headers.get("x-request-id", "")
        line = {"id": rid if REQUEST_ID.match(rid) else uuid.uuid4().hex[:16], "build": self.pod.build.build_id}
        t0 = time.perf_counter()
        try:
            if self.pod.draining:
                raise ServeError(
                    "draining",
                    "this pod is shutting down; retry on another",
                    headers={"Retry-After": str(self.cfg.retry_after)},
                )
            if self.pod.refuses_stale:
                raise ServeError(
                    "trust_expired",
                    f"the signed release state is not fresh ({self.pod.follow.stale}); retry on another pod",
                    headers={"Retry-After": str(self.cfg.retry_after)},
                )
            req, image, audio = await self._read(request)
            job = await self._admit(req, image, audio, line)
        except ServeError as exc:
            self.pod.metrics.rejected.labels(exc.code).inc()
            return self._answer_error(exc, line, t0)
        except AvatarReleaseError as exc:  # e.g. ffmpeg failing on media it accepted: ours, not the client's
            line["reason"] = _reason(exc)
            return self._answer_error(
                ServeError("render_failed", "the pod could not prepare this request; its log has the details"), line, t0
            )
        except Exception as exc:  # a defect of ours; the turn has freed the slot, the client gets the app's 500
            _log_internal(request.url.path, exc)
            line["reason"] = _reason(exc)
            return self._answer_error(ServeError("internal", _INTERNAL), line, t0)
        return VideoStream(self.pod, self.cfg.request_timeout, job, line, t0)

    async def _read(self, request: Request) -> tuple[RenderRequest, bytes | None, bytes | None]:
        """The request's fields and media bytes; the raw body is dropped before anything waits."""
        limits = self.cfg.limits
        body = await read_body(request.stream(), request.headers.get("content-length"), limits)
        return await parse_request(
            request.headers.get("content-type", ""), body, limits, request_model(self.pod.build.manifest.program)
        )

    async def _admit(self, req: RenderRequest, image: bytes | None, audio: bytes | None, line: dict) -> RenderJob:
        """Queue, decode while waiting, take the accelerator and start the job (which then owns it)."""
        build = self.pod.build
        async with self.admission.turn() as turn:
            inputs = await asyncio.to_thread(decode_inputs, build, req, image, audio, self.cfg.limits)
            await turn.acquire(self.cfg.queue_timeout)
            build, inputs = await self._on_current_build(build, inputs, req, image, audio)
            line["build"] = build.build_id
            self.pod.requests += 1
            loop = asyncio.get_running_loop()
            return turn.start(lambda on_finish: RenderJob(self.pod, build, inputs, loop, on_finish))

    async def _on_current_build(
        self, build: LoadedBuild, inputs: RenderInputs, req: RenderRequest, image: bytes | None, audio: bytes | None
    ) -> tuple[LoadedBuild, RenderInputs]:
        """The build served now (a swap while waiting wins), with the inputs refitted if its shape differs."""
        current = self.pod.build
        if current is not build and _shape(current) != _shape(build):
            inputs = await asyncio.to_thread(decode_inputs, current, req, image, audio, self.cfg.limits)
        return current, inputs

    def _answer_error(self, exc: ServeError, line: dict, t0: float) -> JSONResponse:
        self.pod.metrics.requests.labels("/render", str(exc.status)).inc()
        log_event("request", **line, status=exc.status, error=exc.code, duration=round(time.perf_counter() - t0, 4))
        return error_response(exc)

    # ------------------------------------------------------------------------------ errors
    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        """404 (no route), 405 (a route, another method) and starlette's other HTTP errors, as JSON."""
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        msg = {404: f"no route {request.url.path[:100]}", 405: f"{request.method} not allowed here"}.get(
            exc.status_code, clean_message(exc.detail)
        )
        route = request.scope.get("route")  # the route whose path matched (405), none when no route did (404)
        if route is not None and route.path in self.counted:  # every answer of a counted route, GET /render too
            self._count(request, exc.status_code)
        return JSONResponse({"error": code, "message": msg}, status_code=exc.status_code)

    async def internal_error(self, request: Request, exc: Exception) -> Response:
        _log_internal(request.url.path, exc)
        return JSONResponse({"error": "internal", "message": _INTERNAL}, status_code=500)


def create_app(pod: Pod, cfg: AppConfig = AppConfig(), *, on_startup: Callable[[], None] | None = None) -> Starlette:
    """The pod's HTTP surface; ``on_startup()`` runs once the app has started on its loop."""
    service = _Service(pod, cfg, on_startup)
    counted: dict[str, Handler] = {  # /render counts its own answers (a stream's status is known at its end)
        "/v2": service.v2_server,
        "/v2/health/live": service.v2_live,
        "/v2/health/ready": service.v2_ready,
        "/v2/models/{name}": service.v2_model,
        "/v2/models/{name}/ready": service.v2_model_ready,
        "/openapi.json": service.openapi,
    }
    service.counted = frozenset({"/render", *counted})
    app = Starlette(
        routes=[
            Route("/livez", service.livez),
            Route("/readyz", service.readyz),
            Route("/healthz", service.healthz),
            Route("/metrics", service.metrics),
            Route("/render", service.render, methods=["POST"]),
            *(Route(path, service.counting(handler)) for path, handler in counted.items()),
        ],
        # starlette types every handler as taking Exception; the one registered for HTTPException is only
        # ever called with one (starlette's own docs write it so)
        exception_handlers={
            HTTPException: service.http_error,  # type: ignore[dict-item]
            Exception: service.internal_error,
        },
        lifespan=service.lifespan,
    )
    app.state.service = service
    return app


def renders_busy(app: Starlette) -> bool:
    """Whether the app (from `create_app`) has a render running or waiting for the accelerator."""
    return app.state.service.busy
