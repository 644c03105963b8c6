"""Liveness and readiness on a listener of their own, so no connection flood makes a probe fail.

The render port admits a bounded number of connections (past ``max_connections`` uvicorn answers
503 to everything), and a slow client holds one until its header timeout. Kubernetes restarts a
pod whose ``/livez`` fails, so the probes must not share that budget: ``ProbeServer`` answers
``/livez`` and ``/readyz`` and their Open Inference Protocol names ``/v2/health/live`` and
``/v2/health/ready`` (the same answers as the app's routes: ``probe``) on a port of its own,
from an asyncio loop on its own thread. It reads one request line and its headers (8 KiB at most,
within ``header_timeout``), answers, and closes. It serves at most ``per_client`` connections
from one address and ``max_connections`` in all. A connection past either is held unread for
``TARPIT_SECONDS`` and then dropped, never answered: closing it at once would invite a reconnect
storm (measured: 6,500 reconnects a second from one flooder, which cost the pod's interpreter
enough to slow every answer to ~200 ms on 2 cores), while a held socket costs nothing but itself.
Past ``MAX_TARPIT`` held sockets, new ones are dropped at once. The port is not in the Service:
only the kubelet (and whoever is on the pod network) reaches it.

``ClientCaps`` is the per-address count the render port's protocol keeps too (``_lifecycle``).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from typing import cast

from ._errors import ServeError
from ._pod import Pod

__all__ = ["probe", "readiness", "PROBE_PATHS", "ProbeServer", "ClientCaps", "TARPIT_SECONDS", "MAX_TARPIT", "Tarpit"]

TARPIT_SECONDS = 2.0
MAX_TARPIT = 4096


# What ``probe`` answers: the pod's own names and the Open Inference Protocol's (KServe v2), which
# OIP clients and gateways probe; both pairs say the same thing.
PROBE_PATHS = ("/livez", "/readyz", "/v2/health/live", "/v2/health/ready")


def readiness(pod: Pod) -> tuple[int, dict[str, object]]:
    """(status, body) of ``/readyz``: 200 when serving with 0 compiles and not draining, else 503
    ``draining`` or ``not_ready``. Every readiness answer of the pod is this one, reshaped."""
    if pod.draining:
        e = ServeError("draining", "this pod is shutting down")
    elif pod.follow.stale is not None:
        e = ServeError("trust_expired", f"the signed release state is not fresh: {pod.follow.stale}")
    elif not pod.ready:
        e = ServeError("not_ready", f"build {pod.build.build_id} compiled while serving")
    else:
        return 200, {"ready": True, "build_id": pod.build.build_id, "digest": pod.build.digest}
    return e.status, e.to_json()


def probe(pod: Pod, path: str) -> tuple[int, dict[str, object]]:
    """(HTTP status, JSON body) of a path in ``PROBE_PATHS``; (404, ...) for anything else.

    The OIP names answer the OIP bodies (``{"live": true}``, ``{"ready": <bool>}``) with the
    statuses of ``/livez`` and ``/readyz``: a pod is never ready under one name and not the other."""
    if path in ("/livez", "/v2/health/live"):
        return 200, {"live": True}
    if path == "/readyz":
        return readiness(pod)
    if path == "/v2/health/ready":
        status, _ = readiness(pod)
        return status, {"ready": status == 200}
    return 404, {"error": "not_found", "message": f"the probe port answers {', '.join(PROBE_PATHS)}, not {path[:100]}"}


class ClientCaps:
    """Open connections per client address, with a cap (0: no cap). Used from one event loop."""

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self.open: Counter[str] = Counter()
        self.refused = 0

    def admit(self, peer: str) -> bool:
        if self.per_client and self.open[peer] >= self.per_client:
            self.refused += 1
            return False
        self.open[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]


class Tarpit:
    """Connections past a cap, held unread for ``TARPIT_SECONDS`` then dropped (``MAX_TARPIT`` at most)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float = TARPIT_SECONDS) -> None:
        self.loop, self.seconds = loop, seconds
        self._held: set[asyncio.Transport] = set()

    @property
    def held(self) -> int:
        return len(self._held)

    def hold(self, transport: asyncio.Transport, first: bytes = b"") -> None:
        if len(self._held) >= MAX_TARPIT:
            transport.abort()
            return
        self._held.add(transport)
        transport.pause_reading()
        if first:
            transport.write(first)

        def drop() -> None:
            if transport in self._held:
                self._held.discard(transport)
                transport.abort()

        # spread over [1, 1.5) x seconds: a flood's connections do not all drop (and reconnect) at once
        self.loop.call_later(self.seconds * (1.0 + 0.5 * random.random()), drop)

    def drop_all(self) -> None:
        for transport in list(self._held):
            transport.abort()
        self._held.clear()


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class ProbeServer:
    def __init__(
        self,
        pod: Pod,
        host: str,
        port: int,
        *,
        per_client: int = 8,
        max_connections: int = 256,
        header_timeout: float = 2.0,
    ) -> None:
        self.pod, self.host, self.port = pod, host, port
        self.caps = ClientCaps(per_client)
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.address: tuple[str, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tarpit: Tarpit | None = None

    def start(self) -> tuple[str, int]:
        """Bind and serve on a thread of its own; returns the bound (host, port)."""
        started = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # this thread's own loop
            tarpit = self._tarpit = Tarpit(loop)
            try:
                server = self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, self.host, self.port, limit=8192, backlog=512)
                )
                self.address = server.sockets[0].getsockname()[:2]
            except BaseException as e:  # noqa: BLE001 - reported to start() below
                failed.append(e)
                started.set()
                return
            started.set()
            loop.run_forever()
            server.close()
            tarpit.drop_all()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="probe-listener", daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            raise failed[0]
        assert self.address is not None  # run() binds before it sets `started`, or fails (raised above)
        return self.address

    def close(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        if sum(self.caps.open.values()) >= self.max_connections or not self.caps.admit(peer):
            assert self._tarpit is not None  # made by run() before the server accepts anything
            # over a cap: never answered, and no reconnect storm (typeshed types a stream's transport as
            # write-only; a server connection's reads too)
            self._tarpit.hold(cast(asyncio.Transport, writer.transport))
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.header_timeout)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            method, path = parts[0], (parts[1] if len(parts) > 1 else "").split("?", 1)[0]
            status, doc = (
                probe(self.pod, path)
                if method in ("GET", "HEAD")
                else (405, {"error": "method_not_allowed", "message": "probes are GET"})
            )
            body = json.dumps(doc).encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            UnicodeDecodeError,
        ):
            pass  # a slow, oversized or broken request: closed without an answer
        finally:
            self.caps.release(peer)
            writer.close()
