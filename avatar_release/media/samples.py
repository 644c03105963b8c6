"""Deterministic sample inputs: a synthetic face picture and a speech-like audio track.

Gates, the CLI's defaults and the docs use these instead of shipping media files. They
are drawn with numpy only, no randomness, and give the same bytes on every run and
machine: the picture uses only +, *, / and sqrt (exactly rounded in IEEE arithmetic), and
the audio, which needs sin, is computed in float64 and snapped to the 16-bit grid
(``k / 32767``), so a last-bit difference between libm implementations cannot change a
sample, and writing it to a WAV and reading it back gives the same float32 values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import InputError
from .audio import write_wav
from .image import write_png

__all__ = [
    "NORM_WINDOW_S",
    "PIECE_S",
    "SampleFiles",
    "sample_audio",
    "sample_audio_pieces",
    "sample_count",
    "sample_image",
    "write_samples",
]

# Colour schemes per variant (background top, background bottom, skin, hair, iris, lips, shirt).
_PALETTES = [
    dict(
        bg_top=(70, 110, 170),
        bg_bottom=(190, 205, 225),
        skin=(232, 190, 160),
        hair=(70, 45, 30),
        iris=(60, 100, 60),
        lips=(185, 80, 85),
        shirt=(40, 70, 120),
    ),
    dict(
        bg_top=(150, 80, 60),
        bg_bottom=(235, 200, 150),
        skin=(165, 115, 85),
        hair=(25, 20, 20),
        iris=(70, 50, 30),
        lips=(140, 60, 60),
        shirt=(120, 40, 50),
    ),
    dict(
        bg_top=(50, 120, 90),
        bg_bottom=(200, 230, 200),
        skin=(245, 215, 195),
        hair=(200, 150, 60),
        iris=(50, 90, 150),
        lips=(200, 100, 110),
        shirt=(60, 60, 60),
    ),
    dict(
        bg_top=(90, 70, 140),
        bg_bottom=(220, 210, 240),
        skin=(200, 150, 115),
        hair=(110, 60, 30),
        iris=(40, 40, 40),
        lips=(170, 70, 70),
        shirt=(200, 170, 60),
    ),
]

# Geometry offsets per variant (face centre shift in x/y, face scale, eye spacing, mouth width).
_GEOMETRY = [
    dict(dx=0.0, dy=0.0, scale=1.0, eye=0.0, mouth=0.0, open=0.0),
    dict(dx=0.06, dy=0.02, scale=0.92, eye=0.02, mouth=-0.02, open=0.015),
    dict(dx=-0.05, dy=-0.02, scale=1.05, eye=-0.015, mouth=0.02, open=0.02),
    dict(dx=0.03, dy=0.03, scale=0.97, eye=0.01, mouth=0.01, open=0.0),
]


def _check_size(height: int, width: int) -> tuple[int, int]:
    try:
        h, w = int(height), int(width)
    except (TypeError, ValueError):
        raise InputError(
            f"sample image: size {width!r}x{height!r}, expected positive integers (width x height)"
        ) from None
    if h < 8 or w < 8:
        raise InputError(f"sample image: size {w}x{h}, expected at least 8x8 (width x height)")
    return h, w


def _variant_index(variant: int) -> int:
    v = int(variant)
    if v < 0:
        raise InputError(f"sample variant {variant}, expected a non-negative integer")
    return v


class _Canvas:
    """Pixel centres in a frame where the shorter side spans [0, 1] (x, y centred), and the two
    operations a sample picture is drawn with: antialiased ellipses and alpha painting."""

    def __init__(self, h: int, w: int):
        unit = float(min(h, w))
        self.ys = (np.arange(h, dtype=np.float64) + 0.5 - h / 2.0) / unit
        xs = (np.arange(w, dtype=np.float64) + 0.5 - w / 2.0) / unit
        self.y, self.x = np.meshgrid(self.ys, xs, indexing="ij")
        self.px = 1.0 / unit  # one pixel in these units

    def ellipse(self, cx: float, cy: float, rx: float, ry: float) -> np.ndarray:
        """Coverage in [0, 1] of an axis-aligned ellipse, antialiased over about a pixel."""
        d = np.sqrt(((self.x - cx) / rx) ** 2 + ((self.y - cy) / ry) ** 2)
        signed = (d - 1.0) * min(rx, ry)  # approximate distance to the edge
        return np.clip(0.5 - signed / self.px, 0.0, 1.0)

    @staticmethod
    def paint(img: np.ndarray, alpha: np.ndarray, colour: np.ndarray) -> None:
        a = alpha[..., None]
        img *= 1.0 - a
        img += a * colour

    def background(self, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
        """A vertical gradient with a faint horizontal tint."""
        ys, px = self.ys, self.px
        t = np.clip((self.y - ys[0]) / max(ys[-1] - ys[0], px), 0.0, 1.0)[..., None]
        img = top * (1.0 - t) + bottom * t
        return img + (self.x[..., None] * 12.0)


def sample_image(height: int, width: int, variant: int = 0) -> np.ndarray:
    """A synthetic face-like (height, width, 3) uint8 RGB picture, the same every time.

    Background gradient, shoulders, hair, a skin-coloured face, two eyes with irises and
    pupils, eyebrows, a nose shadow and a mouth, with soft (antialiased) edges. ``variant``
    changes colours and geometry; variants 0..3 have their own palettes, higher variants
    reuse them with a further shift.
    """
    h, w = _check_size(height, width)
    v = _variant_index(variant)
    pal = {k: np.array(c, dtype=np.float64) for k, c in _PALETTES[v % len(_PALETTES)].items()}
    geo = dict(_GEOMETRY[v % len(_GEOMETRY)])
    extra = v // len(_GEOMETRY)  # higher variants: shift a bit more
    geo["dx"] += 0.02 * extra
    geo["dy"] -= 0.01 * extra
    canvas = _Canvas(h, w)
    img = canvas.background(pal["bg_top"], pal["bg_bottom"])
    _paint_head(canvas, img, pal, geo)
    _paint_features(canvas, img, pal, geo)
    return np.clip(np.floor(img + 0.5), 0.0, 255.0).astype(np.uint8)


def _paint_head(c: _Canvas, img: np.ndarray, pal: dict[str, np.ndarray], geo: dict[str, float]) -> None:
    """Shoulders, neck, hair, ears, the face and the fringe, back to front."""
    s = geo["scale"]
    fx, fy = geo["dx"], 0.02 + geo["dy"]
    frx, fry = 0.24 * s, 0.31 * s
    c.paint(img, c.ellipse(fx, fy + 0.62 * s, 0.48 * s, 0.3 * s), pal["shirt"])  # shoulders / shirt
    c.paint(img, c.ellipse(fx, fy + 0.3 * s, 0.09 * s, 0.16 * s), pal["skin"] * 0.85)  # neck
    c.paint(img, c.ellipse(fx, fy - 0.07 * s, frx * 1.14, fry * 1.02), pal["hair"])  # hair behind the head
    for side in (-1.0, 1.0):  # ears
        c.paint(img, c.ellipse(fx + side * frx * 0.98, fy + 0.01 * s, 0.045 * s, 0.07 * s), pal["skin"] * 0.93)
    c.paint(img, c.ellipse(fx, fy, frx, fry), pal["skin"])  # face
    # Fringe: hair over the forehead, cut by an ellipse so the face shows below it.
    fringe = c.ellipse(fx, fy - 0.24 * s, frx * 1.02, 0.12 * s) * (
        1.0 - c.ellipse(fx, fy + 0.02 * s, frx * 0.95, fry * 0.93)
    )
    c.paint(img, np.clip(fringe * 1.0, 0.0, 1.0), pal["hair"])
    c.paint(img, c.ellipse(fx + 0.02 * s, fy - 0.25 * s, frx * 0.9, 0.07 * s), pal["hair"])


def _paint_features(c: _Canvas, img: np.ndarray, pal: dict[str, np.ndarray], geo: dict[str, float]) -> None:
    """Eyes (white, iris, pupil, brow), the nose's shadow and the mouth."""
    s = geo["scale"]
    fx, fy = geo["dx"], 0.02 + geo["dy"]
    eye_dx = (0.095 + geo["eye"]) * s
    eye_y = fy - 0.04 * s
    for side in (-1.0, 1.0):
        ex = fx + side * eye_dx
        c.paint(img, c.ellipse(ex, eye_y, 0.05 * s, 0.026 * s), np.array([245.0, 245.0, 240.0]))
        c.paint(img, c.ellipse(ex + 0.004 * s, eye_y, 0.022 * s, 0.022 * s), pal["iris"])
        c.paint(img, c.ellipse(ex + 0.004 * s, eye_y, 0.01 * s, 0.01 * s), np.array([15.0, 15.0, 20.0]))
        c.paint(img, c.ellipse(ex, eye_y - 0.052 * s, 0.055 * s, 0.012 * s), pal["hair"] * 0.9)
    c.paint(img, 0.35 * c.ellipse(fx + 0.01 * s, fy + 0.05 * s, 0.025 * s, 0.055 * s), pal["skin"] * 0.7)  # nose
    mouth_y = fy + 0.15 * s
    mrx = (0.085 + geo["mouth"]) * s
    c.paint(img, c.ellipse(fx, mouth_y, mrx, (0.03 + geo["open"]) * s), pal["lips"])
    c.paint(img, c.ellipse(fx, mouth_y, mrx * 0.75, (0.008 + geo["open"]) * s), np.array([70.0, 25.0, 30.0]))


