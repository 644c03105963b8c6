"""The deterministic sample inputs, and that they survive our own files exactly."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from avatar_release import media
from avatar_release.gates.metrics import frame_sha256, psnr
from avatar_release.media import samples


def test_sample_image_deterministic_and_variants_differ():
    a = samples.sample_image(48, 80)
    assert a.shape == (48, 80, 3) and a.dtype == np.uint8
    assert frame_sha256(a) == frame_sha256(samples.sample_image(48, 80))
    b = samples.sample_image(48, 80, variant=1)
    assert psnr(a, b) < 20  # clearly different pictures
    assert a.std() > 20  # not a flat image
    assert samples.sample_image(81, 47).shape == (81, 47, 3)


def test_sample_audio_deterministic_and_variants_differ():
    a = samples.sample_audio(2.0, 16000)
    assert a.dtype == np.float32 and a.shape == (32000,)
    assert np.array_equal(a, samples.sample_audio(2.0, 16000))
    assert -1.0 <= a.min() and a.max() <= 1.0 and np.abs(a).max() > 0.5
    b = samples.sample_audio(2.0, 16000, variant=1)
    assert float(np.mean(np.abs(a - b))) > 0.05
    # Speech-like: loud syllables and quiet gaps, not a steady tone.
    frames = np.abs(a[: 32000 // 160 * 160]).reshape(-1, 160).mean(axis=1)
    assert frames.min() < 0.1 * frames.max()


def test_sample_audio_same_in_a_fresh_process():
    code = (
        "import hashlib; from avatar_release.media import samples; "
        "print(hashlib.sha256(samples.sample_audio(1.5, 16000, 2).tobytes()).hexdigest(), "
        "hashlib.sha256(samples.sample_image(48, 80, 1).tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert out == [
        hashlib.sha256(samples.sample_audio(1.5, 16000, 2).tobytes()).hexdigest(),
        hashlib.sha256(samples.sample_image(48, 80, 1).tobytes()).hexdigest(),
    ]


def test_write_samples_same_bytes_twice(tmp_path):
    one = samples.write_samples(tmp_path / "one", height=48, width=80, seconds=1.0, sample_rate=16000)
    two = samples.write_samples(tmp_path / "two", height=48, width=80, seconds=1.0, sample_rate=16000)
    assert one.image.name == "reference.png" and one.audio.name == "speech.wav"
    assert one.image.read_bytes() == two.image.read_bytes()
    assert one.audio.read_bytes() == two.audio.read_bytes()
    assert np.array_equal(media.read_image(one.image, height=48, width=80), samples.sample_image(48, 80))
    # The sample audio survives the WAV round trip exactly.
    assert np.array_equal(media.read_audio(one.audio, sample_rate=16000), samples.sample_audio(1.0, 16000))


def test_the_sample_voice_made_in_blocks_is_the_voice_made_whole():
    """Phase, syllables and the end fade carry across blocks exactly (np.cumsum adds in order)."""
    from avatar_release.media.samples import _Voice

    n, sr = 4000 * 25, 4000
    whole = _Voice(n, sr, 1, 120.0).block(0, n)
    voice = _Voice(n, sr, 1, 120.0)
    blocks = np.concatenate([voice.block(a, min(n, a + 7919)) for a in range(0, n, 7919)])
    assert np.array_equal(blocks, whole)
    assert whole[0] == 0.0 and whole[-1] == 0.0  # the 10 ms fades at both ends


def test_a_long_sample_clip_streams_in_pieces_with_the_same_level():
    from avatar_release.media import NORM_WINDOW_S, PIECE_S, sample_audio_pieces

    pieces = list(sample_audio_pieces(31.0, 4000, 2))
    sizes = [p.size for p in pieces]
    assert sizes[0] == NORM_WINDOW_S * 4000 and set(sizes[1:-1]) == {PIECE_S * 4000} and sum(sizes) == 31 * 4000
    whole = np.concatenate(pieces)
    assert np.array_equal(whole, samples.sample_audio(31.0, 4000, 2))
    assert whole.dtype == np.float32 and np.abs(whole).max() <= 1.0
    assert abs(np.abs(whole[: 10 * 4000]).max() - 0.8) <= 1 / 32767  # levelled on the first window
    assert whole[-1] == 0.0


@pytest.mark.slow
def test_making_a_long_sample_clip_does_not_hold_it_whole():
    """Peak traced memory while streaming 200 s equals that of 40 s: one window, one piece."""
    import tracemalloc

    from avatar_release.media import sample_audio_pieces

    def peak(seconds):
        tracemalloc.start()
        for _ in sample_audio_pieces(seconds, 4000, 0):
            pass
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    short, long = peak(40.0), peak(200.0)
    assert long < 1.1 * short
    assert long < 200 * 4000 * 8  # less than the 200 s clip as one float64 array
