"""Media I/O (PNG, WAV, MP4) and the deterministic samples: what a user would notice."""

from __future__ import annotations

import hashlib
import math
import struct
import subprocess
import sys
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest

from avatar_release import media, samples
from avatar_release.errors import InputError


def _gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x * y) % 256], -1).astype(np.uint8)


def _ffmpeg_png(raw: np.ndarray, pix_fmt: str, pred: str = "mixed") -> bytes:
    """Encode with ffmpeg's own PNG encoder: an independent writer for the reader tests."""
    h, w = raw.shape[:2]
    res = subprocess.run(
        [media.ffmpeg_exe(), "-v", "error", "-f", "rawvideo", "-pix_fmt", pix_fmt, "-s", f"{w}x{h}",
         "-i", "-", "-frames:v", "1", "-c:v", "png", "-pred", pred, "-pix_fmt", pix_fmt, "-f", "image2pipe", "-"],
        input=raw.tobytes(), capture_output=True, check=True,
    )
    return res.stdout


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ---------------------------------------------------------------------------------- PNG


def test_png_round_trip_is_bit_exact(tmp_path):
    img = samples.sample_image(48, 80)
    path = tmp_path / "face.png"
    media.write_png(path, img)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    back = media.read_png(path)
    assert back.dtype == np.uint8 and back.shape == (48, 80, 3)
    assert np.array_equal(back, img)
    assert _listing(tmp_path) == ["face.png"]  # no temp file left behind


def test_written_png_is_readable_by_ffmpeg(tmp_path):
    img = _gradient(21, 35)
    path = tmp_path / "g.png"
    media.write_png(path, img)
    res = subprocess.run(
        [media.ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True, check=True,
    )
    assert np.array_equal(np.frombuffer(res.stdout, np.uint8).reshape(21, 35, 3), img)


@pytest.mark.parametrize("pred", ["none", "sub", "up", "avg", "paeth", "mixed"])
def test_read_png_decodes_every_filter_type(tmp_path, pred):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)
    src[:, :8] = _gradient(13, 8)  # smooth part too
    path = tmp_path / "x.png"
    path.write_bytes(_ffmpeg_png(src, "rgb24", pred))
    assert np.array_equal(media.read_png(path), src)


def test_read_rgba_png_drops_alpha(tmp_path):
    rgba = np.concatenate([_gradient(10, 12), np.full((10, 12, 1), 77, np.uint8)], axis=2)
    rgba[0, 0, 3] = 0
    path = tmp_path / "rgba.png"
    path.write_bytes(_ffmpeg_png(rgba, "rgba"))
    img = media.read_image(path, height=10, width=12)
    assert img.shape == (10, 12, 3)
    assert np.array_equal(img, rgba[:, :, :3])


def test_read_gray_png_repeats_channel(tmp_path):
    gray = _gradient(9, 11)[:, :, 0].copy()
    path = tmp_path / "gray.png"
    path.write_bytes(_ffmpeg_png(gray, "gray"))
    img = media.read_image(path, height=9, width=11)
    assert img.shape == (9, 11, 3)
    for c in range(3):
        assert np.array_equal(img[:, :, c], gray)


def test_read_image_rejects_wrong_size_naming_file_and_sizes(tmp_path):
    path = tmp_path / "a.png"
    media.write_png(path, np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(InputError) as exc:
        media.read_image(path, height=48, width=80, pipeline="tiny")
    msg = str(exc.value)
    assert str(path) in msg
    assert "64x64" in msg and "80x48" in msg
    assert "tiny" in msg and "resize" in msg


def _patch_ihdr(png: bytes, *, depth: int | None = None, interlace: int | None = None) -> bytes:
    start = 8
    length = struct.unpack(">I", png[start : start + 4])[0]
    body = bytearray(png[start + 8 : start + 8 + length])
    if depth is not None:
        body[8] = depth
    if interlace is not None:
        body[12] = interlace
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(body)) & 0xFFFFFFFF)
    return png[: start + 8] + bytes(body) + crc + png[start + 12 + length :]