# Vowel formants (F1, F2, F3) in Hz, roughly /a/, /e/, /i/, /o/, /u/.
_VOWELS = np.array(
    [
        [730.0, 1090.0, 2440.0],
        [530.0, 1840.0, 2480.0],
        [270.0, 2290.0, 3010.0],
        [570.0, 840.0, 2410.0],
        [300.0, 870.0, 2240.0],
    ],
    dtype=np.float64,
)


# The level is set from the first NORM_WINDOW_S seconds: a clip up to that long is normalised by
# its own peak (every gate set clip is), a longer one streams without being held whole.
NORM_WINDOW_S = 10.0
PIECE_S = 2.0  # what sample_audio_pieces yields past the first window


def _check_audio_args(seconds: float, sample_rate: int) -> tuple[float, int]:
    try:
        secs = float(seconds)
        sr = int(sample_rate)
    except (TypeError, ValueError):
        raise InputError(f"sample audio: seconds={seconds!r}, sample_rate={sample_rate!r}; expected numbers") from None
    if not secs > 0 or secs != secs or secs == float("inf"):
        raise InputError(f"sample audio: {seconds!r} seconds, expected a positive, finite duration")
    if sr < 4000:
        raise InputError(f"sample audio: sample rate {sample_rate} Hz, expected at least 4000 Hz (e.g. 16000)")
    return secs, sr


