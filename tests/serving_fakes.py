"""A fake build whose chunks take known time, and the serving app on a real uvicorn over loopback
around it: the ``serve`` fixture (registered in tests/conftest.py).

The runtime's ``stream``, as the render job calls it (``serving._render.stream``), is replaced by
``FakeStream``, a generator that sleeps per chunk and yields gradient frames: streaming, bounds,
queueing and disconnects are tested in seconds, without a compile.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from avatar_release.records import ChunkProgram
from avatar_release.runtime import Chunk, CompileGuard, LoadTimings, plan_chunks

__all__ = ["FPS", "SR", "SPF", "H", "W", "fake_build", "FakeStream", "serve", "post_render", "mp4_boxes"]

FPS, SR, SPF, H, W = 25, 16000, 640, 48, 64


def fake_build(build_id="fake-1"):
    program = ChunkProgram(
        stages=["s"],
        image_input="image",
        audio_input="audio",
        noise_input="noise",
        carry={},
        deliver="frames",
        fps=FPS,
        sample_rate=SR,
        samples_per_frame=SPF,
        height=H,
        width=W,
    )
    platform = SimpleNamespace(backend="cpu", device_kind="cpu", device_count=8)
    manifest = SimpleNamespace(
        program=program,
        pipeline="tiny",
        target="cpu-8",
        platform=platform,
        buckets=[SimpleNamespace(name="f8", frames=8), SimpleNamespace(name="f4", frames=4)],
        content_digest=lambda: "sha256:" + build_id.ljust(64, "1"),
    )
    return SimpleNamespace(
        manifest=manifest,
        build_id=build_id,
        digest="sha256:" + build_id.ljust(64, "0"),
        guard=CompileGuard(),
        timings=LoadTimings(),
    )


class FakeStream:
    """Stands in for runtime.stream: ``delay`` seconds per chunk (``first_delay`` for the first one,
    when given); records how many chunks ran."""

    def __init__(self, delay=0.0, first_delay=None):
        self.delay, self.started, self.produced = delay, 0, 0
        self.first_delay = delay if first_delay is None else first_delay

    def __call__(self, build, image, audio, *, seed=0, frames=None, values=None):
        self.started += 1
        n = -(-audio.shape[0] // SPF) if audio is not None else frames
        first = 0
        for i, (bucket, frames, deliver) in enumerate(plan_chunks(build.manifest, n)):
            time.sleep(self.first_delay if i == 0 else self.delay)
            ramp = np.linspace(0, 255, W, dtype=np.float32)[None, None, :, None]
            f = np.broadcast_to(ramp, (deliver, H, W, 3)).astype(np.uint8).copy()
            f[:, :, :, 1] = (first * 7) % 255
            self.produced += 1
            yield Chunk(i, bucket, f, first, self.delay, deliver / FPS, 0)
            first += frames


@pytest.fixture
def serve(monkeypatch):
    """serve(delay=..., **AppConfig) -> (base host, port, pod, fake stream)."""
    import uvicorn

    from avatar_release.serving import AppConfig, Limits, Pod, ServerConfig, _render, create_app
    from avatar_release.serving._lifecycle import uvicorn_config

    servers = []

    def start(delay=0.0, limits=None, per_client=16, **cfg):
        fake = FakeStream(delay)
        monkeypatch.setattr(_render, "stream", fake)
        pod = Pod(None, "dev", fake_build())
        app = create_app(pod, AppConfig(limits=limits or Limits(max_seconds=20, body_timeout=1.0), **cfg))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        server = uvicorn.Server(
            uvicorn_config(
                app, ServerConfig(header_timeout=0.5, max_connections=8, max_connections_per_client=per_client)
            )
        )
        t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        while not server.started:
            time.sleep(0.01)
        servers.append((server, t))
        return sock.getsockname()[1], pod, fake

    yield start
    for server, t in servers:
        server.should_exit = True
        t.join(10)


def post_render(port, body: bytes, ctype="application/json", headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/render", body=body, headers={"Content-Type": ctype, **(headers or {})})
    r = c.getresponse()
    return r, r.read()


def mp4_boxes(data: bytes) -> list[str]:
    """Top-level MP4 box types, in order."""
    out, i = [], 0
    while i + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[i : i + 8])
        size = struct.unpack(">Q", data[i + 8 : i + 16])[0] if size == 1 else size
        assert size >= 8, f"bad box at {i}"
        out.append(kind.decode("latin-1"))
        i += size
    assert i == len(data), "trailing bytes after the last box"
    return out
