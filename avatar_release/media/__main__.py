"""``python -m avatar_release.media``: see a picture or a speech track the way a render reads it.

    python -m avatar_release.media image IN OUT.png --size 1280x720 [--fit cover|contain|exact]
    python -m avatar_release.media audio IN OUT.wav [--rate 16000] [--seconds N]

``image`` decodes, orients and fits the picture exactly as ``avatar-release render`` does and
writes the result as PNG; ``audio`` decodes, downmixes and resamples the track exactly as a
render does (keeping the first ``--seconds``) and writes a 16-bit mono WAV. Both print what
they read as JSON. Errors exit 2 (bad input) or 9 (ffmpeg failed), like the CLI.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import AvatarReleaseError, InputError
from .audio import DEFAULT_MAX_AUDIO_SECONDS, stream_audio, write_wav
from .image import DEFAULT_FIT, DEFAULT_MAX_PIXELS, FIT_RULES, load_image, write_png


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT, e.g. 1280x720") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected positive width and height")
    return w, h


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m avatar_release.media", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    img = sub.add_parser("image", help="decode, orient and fit a picture; write it as PNG")
    img.add_argument("src")
    img.add_argument("out")
    img.add_argument("--size", type=_size, required=True, help="the pipeline's WIDTHxHEIGHT, e.g. 1280x720")
    img.add_argument("--fit", choices=FIT_RULES, default=DEFAULT_FIT)
    img.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    aud = sub.add_parser("audio", help="decode a speech track to mono at a rate; write it as 16-bit WAV")
    aud.add_argument("src")
    aud.add_argument("out")
    aud.add_argument("--rate", type=int, default=16000, help="sample rate in Hz (default 16000)")
    aud.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"keep only the first N seconds (default: all, up to {DEFAULT_MAX_AUDIO_SECONDS:g} s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.what == "image":
            w, h = args.size
            loaded = load_image(args.src, height=h, width=w, fit=args.fit, max_pixels=args.max_pixels)
            write_png(args.out, loaded.pixels)
            report = {"out": args.out, "fit": loaded.fit.to_json()}
        else:
            cut = args.seconds is not None
            stream = stream_audio(
                args.src, sample_rate=args.rate, cut=cut, max_seconds=args.seconds if cut else DEFAULT_MAX_AUDIO_SECONDS
            )
            write_wav(args.out, stream.read(), args.rate)
            if stream.source is None:  # pragma: no cover - read() completes a pass or raises
                raise InputError(f"audio {args.src}: decoding did not finish")
            report = {"out": args.out, "audio": stream.source.to_json()}
    except AvatarReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