class _Voice:
    """The synthesiser's per-sample recipe; `block` renders samples [a, b) before levelling."""

    def __init__(self, n: int, sr: int, v: int, harmonics_fmin: float):
        self.n, self.sr, self.v = n, sr, v
        self.base_f0 = (115.0, 190.0, 145.0, 230.0)[v % 4] * (1.0 + 0.05 * (v // 4))
        self.rate = (4.0, 4.7, 3.4, 5.2)[v % 4]  # syllables per second
        self.phase_off = 0.9 * v
        self.word_len = 4 + (v % 3)
        self.fade = min(n // 2, max(1, sr // 100))  # 10 ms fades: the clip starts and ends at zero
        self.fmin = harmonics_fmin
        self.carry = 0.0  # the running sum of f0 up to the last block (the phase integral)

    def f0(self, t: np.ndarray) -> np.ndarray:
        # Pitch contour: slow declination-like drift plus a faster intonation wobble.
        return self.base_f0 * (
            1.0
            + 0.08 * np.sin(2 * np.pi * 0.35 * t + self.phase_off)
            + 0.04 * np.sin(2 * np.pi * 1.7 * t + 2 * self.phase_off)
        )

    def block(self, a: int, b: int) -> np.ndarray:
        sr, v = self.sr, self.v
        t = np.arange(a, b, dtype=np.float64) / sr
        f0 = self.f0(t)
        # np.cumsum adds in order, so carrying the last sum in front gives the whole clip's sums.
        sums = np.cumsum(np.concatenate(([self.carry], f0)))[1:] if a else np.cumsum(f0)
        self.carry = float(sums[-1])
        phase = 2 * np.pi * sums / sr

        # Syllables and words: syllable k spans [k / rate, (k + 1) / rate); every 4th (+variant) is a pause.
        syl_pos = t * self.rate
        syl = np.floor(syl_pos).astype(np.int64)
        frac = syl_pos - syl
        silent = (syl % (self.word_len + 1)) == self.word_len
        env = np.sin(np.pi * frac) ** 2 * np.where(silent, 0.0, 1.0)
        env *= 0.75 + 0.25 * np.cos(2 * np.pi * 0.23 * t + self.phase_off) ** 2  # stress variation

        vowel = _VOWELS[(syl * 3 + 2 * v + (syl // 5)) % len(_VOWELS)]  # (n, 3)
        bandwidths = np.array([90.0, 110.0, 170.0])
        gains = np.array([1.0, 0.6, 0.3])

        signal = np.zeros(b - a, dtype=np.float64)
        nyquist_guard = 0.45 * sr
        for k in range(1, 41):
            fk = k * f0
            if k * self.fmin >= nyquist_guard:  # inaudible everywhere in the levelling window
                break
            resonance = np.zeros(b - a, dtype=np.float64)
            for j in range(3):
                resonance += gains[j] / (1.0 + ((fk - vowel[:, j]) / bandwidths[j]) ** 2)
            amp = (1.0 / k) * (0.15 + resonance) * (fk < nyquist_guard)
            signal += amp * np.sin(k * phase)

        signal *= env
        ramp = np.arange(self.fade, dtype=np.float64) / self.fade
        head = slice(a, min(b, self.fade))
        if head.start < head.stop:
            signal[head.start - a : head.stop - a] *= ramp[head]
        tail0 = max(a, self.n - self.fade)
        if tail0 < b:
            signal[tail0 - a :] *= ramp[::-1][tail0 - (self.n - self.fade) : b - (self.n - self.fade)]
        return signal


def sample_count(seconds: float, sample_rate: int) -> int:
    """How many samples :func:`sample_audio` makes for ``seconds`` (at least one)."""
    return max(1, int(round(float(seconds) * int(sample_rate))))


def sample_audio_pieces(seconds: float, sample_rate: int = 16000, variant: int = 0) -> Iterator[np.ndarray]:
    """:func:`sample_audio` as float32 pieces, made as they are read: memory does not grow with
    ``seconds`` (the pod's and ``render --seconds``' default speech). The first piece is the
    levelling window (up to ``NORM_WINDOW_S``), then pieces of ``PIECE_S``. Bad arguments are
    refused here, not at the first read."""
    secs, sr = _check_audio_args(seconds, sample_rate)
    return _pieces(sample_count(secs, sr), sr, _variant_index(variant))


def _pieces(n: int, sr: int, v: int) -> Iterator[np.ndarray]:
    w = min(n, int(round(NORM_WINDOW_S * sr)))
    voice = _Voice(n, sr, v, 0.0)
    voice.fmin = float(np.min(voice.f0(np.arange(w, dtype=np.float64) / sr)))  # over the levelling window
    first = voice.block(0, w)
    peak = float(np.max(np.abs(first)))
    scale = 0.8 / peak if peak > 0 else 1.0

    def level(signal: np.ndarray) -> np.ndarray:
        if peak > 0:
            signal = signal * scale
        return (np.round(np.clip(signal, -1.0, 1.0) * 32767.0) / 32767.0).astype(np.float32)

    yield level(first)
    step = max(1, int(round(PIECE_S * sr)))
    for a in range(w, n, step):
        yield level(voice.block(a, min(n, a + step)))


def sample_audio(seconds: float, sample_rate: int = 16000, variant: int = 0) -> np.ndarray:
    """A deterministic speech-like float32 mono signal in [-1, 1], ``seconds`` long.

    A glottal-like harmonic series on a moving pitch contour, shaped by vowel formants
    that change per syllable, under a syllable-rate amplitude envelope with short pauses
    between "words". ``variant`` changes the pitch, the syllable rate and the vowel
    sequence. Peak is about 0.8 (set from the first ``NORM_WINDOW_S`` seconds; clipped at
    1); values lie on the 16-bit grid ``k / 32767``. Streamed: :func:`sample_audio_pieces`.
    """
    pieces = list(sample_audio_pieces(seconds, sample_rate, variant))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


@dataclasses.dataclass(frozen=True)
class SampleFiles:
    """Paths :func:`write_samples` wrote."""

    image: Path
    audio: Path


def write_samples(
    directory: str | os.PathLike,
    *,
    height: int,
    width: int,
    seconds: float,
    sample_rate: int,
    variant: int = 0,
) -> SampleFiles:
    """Write ``reference.png`` and ``speech.wav`` into ``directory`` (created if needed)."""
    out = Path(directory)
    image = write_png(out / "reference.png", sample_image(height, width, variant))
    audio = write_wav(out / "speech.wav", sample_audio(seconds, sample_rate, variant), sample_rate)
    return SampleFiles(image=image, audio=audio)
