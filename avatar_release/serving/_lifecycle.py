"""Running the app: uvicorn on a socket we bind, SIGTERM drains, SIGHUP checks the channel.

SIGTERM (and Ctrl-C): ``/readyz`` turns 503 and new renders get 503 ``draining``; the listening
socket stays open, answering so, while a render runs or waits for the accelerator (a probe or a
client sees a 503, not a refused connection), then closes; renders in flight finish within
``grace`` seconds of the signal, and the process exits 0 (uvicorn would re-raise the signal after
its shutdown; a pod that drained cleanly exits 0, so the orchestrator sees a clean stop). A
second signal stops listening at once. With ``follow``, a thread checks the channel every ``poll``
seconds and SIGHUP checks it now.

Slow clients cost a socket, never a worker: a connection whose request headers are not complete
within ``header_timeout`` seconds (from connect, or from the end of the previous response) is
closed; a body that is not complete within the app's ``body_timeout`` is a 408; past
``max_connections`` uvicorn answers 503; one client address holds at most
``max_connections_per_client`` of them (past it, 429 and closed), so one flooder cannot take the
whole budget (the one past it is held a moment before it is dropped: see ``_probes``). ``/livez`` and ``/readyz`` are also answered on ``probe_port``, a listener of their
own (``_probes``), which the deploy files point the kubelet at: a flood of the render port never
fails a probe.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from ._app import AppConfig, create_app, renders_busy
from ._log import log_event, route_server_logs
from ._pod import Pod
from ._probes import ClientCaps, ProbeServer, Tarpit

if TYPE_CHECKING:
    import uvicorn

__all__ = ["ServerConfig", "draining_server", "run_server", "uvicorn_config"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    grace: float = 30.0  # seconds in-flight renders get after SIGTERM
    max_connections: int = 64  # past it, uvicorn answers 503 (slow or idle clients cost a socket, not a thread)
    keep_alive: float = 5.0
    header_timeout: float = 10.0  # seconds for a request's headers to arrive (slowloris)
    max_connections_per_client: int = 16  # one address's share of max_connections (0: no cap)
    probe_port: int | None = None  # /livez and /readyz on a listener of their own (0: a free port; None: none)
    follow: bool = False
    poll: float = 30.0
    app: AppConfig = AppConfig()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


_TOO_MANY_BODY = b'{"error": "too_many_connections", "message": "this address holds too many open connections"}'
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%b" % (len(_TOO_MANY_BODY), _TOO_MANY_BODY)
)


def _header_timeout_protocol(seconds: float, per_client: int = 0) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time,
    and one past ``per_client`` open connections from the same address (429)."""
    # Lazy (heavy): uvicorn loads only when a pod serves; the app itself does not need it.
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    caps = ClientCaps(per_client)  # one server, one event loop: no lock needed
    tarpits: dict[asyncio.AbstractEventLoop, Tarpit] = {}

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _peer: str | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()  # headers still incomplete: nothing to answer

        # uvicorn narrows asyncio's BaseTransport to the Transport asyncio passes a stream protocol; so do we
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = str((transport.get_extra_info("peername") or ("?",))[0])
            if not caps.admit(peer):
                # 429, then held unread a moment before it is dropped: no reconnect storm (see _probes)
                self.connections.discard(self)  # it must not count against max_connections either
                tarpit = tarpits.get(self.loop) or tarpits.setdefault(self.loop, Tarpit(self.loop))
                tarpit.hold(transport, _TOO_MANY)
                return
            self._peer = peer
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._peer is not None:
                caps.release(self._peer)
                self._peer = None
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # a whole request line and headers arrived

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

    return HeaderTimeoutProtocol


def uvicorn_config(app: Starlette, cfg: ServerConfig) -> uvicorn.Config:
    """The uvicorn settings of a pod: our JSON logs only, bounded connections, headers and drain."""
    # Lazy (heavy): uvicorn loads only when a pod serves; the app itself does not need it.
    import uvicorn

    return uvicorn.Config(
        app,
        http=_header_timeout_protocol(cfg.header_timeout, cfg.max_connections_per_client),
        log_config=None,
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=int(cfg.grace),
        limit_concurrency=cfg.max_connections,
        timeout_keep_alive=int(cfg.keep_alive),
        h11_max_incomplete_event_size=64 * 1024,
    )


