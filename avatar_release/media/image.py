"""Reference pictures in, PNG frames out; any photo fitted to the pipeline's resolution.

Decoding goes through Pillow, not a hand-written decoder: Pillow wraps libjpeg-turbo, zlib
and libwebp, which are fast (a 1080p PNG in milliseconds rather than seconds), read every
PNG variant (16-bit, palette, interlaced, gray, alpha), JPEG and WebP, and are fuzzed by
their own projects. What we add is the policy around it:

* only three decoders are reachable (``Image.open(..., formats=("PNG", "JPEG", "WEBP"))``),
  so a file cannot pick one of Pillow's rarer plugins;
* the pixel count is read from the header and checked against ``max_pixels`` (50 MP by
  default) *before* any pixel is decoded; Pillow's own decompression-bomb limit is set to
  ``MAX_PIXELS_CEILING`` as a second wall, and its warning is an error here;
* EXIF orientation is applied (``ImageOps.exif_transpose``) so a phone photo stands up;
* 16-bit samples keep their high byte, palettes are expanded, gray is repeated into three
  channels, alpha is dropped (the colour stored under it is kept);
* the result is fitted to the pipeline's size by one declared rule (``FIT_RULES``) and one
  declared resampler (``FIT_RESAMPLE``, below), and the rule, the crop box and where it landed
  are returned as an :class:`ImageFit` for the render report.

The resampler (``FIT_RESAMPLE``), in three steps, each deterministic (integer arithmetic in
libjpeg-turbo and Pillow; box coordinates from integer rules):

1. a JPEG much larger than what it must fill is decoded at 1/2, 1/4 or 1/8 of its size by
   libjpeg's DCT scaling (``Image.draft``): the largest of these that divides the picture's
   size exactly and still leaves the box ``REDUCING_GAP`` times the pixels it fills;
2. the box is cut out (``crop``), or block-averaged in one pass (``Image.reduce(box=...)``,
   which reads only the box) while it stays ``REDUCING_GAP`` times the target;
3. BICUBIC on 8-bit RGB maps the exact box onto the target.

Nothing outside the box reaches the output (with DCT scaling, less than one decoded pixel,
itself an average of a block that straddles the box's edge). BICUBIC rather than LANCZOS: on a
1080p photo fitted to 1280x720 it is 48.7 dB from an exact float Lanczos (LANCZOS: 52.6 dB;
both far past what an eye sees) for two thirds of the resampling time. Measured
(``benchmarks/bench_media.py``, 2 cores, CPU time): 1080p JPEG to 1280x720 ~40-46 ms (was 56),
to 80x48 ~10 ms (was 28); a 1080p PNG to 1280x720 ~65-75 ms (was 87): its decode alone, zlib
inflating 3.8 MB, is ~38 ms, which leaves no Pillow resampler that filters (BOX 10 ms, BILINEAR
14, BICUBIC 22) inside a 50 ms budget.

Every failure is an InputError naming the file, what was found, what is accepted and a fix.
"""

from __future__ import annotations

import dataclasses
import io
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, MediaError
from ._files import PathLike, describe_head, input_file, write_output
from ._geometry import REDUCING_GAP, jpeg_scale, regions
from ._npy import NPY_MAGIC, npy_header, npy_rgb

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = [
    "ACCEPTED_IMAGES",
    "DEFAULT_FIT",
    "DEFAULT_MAX_PIXELS",
    "FIT_RULES",
    "FIT_RESAMPLE",
    "MAX_PIXELS_CEILING",
    "ImageFit",
    "LoadedImage",
    "encode_png",
    "fit_image",
    "load_image",
    "load_image_bytes",
    "read_image",
    "write_png",
]

FIT_RULES = ("cover", "contain", "exact")
DEFAULT_FIT = "cover"
# How the fitted picture is resampled: recorded in the render report and the gate set digest.
# (Before 2026-12-01: "pillow-lanczos-rgb8", LANCZOS after a crop copy, no reducing gap, no DCT scaling.)
FIT_RESAMPLE = "pillow-bicubic-rgb8+reduce-gap-3+jpeg-dct-scale"
# Reduce (DCT scaling, block averaging) only while the box stays this many times its target.
# Pillow's documentation: from 3.0 the result is indistinguishable from a fair resample.
# 50 MP: a 48 MP phone photo fits; decoded as 8-bit RGB it is 150 MB.
DEFAULT_MAX_PIXELS = 50_000_000
# The largest bound a caller may ask for, and Pillow's own bomb limit (it refuses above twice
# this in Image.open and warns above it; the warning is an error here).
MAX_PIXELS_CEILING = 100_000_000
ACCEPTED_IMAGES = "JPEG, PNG (8/16-bit, gray, palette, alpha, interlaced), WebP, or a .npy uint8 array"

