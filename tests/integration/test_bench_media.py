"""benchmarks/bench_media.py keeps working: its smoke mode (a 320x180 picture, a 4 s track) decodes
and fits pictures, decodes an MP3 to 16 kHz mono in fresh processes, refuses a bomb's header and,
in the slow lane, renders the track and two copies of it end to end through the stand-in stages."""

from __future__ import annotations

import pytest

from tests.helpers import run_smoke


def _smoke(tmp_path, *extra: str) -> dict:
    return run_smoke("bench_media.py", *extra, out=tmp_path / "media.json", timeout=300)


def test_smoke_mode_decodes_pictures_and_speech_and_refuses_the_bomb(tmp_path):
    doc = _smoke(tmp_path, "--no-render")
    pic = doc["picture"]
    assert pic["source"] == "320x180" and set(pic["files"]) == {"p.jpg", "p.png", "p-paeth.png"}
    for f in pic["files"].values():
        assert f["bytes"] > 0
        assert all(f[k]["wall_ms"] > 0 for k in ("decode_fit_720p_ms", "decode_fit_80x48_ms", "decode_no_resize_ms"))
    speech = doc["mp3_to_16k_mono"]
    assert speech["stream"]["samples"] == speech["read"]["samples"] == 4 * 16000  # streamed or whole: every sample
    assert speech["stream"]["ffmpeg_peak_rss_mb"] > 0
    assert doc["bomb"]["header"] == "60000x60000" and 0 < doc["bomb"]["refused_ms"]["wall_ms"] < 1000
    assert "render_feed" not in doc


@pytest.mark.slow  # two fresh rendering processes: ~7 s
def test_smoke_mode_renders_a_track_and_twice_it_in_about_the_same_memory(tmp_path):
    feed = _smoke(tmp_path)["render_feed"]
    short, long = feed["short"], feed["long"]
    assert feed["copies"] == 2 and short["chunks"] > 0 and short["mp4_mb"] > 0
    assert 1.8 < feed["ratio_long_to_short"]["frames"] < 2.2  # twice the audio, twice the frames
    assert long["python_peak_rss_mb"] > 0 and feed["ratio_long_to_short"]["python_peak_rss_mb"] < 1.5
