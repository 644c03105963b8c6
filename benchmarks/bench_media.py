"""Media inputs: decode + fit of 1080p pictures, a 10-minute MP3 to 16 kHz mono, a bomb's header.

    python benchmarks/bench_media.py [--runs 10] [--out benchmarks/results/media.json]
    python benchmarks/bench_media.py --smoke --out FILE   # 320x180, a 4 s track: seconds; the tests run it

* picture: a 1920x1080 frame of ffmpeg's ``testsrc2`` with grain (so it compresses like a photo)
  as JPEG (q 2) and PNG (mixed filters, as libpng writes them), read and fitted to 1280x720 (the avatar-720p pipeline) by ``cover``;
  median of ``--runs``. The PNG is also decoded by the hand-written decoder this replaced
  (``avatar_release/media.py`` at ``--old-commit``, loaded from git), once: the "was" figure.
  Goal: <= 50 ms each.
* speech: a 10-minute 44.1 kHz stereo MP3 decoded to 16 kHz mono, in a fresh process, streamed
  (chunks dropped) and read whole; wall time and peak RSS of the Python process and of ffmpeg.
* bomb: a PNG whose header claims 60000x60000 (3.6 GP) refused; median of ``--runs``. Goal: < 100 ms.
* render feed: the 10-minute MP3 and a ``--render-hours`` (2) one made of copies of it, each
  rendered to an MP4 in a fresh process by ``render.render_build_to_files``: the decoder, the audio
  feed, the chunk loop of ``runtime.stream``, the H.264 encoder and the streamed audio track, for
  real; the stages are the numpy stand-ins of ``tests/standin_build.py`` (80x48, 8-frame chunks; a
  compiled tiny build takes seconds a chunk, so hours of video are not rendered through XLA here).
  Peak RSS of the Python process, wall time; the long / short ratios side by side. ``--no-render``
  skips it.
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

from _out import out_path, write_results  # noqa: E402 (benchmarks/_out.py, beside this file)

# (picture width, height, track seconds, copies of the track in the long render) of a full run and a smoke run
FULL, SMOKE = (1920, 1080, 600, None), (320, 180, 4, 2)

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


_RENDER_CHILD = r"""
import json, resource, sys, time
from tests.standin_build import standin_build
from avatar_release.serving import render_build_to_files, request_audio
from avatar_release.media import sample_image

