"""MP4 out through the bundled ffmpeg: H.264 + AAC, every frame kept, atomic, refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from avatar_release import media
from avatar_release.errors import InputError
from avatar_release.gates.metrics import psnr
from avatar_release.media import samples


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ---------------------------------------------------------------------------------- MP4


def _moving_frames(n: int, height: int, width: int) -> np.ndarray:
    base = samples.sample_image(height, width)
    return np.stack([np.roll(base, i, axis=1) for i in range(n)])


def test_write_mp4_h264_with_aac_audio(tmp_path):
    frames = _moving_frames(20, 48, 80)
    audio = samples.sample_audio(0.8, 16000)
    path = tmp_path / "out.mp4"
    info = media.write_mp4(path, frames, fps=25, audio=audio, sample_rate=16000)
    assert info.path == path and info.frames == 20
    assert math.isclose(info.seconds, 0.8)
    assert info.bytes == path.stat().st_size > 0
    probe = media.probe_mp4(path)
    assert probe.video_codec == "h264"
    assert probe.audio_codec == "aac"
    assert (probe.width, probe.height) == (80, 48)
    assert probe.fps == 25
    assert probe.frames == 20
    assert probe.duration == pytest.approx(0.8, abs=0.1)
    decoded = media.read_mp4_frames(path)
    assert decoded.shape == frames.shape
    assert psnr(decoded[5], frames[5]) > 30  # looks like the input
    assert _listing(tmp_path) == ["out.mp4"]


def test_write_mp4_audio_shorter_or_longer_keeps_every_frame(tmp_path):
    frames = _moving_frames(12, 48, 80)
    for seconds in (0.1, 3.0):
        path = tmp_path / f"a{seconds}.mp4"
        media.write_mp4(path, frames, fps=24, audio=samples.sample_audio(seconds, 16000), sample_rate=16000)
        probe = media.probe_mp4(path)
        assert probe.frames == 12 and probe.audio_codec == "aac"
        assert probe.duration == pytest.approx(0.5, abs=0.1)


def test_mp4_writer_takes_frames_and_samples_as_they_come(tmp_path):
    """Chunk by chunk, as a render makes them: the same file as writing everything at once."""
    frames = _moving_frames(20, 48, 80)
    audio = samples.sample_audio(0.8, 16000)
    media.write_mp4(tmp_path / "whole.mp4", frames, fps=25, audio=audio, sample_rate=16000)
    with media.Mp4Writer(tmp_path / "parts.mp4", fps=25, sample_rate=16000) as writer:
        for i in range(0, 20, 8):
            writer.add_audio(audio[i * 640 : (i + 8) * 640])
            writer.add_frames(frames[i : i + 8])
        info = writer.finish()
    assert info.frames == 20 and info.seconds == 0.8
    assert (tmp_path / "parts.mp4").read_bytes() == (tmp_path / "whole.mp4").read_bytes()
    assert _listing(tmp_path) == ["parts.mp4", "whole.mp4"]


def test_mp4_writer_left_unfinished_leaves_nothing_behind(tmp_path):
    path = tmp_path / "keep.mp4"
    path.write_bytes(b"previous")
    with media.Mp4Writer(path, fps=25, sample_rate=16000) as writer:
        writer.add_audio(np.zeros(16000, np.float32))
        writer.add_frames(np.zeros((3, 16, 16, 3), np.uint8))
        assert len(_listing(tmp_path)) == 3  # the output, and the video and samples being written beside it
    assert path.read_bytes() == b"previous" and _listing(tmp_path) == ["keep.mp4"]
    with pytest.raises(InputError, match="audio given without sample_rate"):
        with media.Mp4Writer(tmp_path / "silent.mp4", fps=25) as writer:
            writer.add_audio(np.zeros(10, np.float32))
    with pytest.raises(InputError, match="peak amplitude"):
        with media.Mp4Writer(tmp_path / "loud.mp4", fps=25, sample_rate=16000) as writer:
            writer.add_audio(np.full(4, 2.0, np.float32))
    assert _listing(tmp_path) == ["keep.mp4"]


def test_write_mp4_odd_size_from_a_generator(tmp_path):
    frames = _moving_frames(7, 81, 47)
    path = tmp_path / "odd.mp4"
    info = media.write_mp4(path, (f for f in frames), fps=10)
    assert info.frames == 7
    probe = media.probe_mp4(path)
    assert probe.video_codec == "h264" and probe.audio_codec is None
    assert probe.frames == 7
    assert (probe.width, probe.height) == (48, 82)  # padded to even by repeating the edge
    decoded = media.read_mp4_frames(path)
    assert psnr(decoded[3, :81, :47], frames[3]) > 30


def test_write_mp4_inconsistent_frames_leave_nothing(tmp_path):
    def frames():
        yield np.zeros((48, 80, 3), np.uint8)
        yield np.zeros((48, 80, 3), np.uint8)
        yield np.zeros((40, 80, 3), np.uint8)

    path = tmp_path / "bad.mp4"
    with pytest.raises(InputError) as exc:
        media.write_mp4(path, frames(), fps=25, audio=np.zeros(1600, np.float32), sample_rate=16000)
    assert "frame 2" in str(exc.value) and "(40, 80, 3)" in str(exc.value)
    assert not path.exists()
    assert _listing(tmp_path) == []


def test_write_mp4_failure_keeps_previous_file(tmp_path):
    path = tmp_path / "keep.mp4"
    path.write_bytes(b"previous")

    def frames():
        yield np.zeros((16, 16, 3), np.uint8)
        raise RuntimeError("renderer crashed")

    with pytest.raises(RuntimeError, match="renderer crashed"):
        media.write_mp4(path, frames(), fps=25)
    assert path.read_bytes() == b"previous"
    with pytest.raises(media.MediaError, match="ffmpeg"):
        media.write_mp4(path, np.zeros((2, 16, 16, 3), np.uint8), fps=25, preset="no-such-preset")
    assert path.read_bytes() == b"previous"
    assert _listing(tmp_path) == ["keep.mp4"]


def test_write_mp4_rejects_bad_input(tmp_path):
    path = tmp_path / "x.mp4"
    with pytest.raises(InputError, match="no frames"):
        media.write_mp4(path, [], fps=25)
    with pytest.raises(InputError, match="float32.*uint8"):
        media.write_mp4(path, np.zeros((2, 8, 8, 3), np.float32), fps=25)
    with pytest.raises(InputError, match="fps"):
        media.write_mp4(path, np.zeros((2, 8, 8, 3), np.uint8), fps=0)
    with pytest.raises(InputError, match="sample_rate"):
        media.write_mp4(path, np.zeros((2, 8, 8, 3), np.uint8), fps=25, audio=np.zeros(10, np.float32))
    assert not path.exists()


def test_write_mp4_to_an_unwritable_place_is_an_input_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(InputError, match="cannot write"):
        media.write_mp4(tmp_path / "a-file" / "out.mp4", np.zeros((2, 16, 16, 3), np.uint8), fps=25)
    with pytest.raises(InputError, match="is a directory"):
        media.write_mp4(tmp_path, np.zeros((2, 16, 16, 3), np.uint8), fps=25)
