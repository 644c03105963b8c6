"""`avatar-release serve`: a real process, ready only after a warm chunk, renders over HTTP."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def test_serving_pod_reports_ready_and_renders_with_zero_compiles(built_registry, tmp_path):
    from avatar_release.media import encode_wav_bytes, ffmpeg_exe, probe_mp4
    from avatar_release.samples import sample_audio

    root, result = built_registry
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the CLI sets it from the manifest
    proc = subprocess.Popen(
        [sys.executable, "-m", "avatar_release", "serve", "--registry", str(root), "--channel", "dev", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-2000:]
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["compiles"] == 0 and ready["build_id"] == result.build_id
        base = f"http://127.0.0.1:{ready['port']}"
        health = json.loads(urllib.request.urlopen(base + "/healthz", timeout=30).read())
        assert health["ready"] is True
        body = json.dumps({"audio_wav_b64": base64.b64encode(encode_wav_bytes(sample_audio(0.4), 16000)).decode()})
        req = urllib.request.Request(base + "/render", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert resp.headers["X-Compiles"] == "0" and resp.headers["X-Frames"] == "10"
            (tmp_path / "r.mp4").write_bytes(resp.read())
        assert probe_mp4(tmp_path / "r.mp4").frames == 10
        # A photo of another size and an MP3: fitted and decoded by the pod, as the CLI does.
        photo, speech = tmp_path / "p.jpg", tmp_path / "s.mp3"
        subprocess.run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "testsrc=size=640x480", "-frames:v", "1",
                        str(photo)], check=True)
        subprocess.run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "sine=frequency=220:duration=0.3",
                        "-c:a", "libmp3lame", str(speech)], check=True)
        body = json.dumps({"image_b64": base64.b64encode(photo.read_bytes()).decode(),
                           "audio_b64": base64.b64encode(speech.read_bytes()).decode(), "fit": "contain"})
        req = urllib.request.Request(base + "/render", data=body.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert resp.headers["X-Compiles"] == "0" and int(resp.headers["X-Frames"]) >= 8
        # A damaged picture is the client's fault: 400 with what was wrong.
        bad_image = json.dumps({"image_b64": base64.b64encode(photo.read_bytes()[:300]).decode()})
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(urllib.request.Request(base + "/render", data=bad_image.encode(), method="POST"),
                                   timeout=30)
        assert ei.value.code == 400
        assert "request image" in json.loads(ei.value.read())["error"]
        bad = urllib.request.Request(base + "/render", data=b"[1]", method="POST")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(bad, timeout=30)
        assert ei.value.code == 400
    finally:
        proc.terminate()
        proc.wait(30)
