"""Where a picture's pixels go when it is fitted to the pipeline's size: integer rules only.

The crop box of ``cover``, the placement of ``contain`` and the JPEG DCT scale to decode at are
computed in integers (no float in a rule), so the same photo lands on the same pixels on every
machine; :mod:`.image` does the decoding and resampling around them.
"""

from __future__ import annotations

__all__ = ["cover_box", "contain_placed", "regions", "jpeg_scale", "REDUCING_GAP", "JPEG_SCALES"]

REDUCING_GAP = 3.0  # a box this many times the pixels it fills is reduced before it is resampled
JPEG_SCALES = (8, 4, 2)

Box = tuple[int, int, int, int]


def round_div(a: int, b: int) -> int:
    return (2 * a + b) // (2 * b)  # a / b rounded half up, in integers: no float in the rule


def cover_box(w: int, h: int, tw: int, th: int) -> tuple[int, int, int, int]:
    """The largest centred region of a w x h source with the target's aspect ratio."""
    if w * th > tw * h:  # source is wider: full height, crop the sides
        cw, ch = max(1, min(w, round_div(h * tw, th))), h
    else:  # source is taller (or the same shape): full width, crop top and bottom
        cw, ch = w, max(1, min(h, round_div(w * th, tw)))
    left, top = (w - cw) // 2, (h - ch) // 2
    return left, top, left + cw, top + ch


def contain_placed(w: int, h: int, tw: int, th: int) -> tuple[int, int, int, int]:
    """Where the whole source lands, scaled to fit inside the target and centred."""
    if w * th > tw * h:
        pw, ph = tw, max(1, min(th, round_div(h * tw, w)))
    else:
        pw, ph = max(1, min(tw, round_div(w * th, h))), th
    left, top = (tw - pw) // 2, (th - ph) // 2
    return left, top, left + pw, top + ph


def regions(rule: str, w: int, h: int, tw: int, th: int) -> tuple[Box, Box]:
    """(box in the source, placed in the output) for a w x h source and a tw x th target."""
    if rule == "cover":
        return cover_box(w, h, tw, th), (0, 0, tw, th)
    return (0, 0, w, h), contain_placed(w, h, tw, th)  # contain


def jpeg_scale(rule: str, w: int, h: int, tw: int, th: int) -> int:
    """The DCT scale to decode a w x h (oriented) JPEG at: the largest of 8, 4, 2 that divides
    both sides (so the scaled picture is exactly 1/s of the source and the box scales with no
    rounding) and leaves the box at least ``REDUCING_GAP`` times the size it fills; else 1."""
    if rule == "exact" or (w, h) == (tw, th):
        return 1
    box, placed = regions(rule, w, h, tw, th)
    bw, bh, pw, ph = box[2] - box[0], box[3] - box[1], placed[2] - placed[0], placed[3] - placed[1]
    for s in JPEG_SCALES:
        if w % s == 0 and h % s == 0 and bw >= REDUCING_GAP * s * pw and bh >= REDUCING_GAP * s * ph:
            return s
    return 1
