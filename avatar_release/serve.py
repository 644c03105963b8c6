"""``avatar-release serve``: a minimal serving pod on the runtime loader.

At start it resolves, verifies and loads the build, then renders one warm chunk of the
sample inputs; it reports ready only if that chunk compiled nothing. Then it serves:

    GET  /healthz   -> {"ready": true, "build_id", "digest", "compiles", "load_seconds", ...}
    POST /render    -> video/mp4 (H.264 + AAC); body JSON, all optional:
                       {"seconds": 1.0, "seed": 0, "image_b64": "...", "audio_b64": "...", "fit": "cover"}
                       (image: JPEG/PNG/WebP, fitted by "cover", "contain" or "exact";
                       audio: WAV/MP3/M4A/FLAC/Ogg/WebM; the old keys image_png_b64 and
                       audio_wav_b64 are read too; bad media -> 400 with the reason)
                       response headers X-Build-Id, X-Compiles, X-Deadline-Misses, X-Frames

Uses only the runtime (no torch). Standard-library HTTP: one request at a time, which is
what one accelerator host serving one stream does.
"""

from __future__ import annotations

import base64
import json
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from .errors import AvatarReleaseError, InputError

__all__ = ["ServingPod", "start_pod", "serve_forever"]


class ServingPod:
    def __init__(self, build):
        self.build = build
        self.lock = threading.Lock()
        self.requests = 0
        self.warm_seconds = 0.0

    def warm_up(self) -> None:
        from .runtime import stream
        from .samples import sample_audio, sample_image

        p = self.build.manifest.program
        t0 = time.perf_counter()
        frames = max(b.frames for b in self.build.manifest.buckets)
        audio = sample_audio(frames / p.fps, sample_rate=p.sample_rate)
        for _ in stream(self.build, sample_image(p.height, p.width), audio):
            pass
        self.warm_seconds = time.perf_counter() - t0
        if self.build.guard.count:
            raise AvatarReleaseError(f"warm-up compiled {self.build.guard.count} time(s): not ready")

    def health(self) -> dict:
        t = self.build.timings
        return {"ready": True, "build_id": self.build.build_id, "digest": self.build.digest,
                "compiles": self.build.guard.count, "requests": self.requests,
                "load_seconds": round(t.total(), 4), "warm_chunk_seconds": round(self.warm_seconds, 4)}

    def render(self, body: dict) -> tuple[bytes, dict]:
        from .media import DEFAULT_FIT, load_audio_bytes, load_image_bytes, write_mp4
        from .runtime import render
        from .samples import sample_audio, sample_image

        p = self.build.manifest.program
        with tempfile.TemporaryDirectory() as tmp:
            fit = body.get("fit", DEFAULT_FIT)
            image_b64 = body.get("image_b64", body.get("image_png_b64"))
            if image_b64 is not None:
                image = load_image_bytes(_b64(image_b64, "image"), height=p.height, width=p.width, fit=fit,
                                         where="request image", pipeline=self.build.manifest.pipeline).pixels
            else:
                image = sample_image(p.height, p.width)
            audio_b64 = body.get("audio_b64", body.get("audio_wav_b64"))
            if audio_b64 is not None:
                audio = load_audio_bytes(_b64(audio_b64, "audio"), sample_rate=p.sample_rate,
                                         where="request audio").samples
            else:
                audio = sample_audio(float(body.get("seconds", 1.0)), sample_rate=p.sample_rate)
            with self.lock:
                before = self.build.guard.count
                frames, report = render(self.build, np.ascontiguousarray(image), audio, seed=int(body.get("seed", 0)))
                self.requests += 1
            out = Path(tmp) / "out.mp4"
            write_mp4(out, frames, fps=p.fps, audio=audio, sample_rate=p.sample_rate)
            headers = {"X-Build-Id": self.build.build_id, "X-Compiles": str(self.build.guard.count - before),
                       "X-Deadline-Misses": str(report.misses), "X-Frames": str(report.frames)}
            return out.read_bytes(), headers


def _b64(text, what: str) -> bytes:
    if not isinstance(text, str):
        raise InputError(f"request {what}: expected a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise InputError(f"request {what}: not valid base64 ({exc})") from None


def start_pod(registry, ref: str, *, trust=None, prepare=None) -> ServingPod:
    """A pod ready to serve ``ref``: devices prepared for the build, verified (and its signed
    statement checked when ``trust`` is given), loaded strictly, one warm chunk with zero compiles."""
    from .registry import read_manifest
    from .runtime import load

    resolved, _ = prepare(registry, ref) if prepare else read_manifest(registry, ref)
    # With a trust key the channel is loaded by name (its signed statement is checked);
    # without, the digest resolved once is what every later fetch uses.
    pod = ServingPod(load(ref if trust else resolved.digest, registry, strict=True, trust=trust))
    pod.warm_up()
    return pod


def serve_forever(pod: ServingPod, host: str, port: int, on_ready) -> None:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: dict) -> None:
            self._send(code, json.dumps(doc).encode(), "application/json")

        def do_GET(self):  # noqa: N802
            if self.path == "/healthz":
                self._json(200, pod.health())
            else:
                self._json(404, {"error": f"no route {self.path}"})

        def do_POST(self):  # noqa: N802
            if self.path != "/render":
                return self._json(404, {"error": f"no route {self.path}"})
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(body, dict):
                    raise InputError("request body must be a JSON object")
                data, headers = pod.render(body)
                self._send(200, data, "video/mp4", headers)
            except (InputError, ValueError) as e:
                self._json(400, {"error": str(e)})
            except AvatarReleaseError as e:
                self._json(500, {"error": type(e).__name__, "message": str(e)})

        def log_message(self, fmt, *args):  # quiet: the pod's log is its JSON lines
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    on_ready(server.server_address)
    try:
        server.serve_forever()
    finally:
        server.server_close()