_PIL_FORMATS = ("PNG", "JPEG", "WEBP")
# (oriented width, oriented height) of a picture -> the DCT scale to decode it at (1, 2, 4, 8).
ScaleFor = Callable[[int, int], int]
_SAVE_AS = "save it as PNG or JPEG (any image viewer's Export / Save As does it)"
_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")
# Pixel modes Pillow's PNG/JPEG/WebP decoders produce that mean "colour or gray, maybe alpha".
_TO_RGB_MODES = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"}


@dataclasses.dataclass(frozen=True)
class ImageFit:
    """How a picture became the pipeline's input: what was read and the rule that fitted it.

    ``box`` is the region of the (oriented) source that was resampled, ``placed`` the region
    of the output it fills; outside ``placed`` the output is black (``contain`` only).
    ``decode_scale`` is 2, 4 or 8 when a JPEG was decoded at that fraction of its size (the
    box is still in full-size source pixels).
    """

    rule: str
    source_format: str  # "PNG", "JPEG", "WEBP", "NPY" or "array"
    source_size: tuple[int, int]  # (width, height) after EXIF orientation
    target_size: tuple[int, int]  # (width, height)
    box: tuple[int, int, int, int]  # (left, top, right, bottom) in source pixels
    placed: tuple[int, int, int, int]  # (left, top, right, bottom) in output pixels
    resample: str  # FIT_RESAMPLE, or "none" when the source already had the target size
    orientation: int = 1  # EXIF orientation applied (1: none)
    decode_scale: int = 1  # the JPEG was decoded at 1/decode_scale by DCT scaling

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "source_format": self.source_format,
            "source_size": list(self.source_size),
            "target_size": list(self.target_size),
            "box": list(self.box),
            "placed": list(self.placed),
            "resample": self.resample,
            "orientation": self.orientation,
            "decode_scale": self.decode_scale,
        }


@dataclasses.dataclass(frozen=True)
class LoadedImage:
    pixels: np.ndarray  # (H, W, 3) uint8 RGB at the target size
    fit: ImageFit


def _pillow() -> ModuleType:
    """Pillow, imported on first use, with its decompression-bomb limit set to our ceiling."""
    # Lazy (heavy): Pillow loads on the first picture; the media room imports numpy only.
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS_CEILING
    return Image


def _check_max_pixels(max_pixels: int) -> int:
    mp = int(max_pixels)
    if not 0 < mp <= MAX_PIXELS_CEILING:
        raise InputError(
            f"max_pixels {max_pixels}: expected 1 to {MAX_PIXELS_CEILING} ({MAX_PIXELS_CEILING / 1e6:g} MP)"
        )
    return mp


def _too_many_pixels(where: str, found: str, pixels: int, max_pixels: int) -> InputError:
    fix = "export a smaller copy (the pipeline fits any size to its own resolution, so e.g. 4000x3000 loses nothing)"
    if pixels <= MAX_PIXELS_CEILING:  # within what may be allowed for one picture: the converter can
        fix += (
            f", or fit it once with a higher bound: python -m avatar_release.media image {where} fitted.png "
            f"--size <pipeline WIDTHxHEIGHT> --max-pixels {pixels}, and render fitted.png"
        )
    return InputError(
        f"image {where}: {found}, more than the bound of {max_pixels / 1e6:g} MP ({max_pixels} pixels); {fix}"
    )


def _check_fit_rule(rule: str) -> str:
    if rule not in FIT_RULES:
        raise InputError(f"fit rule {rule!r}: expected one of {', '.join(FIT_RULES)}")
    return rule


# ------------------------------------------------------------------------------- decoding


def _to_rgb(im: PILImage, where: str) -> PILImage:
    """Any mode the three decoders produce -> an 8-bit RGB Pillow image."""
    mode = im.mode
    if mode.startswith("I;16"):  # 16-bit gray: keep the high byte, as Pillow does for 16-bit RGB
        gray = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
        return _pillow().fromarray(np.repeat(gray[:, :, None], 3, axis=2))
    if mode not in _TO_RGB_MODES:
        raise InputError(f"image {where}: pixel mode {mode!r} is not supported, expected {ACCEPTED_IMAGES}; {_SAVE_AS}")
    if mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # expands the palette's alpha too, then dropped below
    return im if im.mode == "RGB" else im.convert("RGB")


