"""Media inputs: decode + fit of 1080p pictures, a 10-minute MP3 to 16 kHz mono, a bomb's header.

    python benchmarks/bench_media.py [--runs 10] [--out benchmarks/results/media.json]

* picture: a 1920x1080 frame of ffmpeg's ``testsrc2`` with grain (so it compresses like a photo)
  as JPEG (q 2) and PNG (mixed filters, as libpng writes them), read and fitted to 1280x720 (the avatar-720p pipeline) by ``cover``;
  median of ``--runs``. The PNG is also decoded by the hand-written decoder this replaced
  (``avatar_release/media.py`` at ``--old-commit``, loaded from git), once: the "was" figure.
  Goal: <= 50 ms each.
* speech: a 10-minute 44.1 kHz stereo MP3 decoded to 16 kHz mono, in a fresh process, streamed
  (chunks dropped) and read whole; wall time and peak RSS of the Python process and of ffmpeg.
* bomb: a PNG whose header claims 60000x60000 (3.6 GP) refused; median of ``--runs``. Goal: < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_AUDIO_CHILD = r"""
import json, resource, sys, time
from avatar_release import media
from avatar_release.media import ffmpeg_version
ffmpeg_version()  # its probe runs now, not inside the timed decode
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
if sys.argv[2] == "stream":
    n = 0
    for chunk in media.stream_audio(sys.argv[1], sample_rate=16000):
        n += chunk.size
else:
    n = media.read_audio(sys.argv[1], sample_rate=16000).size
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "samples": n, "python_rss_before_mb": before,
                  "python_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ffmpeg_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _median_ms(fn, runs: int) -> dict[str, float]:
    """Median wall and CPU milliseconds. CPU time is what the work costs; wall time on a shared
    2-core machine also holds other processes' turns (the load average is recorded beside it)."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall_ms": round(statistics.median(wall) * 1000, 2), "cpu_ms": round(statistics.median(cpu) * 1000, 2)}


def _old_media(commit: str) -> types.ModuleType | None:
    """The media module as it was at ``commit`` (the hand-written PNG decoder), or None."""
    try:
        src = subprocess.run(["git", "show", f"{commit}:avatar_release/media.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("old_media")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    exec(compile(src, f"{commit}:avatar_release/media.py", "exec"), mod.__dict__)  # our own history, for timing
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--old-commit", default="ea9f89a", help="a commit whose avatar_release/media.py is the old decoder")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "media.json"))
    args = ap.parse_args()

    from avatar_release import media
    from avatar_release.errors import InputError
    from avatar_release.media import ffmpeg_version
    from tests.media.helpers import ffmpeg, png_header_only

    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "load_average_1min": round(os.getloadavg()[0], 2),
                                 "ffmpeg": ffmpeg_version(), "pillow": __import__("PIL").__version__}}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # testsrc2 with film-grain noise: compresses like a photo, not like a cartoon
        src = ["-f", "lavfi", "-i", "testsrc2=size=1920x1080", "-vf", "noise=alls=12:allf=t", "-frames:v", "1"]
        ffmpeg(*src, "-q:v", "2", str(d / "p.jpg"))
        ffmpeg(*src, "-pred", "mixed", str(d / "p.png"))
        ffmpeg(*src, "-pred", "paeth", str(d / "p-paeth.png"))  # the old decoder's slow path: a Python loop
        pictures = {}
        for name in ("p.jpg", "p.png", "p-paeth.png"):
            path = d / name
            ms = _median_ms(lambda: media.load_image(path, height=720, width=1280, fit="cover"), args.runs)
            tiny = _median_ms(lambda: media.load_image(path, height=48, width=80, fit="cover"), args.runs)
            pictures[name] = {"bytes": path.stat().st_size, "decode_fit_720p_ms": ms, "decode_fit_80x48_ms": tiny}
        old = _old_media(args.old_commit)
        if old is not None:
            for name in ("p.png", "p-paeth.png"):
                data = (d / name).read_bytes()
                pictures[name]["old_decoder_ms"] = _median_ms(lambda: old.decode_png(data), 1)
            results["old_decoder"] = f"{args.old_commit}:avatar_release/media.py decode_png (no fit: it refused other sizes)"
        results["picture_1080p"] = pictures

        mp3 = d / "ten-minutes.mp3"
        ffmpeg("-f", "lavfi", "-i", "sine=frequency=220:duration=600:sample_rate=44100", "-ac", "2",
               "-c:a", "libmp3lame", "-b:a", "128k", str(mp3))
        speech = {"file_mb": round(mp3.stat().st_size / 1e6, 2), "decoded_mb_float32": round(600 * 16000 * 4 / 1e6, 1)}
        for mode in ("stream", "read"):
            out = subprocess.run([sys.executable, "-c", _AUDIO_CHILD, str(mp3), mode], capture_output=True, text=True,
                                 check=True, cwd=ROOT).stdout
            speech[mode] = {k: round(v, 3) for k, v in json.loads(out).items()}
        results["mp3_10min_to_16k_mono"] = speech

        bomb = d / "bomb.png"
        bomb.write_bytes(png_header_only(60000, 60000))

        def refuse():
            try:
                media.read_image(bomb, height=720, width=1280)
            except InputError:
                return
            raise AssertionError("a 60000x60000 header was not refused")

        results["bomb_60000x60000_refused_ms"] = _median_ms(refuse, args.runs)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    pic = results["picture_1080p"]
    print(json.dumps(results, indent=1))
    for name in ("p.jpg", "p.png"):
        t = pic[name]["decode_fit_720p_ms"]
        print(f"{name} 1080p decode + cover fit to 720p: {t['wall_ms']} ms wall, {t['cpu_ms']} ms CPU "
              f"({t['cpu_ms'] / 50:.2f}x the 50 ms goal in CPU time)")
    for name in ("p.png", "p-paeth.png"):
        if "old_decoder_ms" in pic[name]:
            old_ms, new_ms = pic[name]["old_decoder_ms"]["cpu_ms"], pic[name]["decode_fit_720p_ms"]["cpu_ms"]
            print(f"{name}: old decoder {old_ms} ms CPU -> new decode + fit {new_ms} ms CPU: {old_ms / new_ms:.1f}x less")
    s = results["mp3_10min_to_16k_mono"]
    print(f"10-min MP3 -> 16 kHz mono: streamed {s['stream']['seconds']} s ({600 / s['stream']['seconds']:.0f}x real time), "
          f"Python peak RSS {s['stream']['python_peak_rss_mb']} MB streamed vs {s['read']['python_peak_rss_mb']} MB whole")
    bomb_ms = results["bomb_60000x60000_refused_ms"]["wall_ms"]
    print(f"60000x60000 header refused in {bomb_ms} ms wall ({bomb_ms / 100:.4f}x the 100 ms budget)")


if __name__ == "__main__":
    main()
