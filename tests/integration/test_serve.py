"""`avatar-release serve`: a real process on a real build: ready only after a warm chunk, renders
streamed as fragmented MP4, bounded input, probes and metrics, following its channel across a
refused and an accepted swap under load with zero failed requests, and SIGTERM draining to exit 0."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from avatar_release.registry import LocalRegistry
from avatar_release.runtime import pace_of
from tests.helpers import manifest_of

pytestmark = pytest.mark.slow


class _Pod:
    """A `serve` child whose log goes to a file: an unread stderr pipe fills after a few hundred
    request lines and blocks the pod (a load test would then time out for the wrong reason)."""

    def __init__(self, proc, log_path):
        self.proc, self.log_path = proc, log_path

    def log(self) -> str:
        return self.log_path.read_text()


def _start(root, *extra, log_dir=None):
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the CLI sets it from the manifest
    log_path = Path(tempfile.mkdtemp(dir=log_dir)) / "pod.log"
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "avatar_release",
                "serve",
                "--registry",
                str(root),
                "--channel",
                "dev",
                "--port",
                "0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
    pod = _Pod(proc, log_path)
    line = proc.stdout.readline()
    if not line:
        _stop(pod)
        raise AssertionError(pod.log()[-2000:])
    return pod, json.loads(line)


def _get(base, path):
    return json.loads(urllib.request.urlopen(base + path, timeout=30).read())


def _render(base, doc, timeout=300):
    req = urllib.request.Request(
        base + "/render", data=json.dumps(doc).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.headers, resp.read()


def _stop(pod):
    """Stop the pod if it still runs (SIGTERM, then SIGKILL) and return its log."""
    if pod.proc.poll() is None:
        pod.proc.terminate()
    try:
        pod.proc.wait(60)
    except subprocess.TimeoutExpired:
        pod.proc.kill()
        pod.proc.wait(30)
    return pod.log()


def _check_deadline_misses(metrics: str, requests: list[dict], manifest) -> None:
    """The pod's two accounts of chunks slower than their playback time agree, and fit the chunk
    times it measured, whatever this machine's speed.

    Each request line's ``over_playback`` is at most its ``chunks``, their sum is the over-playback
    counter; ``misses`` and the deadline-miss counter count them only on the build's own hardware
    (none on emulated devices, as /healthz says); and the chunk-time histogram brackets the count: a chunk slower than the longest playback time
    (the largest bucket's frames / fps) surely missed; one no slower than a single frame's did not.
    """
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    counted = sum(s.value for s in families["avatar_serve_chunks_over_playback"].samples if s.name.endswith("_total"))
    missed = sum(s.value for s in families["avatar_serve_deadline_misses"].samples if s.name.endswith("_total"))
    at_most = Counter()  # histogram edge (s) -> chunks that took at most that long, every bucket together
    for s in families["avatar_serve_chunk_seconds"].samples:
        if s.name.endswith("_bucket"):
            at_most[float(s.labels["le"])] += s.value
    chunks = at_most[math.inf]
    assert chunks == sum(r.get("chunks", 0) for r in requests) >= 3
    assert all(0 <= r.get("misses", 0) <= r.get("over_playback", 0) <= r.get("chunks", 0) for r in requests)
    assert counted == sum(r.get("over_playback", 0) for r in requests)
    assert missed == sum(r.get("misses", 0) for r in requests) == (0 if pace_of(manifest).emulated else counted)
    fps, longest = manifest.program.fps, max(b.frames for b in manifest.buckets) / manifest.program.fps
    surely = chunks - at_most[min(edge for edge in at_most if edge >= longest)]
    possibly = chunks - max((at_most[edge] for edge in at_most if edge <= 1 / fps), default=0)
    assert surely <= counted <= possibly, (surely, counted, possibly, sorted(at_most.items()))


def test_serving_pod_reports_ready_and_streams_renders_with_zero_compiles(built_registry, tmp_path):
    from avatar_release.media import encode_wav_bytes, ffmpeg_exe, probe_mp4, sample_audio

    root, result = built_registry
    pod, ready = _start(root, log_dir=tmp_path)
    try:
        assert ready["event"] == "ready" and ready["compiles"] == 0 and ready["build_id"] == result.build_id
        assert ready["deadline"]["emulated"] is True and ready["deadline"]["target"] == "cpu-8"
        assert ready["deadline"]["where"] == f"8 emulated cpu devices on {os.cpu_count()} host cores"
        assert ready["deadline"]["chunks"] == 0  # the warm-up chunk is not a request's
        base = f"http://127.0.0.1:{ready['port']}"
        assert _get(base, "/healthz")["ready"] is True and _get(base, "/readyz")["ready"] is True
        headers, data = _render(
            base, {"audio_wav_b64": base64.b64encode(encode_wav_bytes(sample_audio(0.4), 16000)).decode()}
        )
        assert headers["X-Compiles"] == "0" and headers["X-Frames"] == "10"
        assert headers["Transfer-Encoding"] == "chunked" and data[4:8] == b"ftyp" and b"moof" in data
        (tmp_path / "r.mp4").write_bytes(data)
        assert probe_mp4(tmp_path / "r.mp4").frames == 10
        # A photo of another size and an MP3: fitted and decoded by the pod, as the CLI does.
        photo, speech = tmp_path / "p.jpg", tmp_path / "s.mp3"
        subprocess.run(
            [ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "testsrc=size=640x480", "-frames:v", "1", str(photo)],
            check=True,
        )
        subprocess.run(
            [
                ffmpeg_exe(),
                "-v",
                "error",
                "-f",
                "lavfi",
                "-i",
                "sine=frequency=220:duration=0.3",
                "-c:a",
                "libmp3lame",
                str(speech),
            ],
            check=True,
        )
        headers, _ = _render(
            base,
            {
                "image_b64": base64.b64encode(photo.read_bytes()).decode(),
                "audio_b64": base64.b64encode(speech.read_bytes()).decode(),
                "fit": "contain",
            },
        )
        assert headers["X-Compiles"] == "0" and int(headers["X-Frames"]) >= 8
        # A damaged picture is the client's fault: 400 with a stable code and what was wrong.
        with pytest.raises(urllib.error.HTTPError) as ei:
            _render(base, {"image_b64": base64.b64encode(photo.read_bytes()[:300]).decode()})
        doc = json.loads(ei.value.read())
        assert ei.value.code == 400 and doc["error"] == "invalid_image" and "request image" in doc["message"]
        for bad in ([1], {"seconds": 1e6}, {"seconds": "2"}):
            with pytest.raises(urllib.error.HTTPError) as ei:
                _render(base, bad)
            assert ei.value.code == 400 and json.loads(ei.value.read())["error"] in (
                "invalid_request",
                "duration_too_long",
            )
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
        assert "avatar_serve_compiles_total 0.0" in metrics and f'build_id="{result.build_id}"' in metrics
        paced = _get(base, "/healthz")["deadline"]  # every request's chunks so far, against playback
        assert paced["chunks"] >= 3 and paced["realtime_factor"] > 0 and paced["misses_on_target"] == 0
    finally:
        log = _stop(pod)
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    requests = [x for x in lines if x["event"] == "request"]
    assert [x["status"] for x in requests] == [200, 200, 400, 400, 400, 400]
    assert requests[0]["chunks"] == 2 and requests[0]["build"] == result.build_id  # 10 frames: 8 + 2
    assert requests[0]["realtime_factor"] > 0 and requests[2].get("realtime_factor") is None  # a 400 rendered nothing
    stopped = next(x for x in lines if x["event"] == "stopped")
    assert stopped["deadline"]["chunks"] == sum(r.get("chunks", 0) for r in requests)
    _check_deadline_misses(metrics, requests, manifest_of(LocalRegistry(root, create=False)))


def test_follow_refuses_a_bad_build_swaps_a_good_one_under_load_and_drains_on_sigterm(
    registry_copy, build_cache, tmp_path
):
    from avatar_release.promote import publish_to_dev
    from avatar_release.registry import LocalRegistry, read_manifest

    root, a = registry_copy
    reg = LocalRegistry(root)
    b = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
    assert b.digest != a.digest
    # Damage one executable blob that only build b has: loading b fails verification.
    a_blobs = {x.digest for x in read_manifest(reg, a.digest)[1].blobs()}
    victim = next(x for x in read_manifest(reg, b.digest)[1].blobs() if x.digest not in a_blobs)
    path = root / "blobs" / "sha256" / victim.digest.split(":")[1]
    good = path.read_bytes()
    os.chmod(path, 0o644)
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))

    pod, ready = _start(root, "--follow", "--poll", "0.2", "--grace", "60", log_dir=tmp_path)
    proc = pod.proc
    try:
        base = f"http://127.0.0.1:{ready['port']}"
        results, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                try:
                    headers, data = _render(base, {"seconds": 0.4})
                    results.append((200, headers["X-Build-Id"], len(data)))
                except urllib.error.HTTPError as e:
                    results.append((e.code, None, 0))
                except OSError as e:
                    results.append((0, repr(e), 0))

        def wait_for(pred, what, limit=120):
            t0 = time.time()
            while not pred(_get(base, "/healthz")):
                assert time.time() - t0 < limit, f"timed out waiting for {what}"
                time.sleep(0.2)

        clients = [threading.Thread(target=load) for _ in range(2)]
        try:
            for t in clients:
                t.start()
            publish_to_dev(reg, read_manifest(reg, b.digest)[0], reason="test: follow")
            wait_for(lambda h: h["follow"]["refused_digest"] == b.digest, "the refusal")
            assert _get(base, "/healthz")["build_id"] == a.build_id  # still serving the old build
            path.write_bytes(good)  # the registry is repaired; SIGHUP: check (and retry) now
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda h: h["build_id"] == b.build_id, "the swap", limit=300)
            n = len(results)
            while len(results) < n + 2:
                time.sleep(0.1)
            metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
            assert 'avatar_serve_swaps_total{result="refused"} 1.0' in metrics
            assert 'avatar_serve_swaps_total{result="swapped"} 1.0' in metrics
            assert "avatar_serve_compiles_total 0.0" in metrics and f'build_id="{b.build_id}"' in metrics
        finally:
            stop.set()
            for t in clients:
                t.join(300)
        assert results and all(s == 200 for s, _, _ in results), [r for r in results if r[0] != 200]
        served = [bid for _, bid, _ in results]
        assert served[0] == a.build_id and served[-1] == b.build_id and set(served) == {a.build_id, b.build_id}

        # SIGTERM while a render is in flight: it finishes, new work is refused, the process exits 0.
        done = []
        t = threading.Thread(target=lambda: done.append(_render(base, {"seconds": 3.0})))
        t.start()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        t.join(300)
        assert proc.wait(120) == 0
        headers, data = done[0]
        assert int(headers["X-Frames"]) == 75 and data.count(b"moof") >= 1
        log = pod.log()
        events = [json.loads(x)["event"] for x in log.splitlines() if x.startswith("{")]
        assert {"swap_refused", "swapped", "draining", "stopped"} <= set(events)
    finally:
        _stop(pod)  # never leak a pod into the next test, pass or fail


def test_a_following_pod_with_a_trust_key_swaps_only_to_a_signed_move(registry_copy, build_cache, tmp_path):
    """In process: dev moves to build b unsigned (refused: the statement still names a), then the
    promoter signs the move and SIGHUP's retry swaps b in, its statement remembered by the pod."""
    from avatar_release.promote import publish_to_dev
    from avatar_release.promote.actions import sign_channel
    from avatar_release.registry import LocalRegistry, read_manifest
    from avatar_release.runtime import TrustConfig
    from avatar_release.serving import start_pod
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
    from avatar_release.trust.statements import AcceptedState

    root, a = registry_copy
    reg = LocalRegistry(root)
    b = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
    priv, pub, _ = generate_keypair(tmp_path / "k")
    signing = load_private_key(priv)
    sign_channel(reg, "dev", signing)
    state = AcceptedState(tmp_path / "pod" / "accepted.json")
    pod = start_pod(reg, "dev", trust=TrustConfig(load_public_key(pub), state))
    assert pod.build.build_id == a.build_id and state.highest("dev")["digest"] == a.digest

    publish_to_dev(reg, read_manifest(reg, b.digest)[0], reason="test: unsigned move")
    assert pod.check_channel() == "refused"
    assert pod.build.build_id == a.build_id and "TrustError" in pod.health()["follow"]["refused_reason"]
    assert state.highest("dev")["digest"] == a.digest

    sign_channel(reg, "dev", signing)
    assert pod.check_channel(retry_refused=True) == "swapped"
    assert pod.build.build_id == b.build_id and pod.build.guard.count == 0
    assert state.highest("dev")["digest"] == b.digest
    text = pod.metrics.exposition().decode()
    assert 'avatar_serve_swaps_total{result="refused"} 1.0' in text and f'build_id="{b.build_id}"' in text
