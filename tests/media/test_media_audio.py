"""Speech tracks: every accepted format decoded to mono at the pipeline's rate by one pinned
resampler, the same samples every time, streamed in bounded memory, refused clearly."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import tracemalloc
import wave
from pathlib import Path

import numpy as np
import pytest

from avatar_release import media
from avatar_release.errors import InputError
from avatar_release.media import samples
from tests.media.helpers import tone

ROOT = Path(__file__).resolve().parents[2]

# sha256 of the float32 samples of samples.sample_audio(1.0, 44100) written by write_wav at
# 44.1 kHz and decoded to 16 kHz. It moves only if the decoder, the resampler options or the
# bundled ffmpeg change: each of those changes what a render hears, so that must be seen here.
PINNED_44K1_TO_16K = "sha256:d537c990df0eb6fdcfaeb07e9ee4deea546a78745984ea95ad0eebc130cbb583"


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum) * rate / x.size)


# ---------------------------------------------------------------------------------- determinism


def test_our_wav_at_the_pipeline_rate_reads_back_exactly(tmp_path):
    a = samples.sample_audio(1.0, 16000)
    media.write_wav(tmp_path / "s.wav", a, 16000)
    with wave.open(str(tmp_path / "s.wav")) as wf:
        assert (wf.getnchannels(), wf.getsampwidth(), wf.getframerate()) == (1, 2, 16000)
    back = media.read_audio(tmp_path / "s.wav", sample_rate=16000)
    assert back.dtype == np.float32 and np.array_equal(back, a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.wav"]


def test_44k1_to_16k_gives_pinned_samples(tmp_path):
    path = tmp_path / "s44.wav"
    media.write_wav(path, samples.sample_audio(1.0, 44100), 44100)
    loaded = media.load_audio(path, sample_rate=16000)
    assert loaded.samples.shape == (16000,)
    digest = "sha256:" + hashlib.sha256(loaded.samples.astype("<f4").tobytes()).hexdigest()
    assert loaded.source.sha256 == digest == PINNED_44K1_TO_16K
    assert (loaded.source.container, loaded.source.codec, loaded.source.source_rate) == ("WAV", "pcm_s16le", 44100)
    # The resampled speech is still the speech: compare with the generator run at 16 kHz.
    direct = samples.sample_audio(1.0, 16000)
    assert np.corrcoef(loaded.samples[200:-200], direct[200:-200])[0, 1] > 0.99


def test_same_samples_in_a_fresh_process(tmp_path):
    path = tone(tmp_path / "t.mp3", "-ac", "2", "-c:a", "libmp3lame")
    code = (
        "import sys; from avatar_release import media; "
        "print(media.load_audio(sys.argv[1], sample_rate=16000).source.sha256)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert out == media.load_audio(path, sample_rate=16000).source.sha256


# ---------------------------------------------------------------------------------- formats


FORMATS = [  # (file name, ffmpeg output options, container, codec)
    ("a.mp3", ["-ac", "2", "-c:a", "libmp3lame"], "MP3", "mp3"),
    ("a.m4a", ["-ac", "2", "-c:a", "aac"], "MP4/M4A", "aac"),
    ("a.aac", ["-c:a", "aac", "-f", "adts"], "AAC (ADTS)", "aac"),
    ("a.flac", ["-ac", "2", "-c:a", "flac"], "FLAC", "flac"),
    ("a.ogg", ["-c:a", "libvorbis"], "Ogg", "vorbis"),
    ("a.opus", ["-ar", "48000", "-c:a", "libopus"], "Ogg", "opus"),
    ("a.webm", ["-ar", "48000", "-c:a", "libopus"], "WebM/Matroska", "opus"),
    ("a.aiff", ["-c:a", "pcm_s16be"], "AIFF", "pcm_s16be"),
    ("f32.wav", ["-c:a", "pcm_f32le"], "WAV", "pcm_f32le"),
    ("s24.wav", ["-ar", "48000", "-c:a", "pcm_s24le"], "WAV", "pcm_s24le"),
    ("u8.wav", ["-ar", "8000", "-c:a", "pcm_u8"], "WAV", "pcm_u8"),
    ("surround.wav", ["-af", "pan=5.1|c0=c0|c1=c0|c2=c0|c3=c0|c4=c0|c5=c0", "-c:a", "pcm_s16le"], "WAV", "pcm_s16le"),
    ("id3.mp3", ["-c:a", "libmp3lame", "-id3v2_version", "3", "-metadata", "title=" + "x" * 3000], "MP3", "mp3"),
]


@pytest.mark.parametrize("name,opts,container,codec", FORMATS, ids=[f[0] for f in FORMATS])
def test_every_accepted_format_decodes_to_the_same_tone(tmp_path, name, opts, container, codec):
    path = tone(tmp_path / name, *opts, seconds=1.0, freq=440)
    loaded = media.load_audio(path, sample_rate=16000)
    x, src = loaded.samples, loaded.source
    assert x.dtype == np.float32 and x.ndim == 1
    assert (src.container, src.codec, src.sample_rate) == (container, codec, 16000)
    assert 0.95 <= src.seconds <= 1.1, src.seconds  # codec padding, at most a frame or two
    assert abs(_peak_hz(x[1600:14400], 16000) - 440) < 5  # the tone survived decode + resample
    assert 0.02 < float(np.abs(x).max()) <= 1.0


def test_stereo_is_downmixed_to_the_mean(tmp_path):
    path = tmp_path / "st.wav"
    with wave.open(str(path), "wb") as wf:
        wf.setnchannels(2)
        wf.setsampwidth(2)
        wf.setframerate(16000)
        wf.writeframes(np.stack([np.full(1000, 16000, "<i2"), np.full(1000, -8000, "<i2")], 1).tobytes())
    y = media.read_audio(path, sample_rate=16000)
    assert y.shape == (1000,) and np.all(y == np.float32(4000 / 32767))


def test_the_audio_of_a_video_file_is_read(tmp_path):
    video = tmp_path / "clip.mp4"
    media.write_mp4(
        video, np.zeros((10, 16, 16, 3), np.uint8), fps=25, audio=samples.sample_audio(0.4, 16000), sample_rate=16000
    )
    loaded = media.load_audio(video, sample_rate=16000)
    assert loaded.source.container == "MP4/M4A" and loaded.source.codec == "aac"
    assert 0.35 < loaded.source.seconds < 0.5


# ---------------------------------------------------------------------------------- streaming and bounds


def test_streaming_holds_a_chunk_not_the_file(tmp_path):
    path = tone(tmp_path / "long.flac", "-c:a", "flac", seconds=300, rate=16000)
    stream = media.stream_audio(path, sample_rate=16000, chunk_seconds=1.0)
    tracemalloc.start()
    try:
        count = n = 0
        for chunk in stream:
            count += chunk.size
            n += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 300 * 16000 and n == 300
    whole = count * 4  # 19.2 MB as one float32 array
    assert peak < 1_000_000, f"peak {peak} bytes while decoding {whole} bytes of samples"
    assert stream.source is not None and stream.source.samples == count


def test_too_long_is_refused_with_a_fix_and_cut_keeps_the_start(tmp_path):
    path = tone(tmp_path / "three.wav", "-c:a", "pcm_s16le", seconds=3, rate=16000)
    with pytest.raises(InputError) as exc:
        media.read_audio(path, sample_rate=16000, max_seconds=1)
    msg = str(exc.value)
    assert str(path) in msg and "longer than the bound of 1 s" in msg and "WAV" in msg
    assert "python -m avatar_release.media audio" in msg and "ffmpeg -" not in msg
    kept = media.stream_audio(path, sample_rate=16000, max_seconds=1, cut=True).read()
    assert kept.shape == (16000,)
    assert np.array_equal(kept, media.read_audio(path, sample_rate=16000)[:16000])


def test_stopping_early_ends_the_decoder(tmp_path):
    path = tone(tmp_path / "t.flac", "-c:a", "flac", seconds=30, rate=16000)
    before = set(_children())  # the worker's own, started by earlier tests (a registry server, a browser)
    stream = media.stream_audio(path, sample_rate=16000)
    chunks = iter(stream)
    first = list(itertools.islice(chunks, 2))
    (decoder,) = set(_children()) - before  # ffmpeg is running, paused on a full pipe
    assert "ffmpeg" in Path(f"/proc/{decoder}/cmdline").read_text()
    chunks.close()  # what a consumer that stops early does (or the garbage collector for it)
    assert set(_children()) - before == set() and [c.size for c in first] == [16000, 16000] and stream.source is None


def _children() -> list[str]:
    """Live (not zombie) child processes of this process, from /proc."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids += (task / "children").read_text().split()
    return [
        p
        for p in pids
        if Path(f"/proc/{p}/stat").exists() and Path(f"/proc/{p}/stat").read_text().split(") ")[-1][:1] != "Z"
    ]


