"""Fuzzing every decoder: random bytes, and real files (made here) with bytes flipped, cut or
inserted. Only InputError may come out, each example within a deadline, and the whole run
within an address-space limit (so a decoder that allocates for a lying header fails loudly)."""

from __future__ import annotations

import contextlib
import functools
import io
import resource
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from avatar_release import media
from avatar_release.errors import InputError
from avatar_release.media import samples
from tests.media.helpers import adam7_png, encode_still, gradient, tone

# 1 GiB above what the process already maps: a 50 MP decode fits several times over; a decoder
# trusting a header of 60000x60000 (10 GB) does not.
_HEADROOM = 1 << 30


@contextlib.contextmanager
def address_space_limit(headroom: int = _HEADROOM):
    """Lower RLIMIT_AS (this process and the ffmpeg it starts) to current size + headroom."""
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.skip("needs /proc to read the current address-space size")
    vm_kb = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm_kb * 1024 + headroom
    resource.setrlimit(resource.RLIMIT_AS, (min(limit, hard) if hard != resource.RLIM_INFINITY else limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _mutations():
    """(flips as (fraction of length, byte), keep this fraction, bytes inserted at a fraction)."""
    return st.tuples(
        st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=8),
        st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.1]),
        st.tuples(st.floats(0, 1), st.binary(max_size=16)),
    )


def _mutate(data: bytes, mutation) -> bytes:
    flips, keep, (at, inserted) = mutation
    b = bytearray(data)
    for where, value in flips:
        b[min(int(where * len(b)), len(b) - 1)] = value
    b = b[: max(1, int(len(b) * keep))]
    i = int(at * len(b))
    return bytes(b[:i] + inserted + b[i:])


# ---------------------------------------------------------------------------------- images


@functools.lru_cache(maxsize=1)
def _image_corpus() -> list[bytes]:
    from PIL import Image

    rgb = gradient(24, 40)
    wide = (rgb.astype(np.uint16) * 257).astype(">u2")
    buf_prog, buf_exif = io.BytesIO(), io.BytesIO()
    Image.fromarray(rgb).save(buf_prog, format="JPEG", progressive=True)
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.fromarray(rgb).save(buf_exif, format="JPEG", exif=exif)
    npy = io.BytesIO()
    np.save(npy, rgb)
    return [
        media.encode_png(rgb),
        adam7_png(rgb),
        encode_still(wide.tobytes(), "rgb48be", 40, 24, "png"),
        encode_still(rgb.tobytes(), "rgb24", 40, 24, "png", "-pix_fmt", "pal8"),
        encode_still(rgb.tobytes(), "rgb24", 40, 24, "mjpeg"),
        buf_prog.getvalue(),
        buf_exif.getvalue(),
        encode_still(rgb.tobytes(), "rgb24", 40, 24, "libwebp"),
        encode_still(rgb.tobytes(), "rgb24", 40, 24, "libwebp", "-lossless", "1"),
        npy.getvalue(),
    ]


def _decode_image(data: bytes, fit: str) -> None:
    try:
        out = media.load_image_bytes(data, height=48, width=80, fit=fit, where="fuzz")
    except InputError:
        return
    assert out.pixels.shape == (48, 80, 3) and out.pixels.dtype == np.uint8


_IMAGE_MAGIC = [b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"\x93NUMPY\x01\x00"]
_IMAGE_SETTINGS = settings(
    max_examples=150, deadline=timedelta(seconds=2), database=None, suppress_health_check=[HealthCheck.too_slow]
)


@_IMAGE_SETTINGS
@given(magic=st.sampled_from(_IMAGE_MAGIC), tail=st.binary(max_size=600), fit=st.sampled_from(media.FIT_RULES))
def test_image_decoder_on_random_bytes(magic, tail, fit):
    with address_space_limit():
        _decode_image(magic + tail, fit)


@_IMAGE_SETTINGS
@given(which=st.integers(0, 9), mutation=_mutations(), fit=st.sampled_from(media.FIT_RULES))
def test_image_decoder_on_mutated_real_files(which, mutation, fit):
    data = _mutate(_image_corpus()[which], mutation)
    with address_space_limit():
        _decode_image(data, fit)


# ---------------------------------------------------------------------------------- audio


@functools.lru_cache(maxsize=1)
def _audio_corpus() -> list[bytes]:
    import tempfile

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        out.append(media.encode_wav_bytes(samples.sample_audio(0.3, 22050), 22050))
        for name, opts in [
            ("a.mp3", ["-c:a", "libmp3lame"]),
            ("a.flac", ["-c:a", "flac"]),
            ("a.ogg", ["-c:a", "libvorbis"]),
            ("a.m4a", ["-c:a", "aac"]),
            ("a.webm", ["-ar", "48000", "-c:a", "libopus"]),
        ]:
            out.append(tone(d / name, *opts, seconds=0.3).read_bytes())
    return out


_AUDIO_MAGIC = [
    b"RIFF\x24\x00\x00\x00WAVEfmt ",
    b"fLaC",
    b"OggS\x00\x02",
    b"ID3\x04\x00\x00\x00\x00\x00\x00",
    b"\xff\xfb\x90\x00",
    b"\xff\xf1\x50\x80",
    b"\x00\x00\x00\x20ftypM4A ",
    b"\x1aE\xdf\xa3",
    b"FORM\x00\x00\x00\x00AIFF",
]
_AUDIO_SETTINGS = settings(
    max_examples=30, deadline=timedelta(seconds=5), database=None, suppress_health_check=[HealthCheck.too_slow]
)


def _decode_audio(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "fuzz.bin"
    p.write_bytes(data)
    try:
        x = media.stream_audio(p, sample_rate=16000, max_seconds=5).read()
    except InputError:
        return
    assert x.dtype == np.float32 and 0 < x.size <= 5 * 16000 and np.all(np.abs(x) <= 1.0)


@_AUDIO_SETTINGS
@given(magic=st.sampled_from(_AUDIO_MAGIC), tail=st.binary(max_size=400))
def test_audio_decoder_on_random_bytes(tmp_path_factory, magic, tail):
    with address_space_limit():
        _decode_audio(tmp_path_factory.mktemp("fuzz"), magic + tail)


@_AUDIO_SETTINGS
@given(which=st.integers(0, 5), mutation=_mutations())
def test_audio_decoder_on_mutated_real_files(tmp_path_factory, which, mutation):
    data = _mutate(_audio_corpus()[which], mutation)
    with address_space_limit():
        _decode_audio(tmp_path_factory.mktemp("fuzz"), data)


def test_the_address_space_limit_catches_a_big_allocation():
    """The harness itself: inside the limit, asking for 4 GiB fails instead of succeeding."""
    with address_space_limit(), pytest.raises(MemoryError):
        np.ones(4 << 30, np.uint8)
