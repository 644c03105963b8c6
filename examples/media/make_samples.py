"""Write the example inputs for a render: a synthetic face (PNG) and a speech-like track (WAV).

Nothing here is a recording or a photograph of anyone. Both files are drawn by the project's own
deterministic generators (``avatar_release.media.sample_image`` and ``sample_audio``: numpy
arithmetic, no randomness), so the same command always gives the same pixels and samples:

    python3 examples/media/make_samples.py            # (re)write face.png and speech.wav here
    python3 examples/media/make_samples.py --check    # exit 1 if the files here differ from that

The picture is 640x480, a webcam-sized landscape shot rather than the pipeline's own size, so a
render shows the ``cover`` fit at work; the track is 4 s of 16-bit mono at 16 kHz (the bundled
pipeline's rate: a render decodes it without resampling). ``--check`` compares decoded pixels
and the WAV's bytes, not the PNG's bytes, because those depend on the zlib that Pillow ships.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from avatar_release.media import encode_wav_bytes, read_image, sample_audio, sample_image, write_png, write_wav

HERE = Path(__file__).resolve().parent
WIDTH, HEIGHT = 640, 480
SECONDS, SAMPLE_RATE = 4.0, 16000
VARIANT = 0  # the generators' first palette and voice


def samples() -> tuple[np.ndarray, np.ndarray]:
    """The picture's (H, W, 3) uint8 pixels and the track's float32 samples."""
    return sample_image(HEIGHT, WIDTH, VARIANT), sample_audio(SECONDS, SAMPLE_RATE, VARIANT)


def write(out: Path) -> list[Path]:
    pixels, audio = samples()
    return [write_png(out / "face.png", pixels), write_wav(out / "speech.wav", audio, SAMPLE_RATE)]


def check(out: Path) -> list[str]:
    """What differs between the files in ``out`` and what :func:`samples` makes (empty: nothing)."""
    pixels, audio = samples()
    problems = []
    face, speech = out / "face.png", out / "speech.wav"
    if not face.is_file() or not np.array_equal(read_image(face), pixels):
        problems.append(f"{face}: not the generated picture")
    if not speech.is_file() or speech.read_bytes() != encode_wav_bytes(audio, SAMPLE_RATE):
        problems.append(f"{speech}: not the generated track")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: this script's)")
    parser.add_argument("--check", action="store_true", help="compare the files there instead of writing them")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("regenerate with: python3 examples/media/make_samples.py", file=sys.stderr)
        return 1 if problems else 0
    for path in write(args.out):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