def test_read_png_rejects_unsupported_kinds_with_a_fix(tmp_path):
    good = media.encode_png(_gradient(4, 4))
    cases = {
        "16.png": (_ffmpeg_png(np.zeros((4, 4, 3), ">u2"), "rgb48be"), "16-bit"),
        "pal.png": (_ffmpeg_png(np.zeros((4, 4), np.uint8), "pal8"), "palette"),
        "interlaced.png": (_patch_ihdr(good, interlace=1), "interlaced"),
        "crc.png": (good[:40] + bytes([good[40] ^ 0xFF]) + good[41:], "CRC"),
        "notpng.png": (b"GIF89a not a png", "not a PNG"),
    }
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InputError) as exc:
            media.read_image(path, height=4, width=4)
        assert str(path) in str(exc.value), name
        assert words in str(exc.value), (name, str(exc.value))


def test_read_image_npy_and_errors(tmp_path):
    img = _gradient(6, 5)
    np.save(tmp_path / "ok.npy", img)
    assert np.array_equal(media.read_image(tmp_path / "ok.npy", height=6, width=5), img)
    np.save(tmp_path / "rgba.npy", np.concatenate([img, np.zeros((6, 5, 1), np.uint8)], 2))
    assert np.array_equal(media.read_image(tmp_path / "rgba.npy", height=6, width=5), img)
    np.save(tmp_path / "float.npy", img.astype(np.float32) / 255)
    with pytest.raises(InputError, match="float32.*uint8"):
        media.read_image(tmp_path / "float.npy", height=6, width=5)
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    with pytest.raises(InputError, match="JPEG.*png"):
        media.read_image(tmp_path / "photo.jpg", height=6, width=5)
    with pytest.raises(InputError, match="not found"):
        media.read_image(tmp_path / "missing.png", height=6, width=5)


# ---------------------------------------------------------------------------------- WAV


def test_wav_round_trip_within_one_lsb(tmp_path):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1, 1, 4000), [-1.0, 1.0, 0.0]]).astype(np.float32)
    path = tmp_path / "a.wav"
    media.write_wav(path, x, 16000)
    with wave.open(str(path)) as wf:
        assert (wf.getnchannels(), wf.getsampwidth(), wf.getframerate()) == (1, 2, 16000)
    y = media.read_wav(path, sample_rate=16000)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert float(np.max(np.abs(y - x))) <= 1 / 32767
    assert y.min() >= -1.0 and y.max() <= 1.0
    assert _listing(tmp_path) == ["a.wav"]


def test_wav_wrong_sample_rate_names_both_rates(tmp_path):
    path = tmp_path / "hi.wav"
    media.write_wav(path, np.zeros(441, np.float32) + 0.1, 44100)
    with pytest.raises(InputError) as exc:
        media.read_wav(path, sample_rate=16000)
    msg = str(exc.value)
    assert str(path) in msg and "44100" in msg and "16000" in msg and "ffmpeg" in msg and "-ar 16000" in msg


def test_wav_stereo_is_downmixed(tmp_path):
    left = np.full(100, 16000, np.int16)
    right = np.full(100, -8000, np.int16)
    path = tmp_path / "st.wav"
    with wave.open(str(path), "wb") as wf:
        wf.setnchannels(2)
        wf.setsampwidth(2)
        wf.setframerate(16000)
        wf.writeframes(np.stack([left, right], 1).astype("<i2").tobytes())
    y = media.read_wav(path, sample_rate=16000)
    assert y.shape == (100,)
    assert np.allclose(y, 4000 / 32767, atol=1e-6)


