"""Running the app: uvicorn on a socket we bind, SIGTERM drains, SIGHUP checks the channel.

SIGTERM (and Ctrl-C): ``/readyz`` turns 503 and new renders get 503 ``draining``, the listening
socket closes, renders in flight finish within ``grace`` seconds, and the process exits 0
(uvicorn would re-raise the signal after its shutdown; a pod that drained cleanly exits 0, so
the orchestrator sees a clean stop). With ``follow``, a thread checks the channel every ``poll``
seconds and SIGHUP checks it now.
"""

from __future__ import annotations

import signal
import socket
import threading
from dataclasses import dataclass

from ._app import AppConfig, create_app
from ._log import log_event, route_server_logs

__all__ = ["ServerConfig", "run_server"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    grace: float = 30.0  # seconds in-flight renders get after SIGTERM
    max_connections: int = 64  # past it, uvicorn answers 503 (slow or idle clients cost a socket, not a thread)
    keep_alive: float = 5.0
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


def run_server(pod, cfg: ServerConfig, on_ready=None) -> None:
    """Serve until SIGTERM/SIGINT; ``on_ready((host, port))`` once the app has started."""
    import uvicorn

    sock = _bind(cfg.host, cfg.port)
    addr = sock.getsockname()[:2]
    stop, wake = threading.Event(), threading.Event()

    def started():
        log_event("ready", host=addr[0], port=addr[1], build=pod.build.build_id, channel=pod.channel,
                  follow=cfg.follow)
        if on_ready is not None:
            on_ready(addr)

    route_server_logs()
    app = create_app(pod, cfg.app, on_startup=started)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", server_header=False,
                            timeout_graceful_shutdown=int(cfg.grace), limit_concurrency=cfg.max_connections,
                            timeout_keep_alive=int(cfg.keep_alive), h11_max_incomplete_event_size=64 * 1024)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not pod.draining:
                pod.draining = True
                log_event("draining", signal=signal.Signals(sig).name, grace=cfg.grace)
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and signal.SIGTERM in self._captured_signals:
                self._captured_signals.remove(signal.SIGTERM)  # drained on purpose: exit 0, not -15

    server = _Server(config)
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
        if previous_hup is not None:
            signal.signal(signal.SIGHUP, previous_hup)
        sock.close()
        log_event("stopped", build=pod.build.build_id, requests=pod.requests)