build = standin_build()
t0 = time.perf_counter()
audio = request_audio(build.manifest.program, sys.argv[1], max_seconds=float(sys.argv[3]))
report, mp4 = render_build_to_files(build, sample_image(48, 80), audio.pieces, out_path=sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t0, "audio_seconds": audio.record()["seconds"],
                  "frames": report.frames, "chunks": len(report.chunks), "mp4_mb": mp4.bytes / 1e6,
                  "python_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _render_feed(d: Path, track: Path, track_seconds: float, copies: int) -> dict:
    """Peak RSS and time of rendering ``track`` and ``copies`` of it end to end, each in a fresh process."""
    from tests.media.helpers import ffmpeg

    long = d / "long.mp3"
    ffmpeg("-stream_loop", str(copies - 1), "-i", str(track), "-c", "copy", "-y", str(long))  # no re-encode
    runs = {}
    for name, path in (("short", track), ("long", long)):
        out = subprocess.run(
            [sys.executable, "-c", _RENDER_CHILD, str(path), str(d / "render.mp4"), str(copies * track_seconds + 60)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        ).stdout
        runs[name] = {k: round(v, 3) for k, v in json.loads(out).items()}
    runs["copies"] = copies
    runs["ratio_long_to_short"] = {
        k: round(runs["long"][k] / runs["short"][k], 3)
        for k in ("audio_seconds", "frames", "seconds", "python_peak_rss_mb")
    }
    return runs


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
        src = subprocess.run(
            ["git", "show", f"{commit}:avatar_release/media.py"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("old_media")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    exec(compile(src, f"{commit}:avatar_release/media.py", "exec"), mod.__dict__)  # our own history, for timing
    return mod


def _pictures(d: Path, width: int, height: int, runs: int, old_commit: str) -> dict:
    from avatar_release import media
    from tests.media.helpers import ffmpeg

    # testsrc2 with film-grain noise: compresses like a photo, not like a cartoon
    src = ["-f", "lavfi", "-i", f"testsrc2=size={width}x{height}", "-vf", "noise=alls=12:allf=t", "-frames:v", "1"]
    ffmpeg(*src, "-q:v", "2", str(d / "p.jpg"))
    ffmpeg(*src, "-pred", "mixed", str(d / "p.png"))
    ffmpeg(*src, "-pred", "paeth", str(d / "p-paeth.png"))  # the old decoder's slow path: a Python loop
    files = {}
    for name in ("p.jpg", "p.png", "p-paeth.png"):
        path = d / name
        files[name] = {
            "bytes": path.stat().st_size,
            "decode_fit_720p_ms": _median_ms(lambda: media.load_image(path, height=720, width=1280, fit="cover"), runs),
            "decode_fit_80x48_ms": _median_ms(lambda: media.load_image(path, height=48, width=80, fit="cover"), runs),
            "decode_no_resize_ms": _median_ms(
                lambda: media.load_image(path, height=height, width=width, fit="cover"), runs
            ),
        }
    out = {"source": f"{width}x{height}", "files": files}
    old = _old_media(old_commit)
    if old is not None:
        for name in ("p.png", "p-paeth.png"):
            data = (d / name).read_bytes()
            files[name]["old_decoder_ms"] = _median_ms(lambda: old.decode_png(data), 1)
        out["old_decoder"] = f"{old_commit}:avatar_release/media.py decode_png (no fit: it refused other sizes)"
    return out


def _speech(d: Path, seconds: float) -> tuple[Path, dict]:
    from tests.media.helpers import ffmpeg

    mp3 = d / "track.mp3"
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency=220:duration={seconds:g}:sample_rate=44100",
        "-ac",
        "2",
        "-c:a",
        "libmp3lame",
        "-b:a",
        "128k",
        str(mp3),
    )
    speech = {
        "track_seconds": seconds,
        "file_mb": round(mp3.stat().st_size / 1e6, 2),
        "decoded_mb_float32": round(seconds * 16000 * 4 / 1e6, 1),
    }
    for mode in ("stream", "read"):
        out = subprocess.run(
            [sys.executable, "-c", _AUDIO_CHILD, str(mp3), mode], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout
        speech[mode] = {k: round(v, 3) for k, v in json.loads(out).items()}
    return mp3, speech


def _bomb(d: Path, runs: int) -> dict:
    from avatar_release import media
    from avatar_release.errors import InputError
    from tests.media.helpers import png_header_only

    bomb = d / "bomb.png"
    bomb.write_bytes(png_header_only(60000, 60000))

    def refuse():
        try:
            media.read_image(bomb, height=720, width=1280)
        except InputError:
            return
        raise AssertionError("a 60000x60000 header was not refused")

    return {"header": "60000x60000", "refused_ms": _median_ms(refuse, runs)}


def _report(results: dict) -> None:
    pic = results["picture"]
    for name in ("p.jpg", "p.png"):
        f = pic["files"][name]
        t = f["decode_fit_720p_ms"]
        print(
            f"{name} {pic['source']} decode + cover fit to 720p: {t['wall_ms']} ms wall, {t['cpu_ms']} ms CPU "
            f"({t['cpu_ms'] / 50:.2f}x the 50 ms goal in CPU time); to 80x48 "
            f"{f['decode_fit_80x48_ms']['cpu_ms']} ms CPU; at {pic['source']} (no resize) "
            f"{f['decode_no_resize_ms']['cpu_ms']} ms CPU"
        )
    for name in ("p.png", "p-paeth.png"):
        f = pic["files"][name]
        if "old_decoder_ms" in f:
            old_ms, new_ms = f["old_decoder_ms"]["cpu_ms"], f["decode_fit_720p_ms"]["cpu_ms"]
            print(
                f"{name}: old decoder {old_ms} ms CPU -> new decode + fit {new_ms} ms CPU: "
                f"{old_ms / max(new_ms, 1e-3):.1f}x less"
            )
    s = results["mp3_to_16k_mono"]
    print(
        f"{s['track_seconds']:g} s MP3 -> 16 kHz mono: streamed {s['stream']['seconds']} s "
        f"({s['track_seconds'] / max(s['stream']['seconds'], 1e-3):.0f}x real time), "
        f"Python peak RSS {s['stream']['python_peak_rss_mb']} MB streamed vs {s['read']['python_peak_rss_mb']} MB whole"
    )
    if "render_feed" in results:
        r = results["render_feed"]
        short, long, ratio = r["short"], r["long"], r["ratio_long_to_short"]
        print(
            f"render feed, {short['audio_seconds'] / 60:.1f} min vs {long['audio_seconds'] / 60:.1f} min of MP3: "
            f"audio x{ratio['audio_seconds']}, frames x{ratio['frames']}, time x{ratio['seconds']}, "
            f"peak RSS x{ratio['python_peak_rss_mb']} ({short['python_peak_rss_mb']} MB vs "
            f"{long['python_peak_rss_mb']} MB)"
        )
    bomb_ms = results["bomb"]["refused_ms"]["wall_ms"]
    print(f"{results['bomb']['header']} header refused in {bomb_ms} ms wall ({bomb_ms / 100:.4f}x the 100 ms budget)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--old-commit", default="ea9f89a", help="a commit whose avatar_release/media.py is the old decoder")
    ap.add_argument("--render-hours", type=float, default=2.0, help="length of the long render-feed track")
    ap.add_argument("--no-render", action="store_true", help="skip the render-feed measurement (minutes)")
    ap.add_argument("--smoke", action="store_true", help="a 320x180 picture, a 4 s track (and 8 s rendered), one run")
    ap.add_argument("--out", help="write the JSON here (default benchmarks/results/media.json; --smoke: nowhere)")
    args = ap.parse_args()
    width, height, track_seconds, copies = SMOKE if args.smoke else FULL
    runs = 1 if args.smoke else args.runs
    copies = copies or max(1, round(args.render_hours * 3600 / track_seconds))

    from avatar_release.media import ffmpeg_version

    results: dict = {
        "smoke": args.smoke,
        "runs": runs,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "ffmpeg": ffmpeg_version(),
            "pillow": __import__("PIL").__version__,
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        results["picture"] = _pictures(d, width, height, runs, args.old_commit)
        track, results["mp3_to_16k_mono"] = _speech(d, track_seconds)
        if not args.no_render:
            results["render_feed"] = _render_feed(d, track, track_seconds, copies)
        results["bomb"] = _bomb(d, runs)
    _report(results)
    write_results(results, out_path(args.out, "media", smoke=args.smoke), smoke=args.smoke)


if __name__ == "__main__":
    main()