def test_refusals_say_what_was_found_and_what_is_accepted(tmp_path):
    png = tmp_path / "face.png"
    media.write_png(png, np.zeros((4, 4, 3), np.uint8))
    playlist = tmp_path / "list.m3u8"
    playlist.write_text(f"#EXTM3U\n#EXTINF:1,\nfile://{png}\n")
    cases = {png: "found a PNG image", playlist: "found an M3U playlist", tmp_path / "notes.wav": "found text"}
    (tmp_path / "notes.wav").write_text("just some words")
    for path, words in cases.items():
        with pytest.raises(InputError) as exc:
            media.read_audio(path, sample_rate=16000)
        msg = str(exc.value)
        assert str(path) in msg and words in msg and "MP3" in msg and "FLAC" in msg, msg
        assert "ffmpeg" not in msg
    silent_video = tmp_path / "silent.mp4"
    media.write_mp4(silent_video, np.zeros((3, 16, 16, 3), np.uint8), fps=25)
    with pytest.raises(InputError, match="no audio stream"):
        media.read_audio(silent_video, sample_rate=16000)
    damaged = tmp_path / "damaged.flac"
    damaged.write_bytes(b"fLaC" + bytes(200))
    with pytest.raises(InputError, match="cannot decode this FLAC"):
        media.read_audio(damaged, sample_rate=16000)
    empty = tmp_path / "empty.wav"
    with wave.open(str(empty), "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(16000)
    with pytest.raises(InputError, match="no samples"):
        media.read_audio(empty, sample_rate=16000)
    with pytest.raises(InputError, match="not found"):
        media.read_audio(tmp_path / "missing.mp3", sample_rate=16000)
    with pytest.raises(InputError, match="empty"):
        media.read_audio(_touch(tmp_path / "zero.mp3"), sample_rate=16000)


def _touch(p: Path) -> Path:
    p.write_bytes(b"")
    return p


def test_audio_bytes_from_a_request(tmp_path):
    data = tone(tmp_path / "r.mp3", "-c:a", "libmp3lame", seconds=0.5).read_bytes()
    loaded = media.load_audio_bytes(data, sample_rate=16000, where="request audio")
    assert loaded.source.path == "request audio" and 0.45 < loaded.source.seconds < 0.6
    with pytest.raises(InputError) as exc:
        media.load_audio_bytes(b"GIF89a....", sample_rate=16000, where="request audio")
    assert str(exc.value).startswith("audio request audio: found a GIF image")


# ---------------------------------------------------------------------------------- WAV out, checks


def test_wav_round_trip_within_one_lsb(tmp_path):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1, 1, 4000), [-1.0, 1.0, 0.0]]).astype(np.float32)
    media.write_wav(tmp_path / "a.wav", x, 16000)
    y = media.read_audio(tmp_path / "a.wav", sample_rate=16000)
    assert y.shape == x.shape and float(np.max(np.abs(y - x))) <= 1 / 32767
    assert y.min() >= -1.0 and y.max() <= 1.0


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


def test_the_converter_writes_what_a_render_would_read(tmp_path):
    src = tone(tmp_path / "in.m4a", "-ac", "2", "-c:a", "aac", seconds=2)
    out = tmp_path / "out.wav"
    res = subprocess.run(
        [sys.executable, "-m", "avatar_release.media", "audio", str(src), str(out), "--seconds", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert np.array_equal(
        media.read_audio(out, sample_rate=16000),
        media.stream_audio(src, sample_rate=16000, max_seconds=1, cut=True).read(),
    )
    bad = subprocess.run(
        [sys.executable, "-m", "avatar_release.media", "audio", str(tmp_path / "nope.mp3"), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "not found" in bad.stderr
