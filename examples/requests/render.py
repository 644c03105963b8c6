#!/usr/bin/env python3
"""POST /render to a serving pod, as JSON (base64 fields) and as a multipart upload.

Python's standard library only (urllib): copy this file anywhere (then name the media with --image
and --audio) and run it.

    python3 examples/requests/render.py [POD_URL] [--mode json|multipart|both] [--image F] [--audio F]
                                        [--fit cover|contain|exact] [--seed N] [--out-dir DIR]

POD_URL defaults to $POD_URL, else http://127.0.0.1:8080. Each answer, a fragmented MP4 (H.264 +
AAC), is written a piece at a time as the pod streams it (memory does not grow with the video), to
DIR/render-<mode>.mp4.part, renamed to DIR/render-<mode>.mp4 once complete; one line per request
reports the pod's X-Build-Id and X-Compiles headers, the bytes received and the time to the first
byte. A refusal is the pod's JSON error (``{"error": CODE, "message": ...}``), printed with its
HTTP status; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

MEDIA = Path(__file__).resolve().parent.parent / "media"
PIECE = 64 * 1024  # bytes read from the response at a time


def json_request(url: str, image: bytes, audio: bytes, fit: str, seed: int) -> urllib.request.Request:
    """The request as one JSON object; the media base64-encoded (the body grows by a third)."""
    body = json.dumps(
        {
            "fit": fit,
            "seed": seed,
            "image_b64": base64.b64encode(image).decode("ascii"),
            "audio_b64": base64.b64encode(audio).decode("ascii"),
        }
    ).encode("utf-8")
    return urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})


def multipart_request(
    url: str, image: tuple[str, bytes], audio: tuple[str, bytes], fit: str, seed: int
) -> urllib.request.Request:
    """The request as multipart/form-data: files ``image`` and ``audio``, text fields ``fit`` and ``seed``."""
    boundary = f"avatar-release-{uuid.uuid4().hex}"  # random: it must not occur inside the files
    parts: list[bytes] = []
    for name, value in (("fit", fit), ("seed", str(seed))):
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, data) in (("image", image), ("audio", audio)):
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        parts.append(head.encode("utf-8") + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode("ascii"))
    return urllib.request.Request(
        url, data=b"".join(parts), method="POST", headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )


def send(request: urllib.request.Request, out: Path, timeout: float) -> bool:
    """Send ``request``, stream a 200's body into ``out`` and report; False (and a message) on a refusal."""
    started = time.monotonic()
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as refusal:  # 4xx/5xx: the body is the pod's JSON error
        text = refusal.read().decode("utf-8", "replace")
        try:
            error = json.loads(text)
            text = f"{error.get('error')}: {error.get('message')}"
        except (ValueError, AttributeError):
            pass
        print(f"{out.name}: refused, HTTP {refusal.code}: {text}", file=sys.stderr)
        return False
    except urllib.error.URLError as unreachable:  # nothing answered: wrong URL, pod not up yet
        print(f"{out.name}: cannot reach {request.full_url}: {unreachable.reason}", file=sys.stderr)
        return False
    first_byte = None
    received = 0
    part = out.with_name(out.name + ".part")  # renamed once whole: a cut stream never replaces a good file
    with response, open(part, "wb") as sink:
        while piece := response.read1(PIECE):  # what has arrived, up to PIECE: no waiting for a full piece
            if first_byte is None:
                first_byte = time.monotonic() - started
            sink.write(piece)
            received += len(piece)
    part.replace(out)
    headers = response.headers
    print(
        f"{out}: {received} bytes, first byte after {first_byte or 0.0:.2f} s, "
        f"X-Build-Id: {headers.get('X-Build-Id')}, X-Compiles: {headers.get('X-Compiles')}"
    )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="POST /render to a serving pod (JSON and multipart).")
    parser.add_argument(
        "url",
        nargs="?",
        default=os.environ.get("POD_URL", "http://127.0.0.1:8080"),
        help="the pod (default: $POD_URL, else http://127.0.0.1:8080)",
    )
    parser.add_argument("--mode", choices=("json", "multipart", "both"), default="both")
    parser.add_argument("--image", type=Path, default=MEDIA / "face.png", help="JPEG, PNG or WebP")
    parser.add_argument("--audio", type=Path, default=MEDIA / "speech.wav", help="WAV, MP3, M4A, FLAC, Ogg, ...")
    parser.add_argument("--fit", choices=("cover", "contain", "exact"), default="cover")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="longest wait for the pod, at the start or between two pieces (a queued render waits up to 120 s)",
    )
    args = parser.parse_args(argv)

    endpoint = args.url.rstrip("/") + "/render"
    image, audio = args.image.read_bytes(), args.audio.read_bytes()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    requests = []
    if args.mode in ("json", "both"):
        requests.append(("json", json_request(endpoint, image, audio, args.fit, args.seed)))
    if args.mode in ("multipart", "both"):
        requests.append(
            (
                "multipart",
                multipart_request(endpoint, (args.image.name, image), (args.audio.name, audio), args.fit, args.seed),
            )
        )
    ok = True
    for mode, request in requests:
        ok = send(request, args.out_dir / f"render-{mode}.mp4", args.timeout) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