def test_wav_empty_and_8bit_are_rejected(tmp_path):
    empty = tmp_path / "empty.wav"
    with wave.open(str(empty), "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(16000)
    with pytest.raises(InputError, match="no samples"):
        media.read_wav(empty, sample_rate=16000)
    eight = tmp_path / "8bit.wav"
    with wave.open(str(eight), "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(1)
        wf.setframerate(16000)
        wf.writeframes(bytes(range(100)))
    with pytest.raises(InputError, match="8-bit.*16-bit"):
        media.read_wav(eight, sample_rate=16000)


def test_check_audio():
    ok = np.zeros(16000, np.float32)
    assert media.check_audio(ok, sample_rate=16000, min_seconds=0.5, max_seconds=2).dtype == np.float32
    with pytest.raises(InputError, match="at least 2"):
        media.check_audio(ok, sample_rate=16000, min_seconds=2)
    with pytest.raises(InputError, match="at most 0.5"):
        media.check_audio(ok, sample_rate=16000, max_seconds=0.5)
    with pytest.raises(InputError, match="no samples"):
        media.check_audio(np.zeros(0, np.float32), sample_rate=16000)
    with pytest.raises(InputError, match="NaN"):
        media.check_audio(np.array([0.0, np.nan]), sample_rate=16000)
    with pytest.raises(InputError, match="peak"):
        media.check_audio(np.array([0.0, 1.5]), sample_rate=16000)
    with pytest.raises(InputError, match="mono"):
        media.check_audio(np.zeros((10, 2)), sample_rate=16000)


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
    assert media.psnr(decoded[5], frames[5]) > 30  # looks like the input
    assert _listing(tmp_path) == ["out.mp4"]


def test_write_mp4_audio_shorter_or_longer_keeps_every_frame(tmp_path):
    frames = _moving_frames(12, 48, 80)
    for seconds in (0.1, 3.0):
        path = tmp_path / f"a{seconds}.mp4"
        media.write_mp4(path, frames, fps=24, audio=samples.sample_audio(seconds, 16000), sample_rate=16000)
        probe = media.probe_mp4(path)
        assert probe.frames == 12 and probe.audio_codec == "aac"
        assert probe.duration == pytest.approx(0.5, abs=0.1)


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
    assert media.psnr(decoded[3, :81, :47], frames[3]) > 30


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


# ------------------------------------------------------------------------- comparisons


def test_frame_sha256_and_psnr():
    a = samples.sample_image(32, 32)
    assert media.frame_sha256(a) == hashlib.sha256(a.tobytes()).hexdigest()
    assert media.frame_sha256(np.asfortranarray(a)) == media.frame_sha256(a)  # layout does not matter
    b = a.copy()
    b[0, 0, 0] ^= 1
    assert media.frame_sha256(b) != media.frame_sha256(a)
    assert media.psnr(a, a) == math.inf
    assert media.max_abs_diff(a, a) == 0
    assert 60 < media.psnr(a, b) < math.inf
    noisy = np.clip(a.astype(np.int16) + 20, 0, 255).astype(np.uint8)
    assert media.psnr(a, noisy) < media.psnr(a, b)
    assert media.max_abs_diff(a, b) == 1
    assert media.max_abs_diff(np.zeros(3, np.uint8), np.full(3, 255, np.uint8)) == 255  # no uint8 wrap
    with pytest.raises(InputError, match="shapes differ"):
        media.psnr(a, a[:10])


# ----------------------------------------------------------------------------- samples


def test_sample_image_deterministic_and_variants_differ():
    a = samples.sample_image(48, 80)
    assert a.shape == (48, 80, 3) and a.dtype == np.uint8
    assert media.frame_sha256(a) == media.frame_sha256(samples.sample_image(48, 80))
    b = samples.sample_image(48, 80, variant=1)
    assert media.psnr(a, b) < 20  # clearly different pictures
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
        "import hashlib; from avatar_release import samples; "
        "print(hashlib.sha256(samples.sample_audio(1.5, 16000, 2).tobytes()).hexdigest(), "
        "hashlib.sha256(samples.sample_image(48, 80, 1).tobytes()).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
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
    assert np.array_equal(media.read_wav(one.audio, sample_rate=16000), samples.sample_audio(1.0, 16000))


def test_media_modules_import_no_torch_or_jax():
    code = (
        "import sys; import avatar_release.media, avatar_release.samples; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'jaxlib', 'torchax', 'PIL', 'imageio_ffmpeg')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    assert out == ""
