"""The app's admission and lifecycle: the accelerator slot is released exactly once on every path,
every answer of ``/render`` is counted, and a draining pod answers 503 (never a refused connection)
while its renders finish.

Same fake build as tests/unit/test_serving.py (no compile); the drain test runs ``run_server`` in
a child process, since only a main thread receives SIGTERM.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serving_fakes import mp4_boxes, post_render

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = {"error": "internal", "message": "internal error; the pod's log has the details"}


def _get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


@pytest.mark.parametrize("where", ["making the job", "starting its thread"])
def test_an_unexpected_error_after_the_accelerator_is_taken_frees_it_and_answers_a_clean_500(
    serve, monkeypatch, capfd, where
):
    from avatar_release.serving import _render

    port, pod, fake = serve(queue_timeout=2.0)
    patched = "__init__" if where == "making the job" else "start"
    real = getattr(_render.RenderJob, patched)
    calls = []

    def fails_once(self, *args):
        calls.append(where)
        if len(calls) == 1:
            raise RuntimeError(f"injected while {where} (scratch in /tmp/secret/x)")
        return real(self, *args)

    monkeypatch.setattr(_render.RenderJob, patched, fails_once)
    r, data = post_render(port, json.dumps({"seconds": 0.2}).encode())
    assert (r.status, json.loads(data)) == (500, INTERNAL)
    # The slot is free: the next request renders at once (a leaked slot answered 503 queue_timeout
    # after the 2 s wait, and every request after it too).
    r, data = post_render(port, json.dumps({"seconds": 0.2}).encode())
    assert r.status == 200 and mp4_boxes(data)[:2] == ["ftyp", "moov"], data[:200]
    assert fake.started == 1 and len(calls) == 2
    status, text = _get(port, "/metrics")
    assert 'avatar_serve_requests_total{route="/render",status="500"} 1.0' in text.decode()
    assert 'avatar_serve_requests_total{route="/render",status="200"} 1.0' in text.decode()
    assert "avatar_serve_queue_depth 0.0" in text.decode()
    lines = [json.loads(x) for x in capfd.readouterr().err.splitlines() if x.startswith("{")]
    failed = next(x for x in lines if x["event"] == "request" and x["status"] == 500)
    assert failed["error"] == "internal" and "injected" in failed["reason"] and "/tmp" not in failed["reason"]
    assert any(x["event"] == "internal_error" and x["kind"] == "RuntimeError" for x in lines)


def test_the_accelerator_slot_is_released_exactly_once_on_every_path():
    from avatar_release.serving import Metrics, ServeError
    from avatar_release.serving._app import AppConfig, _Admission

    class Job:
        def __init__(self, on_finish):
            self.on_finish = on_finish

        def start(self):
            return self

    class Unstartable(Job):
        def start(self):
            raise RuntimeError("can't start new thread")

    async def only_one_at_a_time(adm):
        """The slot can be taken, and while it is held a second turn cannot take it."""
        async with adm.turn() as first:
            await first.acquire(1.0)
            async with adm.turn() as second:
                with pytest.raises(ServeError, match="waited 0.05 s for the accelerator"):
                    await second.acquire(0.05)

    async def main():
        adm = _Admission(Metrics(), AppConfig(queue=2))
        with pytest.raises(RuntimeError, match="injected"):  # after acquire, before any job: the block frees it
            async with adm.turn() as turn:
                await turn.acquire(1.0)
                raise RuntimeError("injected")
        assert not adm.busy and adm.waiting == 0
        with pytest.raises(RuntimeError, match="new thread"):  # a job that never started: the block frees it
            async with adm.turn() as turn:
                await turn.acquire(1.0)
                turn.start(Unstartable)
        assert not adm.busy
        async with adm.turn() as turn:  # a started job owns the slot past the block's end...
            await turn.acquire(1.0)
            job = turn.start(Job)
        assert adm.busy and adm.waiting == 0
        async with adm.turn() as other:
            with pytest.raises(ServeError, match="waited"):
                await other.acquire(0.05)
        job.on_finish()  # ...until it finishes; a stray second call releases nothing
        job.on_finish()
        assert not adm.busy
        await only_one_at_a_time(adm)  # released once: still one render at a time
        with pytest.raises(RuntimeError, match="without the accelerator slot"):
            async with adm.turn() as turn:  # a job started without the slot is refused
                turn.start(Job)
        await only_one_at_a_time(adm)
        assert not adm.busy and adm.waiting == 0

    asyncio.run(main())


def test_a_wrong_method_on_render_is_counted_like_every_other_answer(serve):
    port, pod, fake = serve()
    for _ in range(2):
        status, body = _get(port, "/render")
        assert (status, json.loads(body)) == (405, {"error": "method_not_allowed", "message": "GET not allowed here"})
    assert _get(port, "/nowhere")[0] == 404
    text = _get(port, "/metrics")[1].decode()
    assert 'avatar_serve_requests_total{route="/render",status="405"} 2.0' in text
    assert 'status="404"' not in text  # unknown paths are not a label (unbounded); only routes count


_DRAINING_POD = r"""
import json, pathlib, sys, time
from avatar_release.serving import Pod, ServerConfig, _render, run_server
from tests.serving_fakes import FakeStream, fake_build

gate, fake = pathlib.Path(sys.argv[1]), FakeStream(delay=0.05)

def held_after_the_first_chunk(build, image, audio, *, seed=0, frames=None, values=None):
    for i, chunk in enumerate(fake(build, image, audio, seed=seed)):
        yield chunk
        while i == 0 and not gate.exists():  # the test opens the gate once it has probed the drain
            time.sleep(0.02)

_render.stream = held_after_the_first_chunk
run_server(Pod(None, "dev", fake_build()), ServerConfig(host="127.0.0.1", port=0, grace=30),
           on_ready=lambda addr, probes: print(json.dumps({"port": addr[1]}), flush=True))
"""


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_a_draining_pod_answers_503_until_its_render_finishes_then_exits_0(tmp_path):
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRAINING_POD, str(gate)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=30)[1][-2000:]
        port = json.loads(line)["port"]
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/render", body=json.dumps({"seconds": 1.6}), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200 and r.read1(100)  # streaming: the render holds the accelerator
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # uvicorn checks for exit every 0.1 s: a pod that stopped listening has by now
        status, body = _get(port, "/readyz")  # (was: connection refused)
        assert status == 503 and json.loads(body)["error"] == "draining"
        refused, data = post_render(port, json.dumps({"seconds": 0.2}).encode())
        assert refused.status == 503 and json.loads(data)["error"] == "draining"
        assert refused.getheader("Retry-After") == "5"
        gate.touch()
        rest = r.read()  # the render in flight finishes whole
        assert r.getheader("X-Frames") == "40" and rest.count(b"moof") >= 1
        assert proc.wait(30) == 0
        with pytest.raises(ConnectionRefusedError):  # and then the listener is closed
            _get(port, "/livez")
    finally:
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate(timeout=30)[1]
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds.index("ready") < kinds.index("draining") < kinds.index("stopped"), kinds
    assert [e["status"] for e in events if e["event"] == "request"] == [503, 200]