def _exif_orientation(im: PILImage) -> int:
    try:
        orientation = int(im.getexif().get(0x0112, 1))
    except Exception:  # unreadable EXIF is ignored, not fatal: the pixels are fine
        return 1
    return orientation if orientation in range(2, 9) else 1


def _draft(im: PILImage, scale_for: ScaleFor | None) -> int:
    """Have libjpeg decode at 1/s of the size when ``scale_for`` allows it; return s (1: full size)."""
    if scale_for is None or im.format != "JPEG":
        return 1
    width, height = im.size
    sideways = _exif_orientation(im) in (5, 6, 7, 8)  # EXIF sits before the scan: known before decoding
    s = scale_for(height, width) if sideways else scale_for(width, height)
    if s == 1:
        return 1
    im.draft(None, (width // s, height // s))
    if im.size != (width // s, height // s):  # s divides both sides, so Pillow picks exactly s
        raise MediaError(f"Pillow decoded a {width}x{height} JPEG at {im.size}, expected 1/{s} of it")
    return s


def _decode_pil(
    fp: IO[bytes], where: str, max_pixels: int, head: bytes, scale_for: ScaleFor | None = None
) -> tuple[PILImage, str, int, int]:
    """Open with three decoders only, check the header's size, decode (a JPEG at the scale
    ``scale_for`` picks from its oriented full size), orient.

    Returns (8-bit RGB Pillow image, format name, EXIF orientation applied, decode scale).
    """
    Image = _pillow()
    # Lazy (heavy): Pillow loads on the first picture; the media room imports numpy only.
    from PIL import ImageOps, UnidentifiedImageError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's notes about odd metadata are not failures
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(fp, formats=_PIL_FORMATS) as im:
                fmt = im.format or "?"
                width, height = im.size
                if width * height > max_pixels:  # header only: nothing decoded yet
                    raise _too_many_pixels(
                        where, f"{fmt} of {width}x{height} = {width * height / 1e6:.1f} MP", width * height, max_pixels
                    )
                scale = _draft(im, scale_for)
                im.load()
                orientation = _exif_orientation(im)
                if orientation != 1:
                    im = ImageOps.exif_transpose(im)
                rgb = _to_rgb(im, where)
                rgb.load()
        except (InputError, MediaError, MemoryError):  # MemoryError: a bound that failed, not a bad file
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            m = _BOMB_PIXELS.search(str(exc))
            pixels = int(m.group(1)) if m else MAX_PIXELS_CEILING + 1
            found = f"{pixels / 1e6:.1f} MP in its header" if m else "a header over Pillow's limit"
            raise _too_many_pixels(where, found, pixels, max_pixels) from None
        except UnidentifiedImageError:
            found = describe_head(head)
            if found in ("a PNG image", "a JPEG image", "a WebP image"):  # ours, but its header is broken
                raise InputError(
                    f"image {where}: starts like {found} but its header cannot be read; the file is damaged "
                    "or truncated; re-export it as PNG or JPEG"
                ) from None
            raise InputError(f"image {where}: found {found}, expected {ACCEPTED_IMAGES}; {_SAVE_AS}") from None
        except Exception as exc:  # any decoder failure on a damaged file is bad input, not a crash
            raise InputError(
                f"image {where}: cannot decode it ({type(exc).__name__}: {exc}); the file is damaged or "
                f"truncated; re-export it as PNG or JPEG"
            ) from None
    return rgb, fmt, orientation, scale


def _decode_npy(data: bytes, where: str, max_pixels: int) -> np.ndarray:
    """A .npy uint8 array, its shape checked from the header before anything is allocated."""
    shape, fortran, offset = npy_header(data, where)
    if shape[0] * shape[1] > max_pixels:
        raise _too_many_pixels(
            where,
            f".npy of {shape[1]}x{shape[0]} = {shape[0] * shape[1] / 1e6:.1f} MP",
            shape[0] * shape[1],
            max_pixels,
        )
    return npy_rgb(data[offset:], shape, fortran, where)


def _decode(
    data_or_path: bytes | Path, where: str, max_pixels: int, scale_for: ScaleFor | None = None
) -> tuple[PILImage | np.ndarray, str, int, int]:
    """(Pillow RGB image or uint8 array, format, orientation, decode scale) from bytes or a file."""
    if isinstance(data_or_path, Path):
        p = input_file(data_or_path, "image")
        try:
            with open(p, "rb") as fh:
                head = fh.read(64)
                if head.startswith(NPY_MAGIC):
                    return _decode_npy(head + fh.read(), where, max_pixels), "NPY", 1, 1
                fh.seek(0)
                return _decode_pil(fh, where, max_pixels, head, scale_for)
        except OSError as exc:
            raise InputError(f"image {where}: cannot read ({exc.strerror or exc})") from exc
    data = bytes(data_or_path)
    if not data:
        raise InputError(f"image {where}: no bytes (empty image); expected {ACCEPTED_IMAGES}")
    if data.startswith(NPY_MAGIC):
        return _decode_npy(data, where, max_pixels), "NPY", 1, 1
    return _decode_pil(io.BytesIO(data), where, max_pixels, data[:64], scale_for)


# ------------------------------------------------------------------------------- fitting


def _resample(img: PILImage, box: tuple[int, int, int, int], scale: int, size: tuple[int, int]) -> PILImage:
    """The ``box`` of the source (decoded at 1/``scale``) resampled to ``size``, reading no pixel
    outside the box: outside it only by less than one decoded pixel when ``scale`` > 1, where a
    decoded pixel is already the average of a scale x scale block.

    Steps: the region (the box, on the decoded grid) is cut out, or block-averaged by
    ``Image.reduce`` in one pass while it stays ``REDUCING_GAP`` times the target; then
    BICUBIC maps the exact (float) box onto ``size``.
    """
    Image = _pillow()
    if scale > 1:  # the smallest region of decoded pixels holding the box
        region = (box[0] // scale, box[1] // scale, -(-box[2] // scale), -(-box[3] // scale))
        exact: tuple[float, float, float, float] = (
            box[0] / scale - region[0],
            box[1] / scale - region[1],
            box[2] / scale - region[0],
            box[3] / scale - region[1],
        )
    else:
        region, exact = box, (0, 0, box[2] - box[0], box[3] - box[1])
    fx = int((exact[2] - exact[0]) / size[0] / REDUCING_GAP) or 1  # Pillow's own reducing_gap rule
    fy = int((exact[3] - exact[1]) / size[1] / REDUCING_GAP) or 1
    if fx > 1 or fy > 1:
        src = img.reduce((fx, fy), box=region)  # reads the region only, and copies nothing else
        exact = (exact[0] / fx, exact[1] / fy, exact[2] / fx, exact[3] / fy)
    else:
        src = img if region == (0, 0, *img.size) else img.crop(region)
    return src.resize(size, Image.Resampling.BICUBIC, box=exact)


def _check_target(tw: int, th: int, where: str) -> tuple[int, int]:
    tw, th = int(tw), int(th)
    if tw <= 0 or th <= 0:
        raise InputError(f"image {where}: target size {tw}x{th}, expected positive width and height")
    return tw, th


def _fit(
    img: PILImage | np.ndarray,
    fmt: str,
    orientation: int,
    *,
    height: int,
    width: int,
    rule: str,
    where: str,
    pipeline: str | None,
    scale: int = 1,
) -> LoadedImage:
    """Fit a decoded picture (``scale``: decoded at 1/scale of its size) to ``width`` x ``height``."""
    (dh, dw) = img.shape[:2] if isinstance(img, np.ndarray) else img.size[::-1]
    w, h = dw * scale, dh * scale  # the source's own size, in which the record is written
    tw, th = _check_target(width, height, where)
    full = (0, 0, w, h)
    if (w, h) == (tw, th):  # already the pipeline's size: every rule is the identity (and no Pillow)
        fit = ImageFit(rule, fmt, (w, h), (tw, th), full, (0, 0, tw, th), "none", orientation)
        return LoadedImage(np.array(img, dtype=np.uint8), fit)
    if rule == "exact":
        for_pipeline = f" for pipeline '{pipeline}'" if pipeline else ""
        raise InputError(
            f"image {where}: {fmt} of {w}x{h}, expected exactly {tw}x{th} (width x height){for_pipeline} "
            "with --fit exact; use --fit cover (scale and centre-crop, the default) or --fit contain "
            "(scale to fit and letterbox) to take any size"
        )
    Image = _pillow()
    pil = Image.fromarray(img) if isinstance(img, np.ndarray) else img
    box, placed = regions(rule, w, h, tw, th)
    pw, ph = placed[2] - placed[0], placed[3] - placed[1]
    out = _resample(pil, box, scale, (pw, ph))
    if (pw, ph) != (tw, th):  # contain: centred on black
        inner, out = out, Image.new("RGB", (tw, th), (0, 0, 0))
        out.paste(inner, placed[:2])
    fit = ImageFit(rule, fmt, (w, h), (tw, th), box, placed, FIT_RESAMPLE, orientation, scale)
    return LoadedImage(np.array(out, dtype=np.uint8), fit)


def fit_image(
    rgb: np.ndarray, *, height: int, width: int, rule: str = DEFAULT_FIT, where: str = "image"
) -> tuple[np.ndarray, ImageFit]:
    """Fit an (H, W, 3) uint8 array to ``width`` x ``height`` by ``rule``: (pixels, record).

    ``cover``: scale so the target is filled and centre-crop the excess (the crop box is the
    largest centred region with the target's aspect ratio). ``contain``: scale so the whole
    picture fits and centre it on black. ``exact``: refuse any other size. A picture that
    already has the target size is returned unchanged by every rule.
    """
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or 0 in arr.shape:
        raise InputError(f"{where}: {arr.dtype} {tuple(arr.shape)}, expected (height, width, 3) uint8 RGB")
    res = _fit(
        np.ascontiguousarray(arr),
        "array",
        1,
        height=height,
        width=width,
        rule=_check_fit_rule(rule),
        where=where,
        pipeline=None,
    )
    return res.pixels, res.fit


def _load(
    src: bytes | Path, where: str, *, height: int, width: int, fit: str, pipeline: str | None, max_pixels: int
) -> LoadedImage:
    rule, mp = _check_fit_rule(fit), _check_max_pixels(max_pixels)
    tw, th = _check_target(width, height, where)
    img, fmt, orientation, scale = _decode(src, where, mp, lambda w, h: jpeg_scale(rule, w, h, tw, th))
    return _fit(img, fmt, orientation, height=th, width=tw, rule=rule, where=where, pipeline=pipeline, scale=scale)


def load_image(
    path: PathLike,
    *,
    height: int,
    width: int,
    fit: str = DEFAULT_FIT,
    pipeline: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> LoadedImage:
    """Read a reference picture and fit it to ``width`` x ``height``: pixels and the fit record."""
    return _load(Path(path), str(path), height=height, width=width, fit=fit, pipeline=pipeline, max_pixels=max_pixels)


def load_image_bytes(
    data: bytes,
    *,
    height: int,
    width: int,
    fit: str = DEFAULT_FIT,
    where: str = "<bytes>",
    pipeline: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> LoadedImage:
    """:func:`load_image` for bytes already in memory (an HTTP request body)."""
    return _load(data, where, height=height, width=width, fit=fit, pipeline=pipeline, max_pixels=max_pixels)


def read_image(
    path: PathLike,
    *,
    height: int | None = None,
    width: int | None = None,
    fit: str = DEFAULT_FIT,
    pipeline: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """A picture as (H, W, 3) uint8 RGB: at its own size, or fitted when ``height``/``width`` are given."""
    if height is None and width is None:
        img, _, _, _ = _decode(Path(path), str(path), _check_max_pixels(max_pixels))
        return np.array(img, dtype=np.uint8)
    if height is None or width is None:
        raise InputError(f"image {path}: give both height and width to fit it, or neither")
    return load_image(path, height=height, width=width, fit=fit, pipeline=pipeline, max_pixels=max_pixels).pixels


# ------------------------------------------------------------------------------- writing


def encode_png(rgb: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as an 8-bit RGB PNG (bytes)."""
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8:
        raise InputError(
            f"image: dtype {arr.dtype}, expected uint8 RGB; convert it, e.g. "
            "numpy.clip(x * 255, 0, 255).round().astype(numpy.uint8) for floats in [0, 1]"
        )
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"image: shape {tuple(arr.shape)}, expected (height, width, 3) RGB")
    buf = io.BytesIO()
    # Level 6 with Pillow's adaptive filters: small files, and the same bytes on every run.
    _pillow().fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def write_png(path: PathLike, rgb: np.ndarray) -> Path:
    """Write an (H, W, 3) uint8 array to ``path`` as an 8-bit RGB PNG, atomically."""
    return write_output(path, encode_png(rgb))
