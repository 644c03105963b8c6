"""A render consumes its speech track as it goes: the audio feed, the chunk loop over pieces, the
file writer, the duration bound, and memory that does not grow with the track.

The build here is ``tests/standin_build.py`` (numpy stages over the checked-in tiny manifest), so
everything around the executables runs for real (decoder, feed, ``runtime.stream``, encoder)
without a compile; tests/integration/test_runtime.py renders real builds through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from avatar_release import media
from avatar_release.errors import InputError
from avatar_release.media import sample_audio, sample_image
from avatar_release.runtime import feed_chunks, plan_chunks, render, stream
from avatar_release.serving import RENDER_MAX_AUDIO_SECONDS, render_build_to_files, request_audio
from tests.media.helpers import tone
from tests.standin_build import standin_build

ROOT = Path(__file__).resolve().parents[2]
SPF = 640


def _manifest(*frames: int):
    return SimpleNamespace(
        program=SimpleNamespace(samples_per_frame=SPF, sample_rate=16000),
        buckets=[SimpleNamespace(name=f"f{n}", frames=n) for n in frames],
    )


def _split(audio: np.ndarray, sizes: list[int]):
    """``audio`` in pieces of the given sizes, cycling through them."""
    i = k = 0
    while i < audio.size:
        n = sizes[k % len(sizes)]
        yield audio[i : i + n]
        i, k = i + n, k + 1


@settings(max_examples=150, deadline=None, database=None)
@given(
    samples=st.integers(1, 40 * SPF),
    sizes=st.lists(st.integers(1, 7000), min_size=1, max_size=4),
    buckets=st.sampled_from([(8,), (8, 4), (16, 8, 2), (5, 3)]),
)
def test_the_feed_cuts_any_pieces_into_the_chunks_the_whole_track_plans(samples, sizes, buckets):
    m = _manifest(*buckets)
    audio = np.random.default_rng(samples).uniform(-1, 1, samples).astype(np.float32)
    fed = list(feed_chunks(m, _split(audio, sizes)))
    assert [(c.bucket, c.frames, c.deliver) for c in fed] == plan_chunks(m, -(-samples // SPF))
    assert [c.first_frame for c in fed] == list(np.cumsum([0] + [c.frames for c in fed])[:-1])
    joined = np.concatenate([c.audio for c in fed])
    assert np.array_equal(joined[:samples], audio) and not joined[samples:].any()  # silence after the end


def test_the_feed_holds_one_chunk_however_long_the_track():
    m = _manifest(8, 4)
    second = np.full(16000, 0.25, np.float32)

    def an_hour():
        for _ in range(3600):
            yield second.copy()

    tracemalloc.start()
    try:
        n = sum(c.deliver for c in feed_chunks(m, an_hour()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 3600 * 25
    assert peak < 200_000, f"peak {peak} bytes feeding an hour (230 MB as one float32 array)"


def test_the_feed_refuses_what_is_not_mono_samples():
    m = _manifest(8)
    with pytest.raises(InputError, match="no samples"):
        list(feed_chunks(m, iter([np.zeros(0, np.float32)])))
    with pytest.raises(InputError, match=r"shape \(10, 2\)"):
        list(feed_chunks(m, [np.zeros((10, 2), np.float32)]))
    with pytest.raises(InputError, match="int16"):
        list(feed_chunks(m, [np.zeros(10, np.int16)]))


def test_a_build_renders_the_same_frames_from_pieces_as_from_one_array():
    build = standin_build()
    image = sample_image(48, 80)
    audio = sample_audio(1.3, sample_rate=16000)  # 32.5 frames: 4 full chunks and a trimmed tail
    whole, report = render(build, image, audio)
    pieces = [c for c in stream(build, image, _split(audio, [999, 16000, 7]))]
    assert np.array_equal(np.concatenate([c.frames for c in pieces]), whole)
    assert whole.shape[0] == 33 == report.frames and len(np.unique(whole[:, 0, 0, 0])) > 3  # audio reached frames
    assert [(c.index, c.bucket, c.first_frame) for c in pieces] == [
        (c.index, c.bucket, c.first_frame) for c in report.chunks
    ]
    assert build.guard.count == 0


def test_render_to_files_writes_every_frame_and_the_track_it_rendered(tmp_path):
    build = standin_build()
    wav = tone(tmp_path / "speech.wav", "-c:a", "pcm_s16le", seconds=2.5, rate=44100)
    audio = request_audio(build.manifest.program, wav)
    assert audio.seconds == pytest.approx(2.5, abs=0.01)
    out, frames = tmp_path / "out.mp4", tmp_path / "frames"
    report, mp4 = render_build_to_files(build, sample_image(48, 80), audio.pieces, out_path=out, frames_dir=frames)
    record = audio.record()
    assert record["samples"] == 40000 and record["container"] == "WAV" and record["source_rate"] == 44100
    assert report.frames == mp4.frames == 63 and len(report.chunks) == 8  # ceil(40000 / 640)
    probe = media.probe_mp4(out)
    assert probe.frames == 63 and probe.audio_codec == "aac" and probe.audio_sample_rate == 16000
    assert sorted(p.name for p in frames.iterdir()) == [f"frame_{i:05d}.png" for i in range(63)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames", "out.mp4", "speech.wav"]  # no scratch left


def test_a_track_past_the_bound_is_refused_from_its_header_before_anything_renders(tmp_path):
    build = standin_build()
    long = tone(tmp_path / "long.flac", "-c:a", "flac", seconds=60, rate=16000)
    with pytest.raises(InputError) as exc:
        request_audio(build.manifest.program, long, max_seconds=10)
    msg = str(exc.value)
    assert str(long) in msg and "60.0 s (from its header)" in msg and "bound of 10 s" in msg
    assert "--seconds 10" in msg and "--max-audio-seconds" in msg


def test_a_track_that_decodes_past_the_bound_stops_the_render_and_leaves_nothing(tmp_path):
    build = standin_build()
    wav = tone(tmp_path / "three.wav", "-c:a", "pcm_s16le", seconds=3, rate=16000)
    audio = request_audio(build.manifest.program, wav, max_seconds=2.5)  # within the header's slack
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous")
    with pytest.raises(InputError, match=r"longer than the bound of 2.5 s \(decoding stopped there\).*--max-audio"):
        render_build_to_files(build, sample_image(48, 80), audio.pieces, out_path=out)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4", "three.wav"]


def test_the_cli_bound_is_the_render_default():
    from avatar_release.cli import cli

    opt = next(p for p in cli.get_command(None, "render").params if p.name == "max_audio_seconds")
    assert opt.default == RENDER_MAX_AUDIO_SECONDS


_CHILD = r"""
import json, resource, sys
from tests.standin_build import standin_build
from avatar_release.serving import render_build_to_files, request_audio
from avatar_release.media import sample_image

build = standin_build()
audio = request_audio(build.manifest.program, sys.argv[1])
report, mp4 = render_build_to_files(build, sample_image(48, 80), audio.pieces, out_path=sys.argv[2])
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "frames": report.frames, "samples": audio.record()["samples"]}))
"""


def _render_peak(tmp_path: Path, seconds: int) -> dict:
    speech = tone(tmp_path / f"speech-{seconds}.flac", "-c:a", "flac", seconds=seconds, rate=16000)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(speech), str(tmp_path / f"out-{seconds}.mp4")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    ).stdout
    return json.loads(out)


@pytest.mark.slow
def test_peak_memory_of_a_render_does_not_grow_with_the_track(tmp_path):
    """Decoder, feed, chunk loop and encoder for real, in a fresh process each; only the stages are
    numpy stand-ins. Held whole, 200 s more audio would be 13 MB of samples and 58 MB of frames."""
    short, long = _render_peak(tmp_path, 20), _render_peak(tmp_path, 220)
    assert (short["frames"], long["frames"]) == (500, 5500) and long["samples"] == 220 * 16000
    assert long["peak_rss_mb"] - short["peak_rss_mb"] < 8, (short, long)
