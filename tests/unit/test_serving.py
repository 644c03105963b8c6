"""The serving app on a real uvicorn over loopback, with a fake build whose chunks take known time.

No compile here: the runtime's ``stream``, as the render job calls it (``serving._render.stream``),
is replaced by a generator that sleeps per chunk and yields gradient frames (tests/serving_fakes.py),
so streaming, bounds, queueing and disconnects are tested in seconds. tests/integration/test_serve.py runs the same app on a real compiled build.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import struct
import subprocess
import threading
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from tests.serving_fakes import SR, FakeStream, H, W, fake_build, mp4_boxes, post_render


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_render_streams_fragments_before_the_render_ends_and_every_fragment_decodes(serve, tmp_path):
    from avatar_release.media import ffmpeg_exe, probe_mp4, read_mp4_frames

    port, pod, fake = serve(delay=0.5)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/render", body=json.dumps({"seconds": 1.6}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "video/mp4"
    assert r.getheader("Transfer-Encoding") == "chunked" and r.getheader("Content-Length") is None
    assert r.getheader("X-Frames") == "40" and r.getheader("X-Build-Id") == "fake-1"
    data, first_moof, chunks_then = b"", None, None
    while piece := r.read1(65536):
        data += piece
        if first_moof is None and b"moof" in data:
            first_moof, chunks_then = time.perf_counter() - t0, fake.produced
    total = time.perf_counter() - t0
    # 40 frames = 5 chunks of 8 at 0.5 s each: the first fragment arrives while most of the video
    # is still to render (each chunk left takes at least its 0.5 s, whatever the machine's load).
    assert first_moof is not None and chunks_then <= 3, (first_moof, chunks_then, total)
    assert total - first_moof >= 0.5 * (5 - chunks_then) - 0.1, (first_moof, chunks_then, total)
    boxes = mp4_boxes(data)
    assert boxes[:2] == ["ftyp", "moov"] and boxes.count("moof") == boxes.count("mdat") >= 5, boxes
    out = tmp_path / "r.mp4"
    out.write_bytes(data)
    probe = probe_mp4(out)
    assert probe.frames == 40 and probe.width == W and probe.height == H
    frames = read_mp4_frames(out)
    assert frames.shape == (40, H, W, 3)
    assert abs(int(frames[10, 20, 40, 0]) - 160) < 12  # the red ramp survived the round trip
    # the audio track is there and decodes
    res = subprocess.run(
        [ffmpeg_exe(), "-v", "error", "-i", str(out), "-map", "0:a:0", "-f", "null", "-"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and "matches no streams" not in res.stderr, res.stderr


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + struct.pack(">I", 0)
        + b"IDAT"
        + struct.pack(">I", zlib.crc32(b"IDAT"))
    )


@pytest.mark.parametrize(
    "body, code",
    [
        (b'{"seconds": NaN}', "invalid_json"),
        (b'{"seconds": Infinity}', "invalid_json"),
        (b'{"seconds": 1e6}', "duration_too_long"),
        (b'{"seconds": 3000}', "duration_too_long"),
        (b'{"seconds": "1"}', "invalid_request"),
        (b'{"seconds": -1}', "invalid_request"),
        (b'{"seed": 1.5}', "invalid_request"),
        (b'{"fit": "stretch"}', "invalid_request"),
        (b'{"sceonds": 1}', "invalid_request"),
        (b"[1]", "invalid_request"),
        (b'{"seconds": 1', "invalid_json"),
        (b'{"image_b64": "***"}', "invalid_image"),
        (b'{"audio_b64": "' + base64.b64encode(b"RIFF....WAVEjunk") + b'"}', "invalid_audio"),
        (b'{"image_b64": "' + base64.b64encode(_png_header(100_000, 100_000)) + b'"}', "invalid_image"),
    ],
)
def test_bad_requests_get_a_stable_code_and_no_server_detail(serve, body, code):
    port, pod, fake = serve()
    r, data = post_render(port, body)
    doc = json.loads(data)
    assert r.status == 400 and doc["error"] == code, doc
    assert set(doc) == {"error", "message"} and "Traceback" not in doc["message"] and "/tmp" not in doc["message"]
    assert fake.started == 0  # nothing rendered


def test_bounds_on_the_body_routes_and_content_type(serve):
    from avatar_release.serving import Limits

    port, pod, fake = serve(limits=Limits(max_body=2048, body_timeout=0.5))
    r, data = post_render(port, b"{" + b" " * 4096 + b"}")
    assert r.status == 413 and json.loads(data)["error"] == "body_too_large"
    r, data = post_render(port, b"x", ctype="image/png")
    assert r.status == 415 and json.loads(data)["error"] == "unsupported_media_type"
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):  # JSON only when the request says so
        r, data = post_render(port, b'{"seconds": 1}', ctype=ctype)
        assert r.status == 415 and json.loads(data)["error"] == "unsupported_media_type", ctype
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/nope")
    r = c.getresponse()
    assert r.status == 404 and json.loads(r.read()) == {"error": "not_found", "message": "no route /nope"}
    c.request("GET", "/render")
    r = c.getresponse()
    assert r.status == 405 and json.loads(r.read())["error"] == "method_not_allowed"
    # chunked body past the cap (no Content-Length to refuse up front)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(
        "POST",
        "/render",
        body=iter([b"{", b" " * 3000, b"}"]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    r = c.getresponse()
    assert r.status == 413
    # slowloris: a body that never comes is cut off after body_timeout, with a JSON 408
    s = socket.create_connection(("127.0.0.1", port), timeout=10)  # a reply that never comes fails recv
    s.sendall(b"POST /render HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    reply = b""
    while b"}" not in reply and (piece := s.recv(4096)):
        reply += piece
    s.close()
    assert b" 408 " in reply.split(b"\r\n")[0] and b"body_timeout" in reply


def test_multipart_upload_of_image_and_audio_files(serve):
    from avatar_release.media import encode_png, encode_wav_bytes

    port, pod, fake = serve()
    png = encode_png(np.full((90, 120, 3), 200, np.uint8))
    wav = encode_wav_bytes(np.zeros(SR // 2, np.float32), SR)
    boundary = "xXxBoundary"
    parts = []
    for name, fname, ctype, payload in [("image", "p.png", "image/png", png), ("audio", "a.wav", "audio/wav", wav)]:
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{fname}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n".encode()
            + payload
            + b"\r\n"
        )
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="seed"\r\n\r\n7\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="fit"\r\n\r\ncontain\r\n'.encode())
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    r, data = post_render(port, body, ctype=f"multipart/form-data; boundary={boundary}")
    assert r.status == 200 and r.getheader("X-Frames") == "13", data[:200]
    assert mp4_boxes(data)[:2] == ["ftyp", "moov"]
    bad = body.replace(b'name="seed"\r\n\r\n7', b'name="seed"\r\n\r\nnan')
    r, data = post_render(port, bad, ctype=f"multipart/form-data; boundary={boundary}")
    assert r.status == 400 and json.loads(data)["error"] == "invalid_request"


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_one_render_at_a_time_and_a_full_queue_answers_429(serve):
    port, pod, fake = serve(delay=0.3, queue=1)
    results = []

    def client():
        r, data = post_render(port, json.dumps({"seconds": 1.0}).encode())
        results.append((r.status, r.getheader("Retry-After"), data))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    codes = sorted(s for s, _, _ in results)
    assert codes == [200, 200, 429, 429], codes
    for status, retry, data in results:
        if status == 429:
            assert retry == "5" and json.loads(data)["error"] == "queue_full"
    assert fake.started == 2


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_a_client_that_leaves_stops_the_render_between_chunks(serve):
    port, pod, fake = serve(delay=0.2)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/render", body=json.dumps({"seconds": 10.0}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.read1(100)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    time.sleep(1.0)
    assert fake.produced < 8, fake.produced  # 10 s = 32 chunks; it stopped after a few
    # the accelerator is free again: the next request renders
    r, data = post_render(port, json.dumps({"seconds": 0.2}).encode())
    assert r.status == 200 and mp4_boxes(data)[:2] == ["ftyp", "moov"]


def test_probes_and_metrics(serve):
    port, pod, fake = serve()
    post_render(port, json.dumps({"seconds": 0.5}).encode())
    post_render(port, b'{"seconds": NaN}')
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for path, status in [("/livez", 200), ("/readyz", 200), ("/healthz", 200)]:
        c.request("GET", path)
        r = c.getresponse()
        assert r.status == status and json.loads(r.read())
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    assert "avatar_serve_compiles_total 0.0" in text
    assert 'avatar_serve_build_info{build_id="fake-1",channel="dev"' in text
    assert 'avatar_serve_requests_total{route="/render",status="200"} 1.0' in text
    assert 'avatar_serve_requests_total{route="/render",status="400"} 1.0' in text
    assert 'avatar_serve_chunk_seconds_count{bucket="f8"} 1.0' in text
    assert "avatar_serve_time_to_first_fragment_seconds_count 1.0" in text
    c.request("GET", "/healthz")
    paced = json.loads(c.getresponse().read())["deadline"]  # the chunks rendered, against their playback time
    assert paced["chunks"] >= 1 and paced["emulated"] is True  # (the fake renders in no time: no factor)
    assert paced["chunks_over_deadline"] <= paced["chunks"] and paced["misses_on_target"] == 0
    pod.draining = True
    c.request("GET", "/readyz")
    r = c.getresponse()
    assert r.status == 503 and json.loads(r.read())["error"] == "draining"
    r, data = post_render(port, json.dumps({"seconds": 0.5}).encode())
    assert r.status == 503 and json.loads(data)["error"] == "draining"


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_a_render_that_fails_before_the_first_fragment_is_a_json_500_and_one_past_its_timeout_is_cut(
    serve, monkeypatch
):
    from avatar_release.errors import RecompileError
    from avatar_release.serving import _render

    port, pod, _ = serve(delay=0.3, request_timeout=3.0)

    def compiles(build, image, audio, *, seed=0, frames=None, values=None):
        raise RecompileError(
            "zero-compile guard: XLA compiled while serving stage dit/f8 of build fake-1 (cache /tmp/secret/cache)", []
        )
        yield

    monkeypatch.setattr(_render, "stream", compiles)
    r, data = post_render(port, json.dumps({"seconds": 0.5}).encode())
    doc = json.loads(data)
    assert r.status == 500 and doc["error"] == "render_failed" and "compiled while serving" in doc["message"]
    assert "/tmp" not in doc["message"]
    # The first chunk at once (its fragment starts the 200), then 0.3 s a chunk: 10 s of video, 32
    # chunks, take at least 9.6 s to render whatever the machine's load; the 3 s timeout stops it
    # and the body ends short.
    fake = FakeStream(delay=0.3, first_delay=0.0)
    monkeypatch.setattr(_render, "stream", fake)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/render", body=json.dumps({"seconds": 10.0}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    assert 0 < fake.produced < 32
    pod.build.guard.count = 1  # a build seen compiling is not ready
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/readyz")
    r = c.getresponse()
    assert r.status == 503 and json.loads(r.read())["error"] == "not_ready"


def test_following_refuses_a_build_that_compiles_and_keeps_serving_the_old_one(monkeypatch):
    from avatar_release.errors import RecompileError
    from avatar_release.registry import MemoryRegistry
    from avatar_release.serving import Pod, _pod

    old, new = fake_build("fake-old"), fake_build("fake-new")
    pod = Pod(MemoryRegistry("follow"), "prod", old)
    channel = SimpleNamespace(digest=old.digest)
    monkeypatch.setattr(_pod, "resolve_channel", lambda reg, ref, trust: (channel, None, None))
    loads = []
    # (the build served now goes along: what the new one shares with it is taken, not loaded again)
    monkeypatch.setattr(
        _pod, "_load", lambda reg, ref, resolved, trust, serving=None: loads.append((resolved.digest, serving)) or new
    )

    def compiling_warm_up(build):
        raise RecompileError(f"warm-up of build {build.build_id} compiled 1 time(s): not ready", [])

    monkeypatch.setattr(_pod, "warm_up", compiling_warm_up)
    assert pod.check_channel() == "unchanged" and loads == []
    channel.digest = new.digest  # the channel moves to a build that compiles when warmed
    assert pod.check_channel() == "refused" and loads == [(new.digest, old)]
    assert pod.build is old and pod.health()["follow"]["refused_digest"] == new.digest
    assert "RecompileError" in pod.health()["follow"]["refused_reason"]
    assert pod.check_channel() == "still-refused" and len(loads) == 1  # not reloaded every poll
    text = pod.metrics.exposition().decode()
    assert 'avatar_serve_swaps_total{result="refused"} 1.0' in text and 'build_id="fake-old"' in text
    monkeypatch.setattr(_pod, "warm_up", lambda build: 0.01)  # fixed; SIGHUP retries the refused digest
    assert pod.check_channel(retry_refused=True) == "swapped"
    assert pod.build is new and pod.health()["follow"]["refused_digest"] is None
    text = pod.metrics.exposition().decode()
    assert 'avatar_serve_swaps_total{result="swapped"} 1.0' in text and 'build_id="fake-new"' in text


def test_serve_takes_host_and_port_from_the_environment(monkeypatch):
    from avatar_release.cli import cli

    monkeypatch.setenv("AVATAR_RELEASE_HOST", "0.0.0.0")
    monkeypatch.setenv("AVATAR_RELEASE_PORT", "9123")
    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY", "memory://pod")  # parsing --registry finds the registry
    ctx = cli.get_command(None, "serve").make_context("serve", ["--queue", "2", "--max-body", "4096"])
    assert (ctx.params["host"], ctx.params["port"], ctx.params["queue"], ctx.params["max_body"]) == (
        "0.0.0.0",
        9123,
        2,
        4096,
    )
    ctx = cli.get_command(None, "serve").make_context("serve", ["--port", "0"])  # a flag beats the environment
    assert ctx.params["port"] == 0 and ctx.params["follow"] is False and ctx.params["header_timeout"] == 10.0


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_slow_headers_are_cut_off_and_do_not_take_the_pods_connections(serve):
    port, pod, fake = serve()
    slow = []
    for _ in range(12):  # more than max_connections (8)
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /render HTTP/1.1\r\nHost: x\r\n")  # ...and the rest never comes
        slow.append(s)
    time.sleep(1.0)  # header_timeout is 0.5 s
    for s in slow:
        assert s.recv(100) == b""  # closed by the pod, without an answer
        s.close()
    r, data = post_render(port, json.dumps({"seconds": 0.2}).encode())
    assert r.status == 200
    # a keep-alive connection that starts a second request and stalls is cut off too
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    first = b""
    while not first.endswith(b'{"live":true}'):  # the whole first response (it may come in pieces)
        piece = s.recv(4096)
        assert piece, first
        first += piece
    assert b"200 OK" in first
    s.sendall(b"GET /livez HTTP/1.1\r\n")
    time.sleep(1.0)
    assert s.recv(100) == b""
    s.close()


def _from(address: str, port: int) -> socket.socket:
    """A connection from another loopback address: another client, as the pod sees it."""
    s = socket.socket()
    s.settimeout(10)
    s.bind((address, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_one_address_past_its_connection_cap_gets_429_and_other_clients_still_get_in(serve):
    port, pod, fake = serve(per_client=3)
    held = [_from("127.0.0.2", port) for _ in range(3)]
    for s in held:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # slow: headers never finish
    over = _from("127.0.0.2", port)
    answer = over.recv(4096)
    assert answer.startswith(b"HTTP/1.1 429") and b"too_many_connections" in answer
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # another client: in
    c.request("GET", "/livez")
    assert c.getresponse().status == 200
    for s in held + [over]:
        s.close()


def test_the_probe_port_answers_every_probe_under_a_flood_from_one_address():
    from avatar_release.serving import Pod
    from avatar_release.serving._probes import ProbeServer

    pod = Pod(None, "prod", fake_build())
    probes = ProbeServer(pod, "127.0.0.1", 0, per_client=8, header_timeout=5.0)
    host, port = probes.start()
    try:
        flood = []
        for _ in range(200):  # slow connections from one address, far past its share
            s = _from("127.0.0.2", port)
            s.sendall(b"GET /livez HTTP/1.1\r\n")
            flood.append(s)
        statuses = []
        for _ in range(30):  # the kubelet, from another address: every probe answered
            c = http.client.HTTPConnection(host, port, timeout=5)
            c.request("GET", "/livez")
            r = c.getresponse()
            statuses.append((r.status, json.loads(r.read())))
        assert statuses == [(200, {"live": True})] * 30
        assert probes.caps.open.get("127.0.0.2") == 8 and probes.caps.refused >= 150
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/readyz")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["build_id"] == "fake-1"
        pod.draining = True
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/readyz")
        r = c.getresponse()
        assert r.status == 503 and json.loads(r.read())["error"] == "draining"
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/render")
        assert c.getresponse().status == 404
        for s in flood:
            s.close()
    finally:
        probes.close()


def test_a_fleet_following_a_channel_does_not_poll_in_lockstep():
    """Pods started together spread their channel checks over ±25% of --poll, so a promotion
    reaches every pod within 1.25 × poll without all of them hitting the registry at once."""
    import random

    from avatar_release.serving._pod import follow_wait

    waits = [follow_wait(30.0, random.Random(seed)) for seed in range(200)]
    assert all(22.5 <= w <= 37.5 for w in waits)
    assert max(waits) - min(waits) > 10  # spread, not one value
    rng = random.Random(7)
    assert len({round(follow_wait(30.0, rng), 6) for _ in range(5)}) == 5  # drawn afresh per check


def _metric_total(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(s.value for s in families[name].samples if s.name.endswith("_total"))


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_metrics_healthz_and_request_log_agree_on_what_a_deadline_miss_is(serve, capsys, backend):
    """Chunks over their playback time on emulated CPU devices are not deadline misses (as /healthz
    and the render summary say): /metrics counts them apart; on the target's hardware they are."""
    port, pod, fake = serve(delay=0.4)  # every chunk (at most 8 frames: 0.32s of playback) is over
    pod.build.manifest.platform.backend = backend
    r, _ = post_render(port, json.dumps({"seconds": 0.5}).encode())
    assert r.status == 200
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/healthz")
    paced = json.loads(c.getresponse().read())["deadline"]
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    chunks = paced["chunks"]
    assert chunks >= 1 and paced["chunks_over_deadline"] == chunks
    assert paced["misses_on_target"] == (0 if backend == "cpu" else chunks)
    assert _metric_total(text, "avatar_serve_deadline_misses") == paced["misses_on_target"]
    assert _metric_total(text, "avatar_serve_chunks_over_playback") == chunks
    assert "on the build's own hardware" in text  # the help text says what counts
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    line = next(x for x in lines if x.get("event") == "request")
    assert line["misses"] == paced["misses_on_target"] and line["over_playback"] == chunks


def test_the_pod_and_render_load_without_the_http_stack_and_the_app_is_there_when_asked_for():
    """``start_pod`` and ``render_to_files`` come without starlette and uvicorn (``render`` never needs
    them; ``serve`` imports them while its build loads); every other name still resolves."""
    import sys

    probe = (
        "import sys\n"
        "from avatar_release.serving import render_to_files, start_pod\n"
        "print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))\n"
        "import avatar_release.serving as s\n"
        "print(all(getattr(s, n) is not None for n in s.__all__), 'starlette' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "True True"]