def draining_server(pod: Pod, app: Starlette, cfg: ServerConfig) -> uvicorn.Server:
    """uvicorn's server for ``app`` (from `create_app`), draining on the first SIGTERM/SIGINT: the
    pod turns ``draining`` at once, the listener stays open while ``app`` has a render running or
    waiting (at most ``cfg.grace`` seconds), then uvicorn's shutdown gives what is still running
    the rest of the grace. A second signal goes to that shutdown at once."""
    # Lazy (heavy): uvicorn loads only when a pod serves; the app itself does not need it.
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain_signal: int | None = None
        drain_deadline = 0.0
        drain_logged = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # A signal handler: flags only (a log line takes a lock the interrupted code may hold).
            if self.drain_signal is None:
                self.drain_signal, self.drain_deadline = sig, time.monotonic() + cfg.grace
                pod.draining = True
                self._captured_signals.append(sig)  # re-raised after the shutdown, as uvicorn does
            else:
                super().handle_exit(sig, frame)
                self._stop_listening()
            if signal.SIGTERM in self._captured_signals:
                self._captured_signals.remove(signal.SIGTERM)  # drained on purpose: exit 0, not -15

        async def on_tick(self, counter: int) -> bool:
            if self.drain_signal is not None and not self.drain_logged:
                self.drain_logged = True
                log_event("draining", signal=signal.Signals(self.drain_signal).name, grace=cfg.grace)
            if (
                self.drain_signal is not None
                and not self.should_exit
                and (not renders_busy(app) or time.monotonic() >= self.drain_deadline)
            ):
                self._stop_listening()
            return await super().on_tick(counter)

        def _stop_listening(self) -> None:
            # uvicorn's shutdown from here on: it closes the listener and waits for what still runs,
            # for what is left of the grace (seconds; the config took whole ones)
            # uvicorn types it int | None, and passes it to asyncio.wait_for, which takes a float
            left = max(0.0, self.drain_deadline - time.monotonic())
            self.config.timeout_graceful_shutdown = left  # type: ignore[assignment]
            self.should_exit = True

    return DrainingServer(uvicorn_config(app, cfg))


def run_server(
    pod: Pod, cfg: ServerConfig, on_ready: Callable[[tuple[str, int], tuple[str, int] | None], None] | None = None
) -> None:
    """Serve until SIGTERM/SIGINT; ``on_ready((host, port), probe (host, port) or None)`` once the
    app has started."""
    sock = _bind(cfg.host, cfg.port)
    addr = sock.getsockname()[:2]
    stop, wake = threading.Event(), threading.Event()
    probes = probe_addr = None
    if cfg.probe_port is not None:
        probes = ProbeServer(pod, cfg.host, cfg.probe_port)
        probe_addr = probes.start()

    def started() -> None:
        log_event(
            "ready",
            host=addr[0],
            port=addr[1],
            build=pod.build.build_id,
            channel=pod.channel,
            follow=cfg.follow,
            probe_port=probe_addr[1] if probe_addr else None,
        )
        if on_ready is not None:
            on_ready(addr, probe_addr)

    route_server_logs()
    server = draining_server(pod, create_app(pod, cfg.app, on_startup=started), cfg)
    previous_hup = None
    if cfg.follow:
        pod.start_following(cfg.poll, wake, stop)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGHUP"):
        previous_hup = signal.signal(signal.SIGHUP, lambda *_: wake.set())
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        wake.set()
        if probes is not None:
            probes.close()
        if previous_hup is not None:
            signal.signal(signal.SIGHUP, previous_hup)
        sock.close()
        log_event("stopped", build=pod.build.build_id, requests=pod.requests, deadline=pod.deadline_report())
