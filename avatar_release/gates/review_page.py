"""The blind review page and the frames it shows.

The page is package data (``review_page.html``): its ``{{name}}`` slots are filled here, each
value escaped for where it goes. Nothing on the page tells the sides apart: pairs are neutral
"left" and "right" images, drawn in the sealed order.
"""

from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from importlib.resources import files

import numpy as np

from ..errors import NotFoundError
from ..records import GateResult, ReviewRecord
from ..registry import Registry
from .report import png_data_uri
from .review_order import unseal_order
from .store import get_frames, get_result, result_refs

__all__ = ["review_frames", "review_page"]

_SLOT = re.compile(r"\{\{(\w+)\}\}")


def review_frames(registry: Registry, review: ReviewRecord) -> tuple[np.ndarray, np.ndarray]:
    """(candidate frames, baseline frames) of the reviewed pairs, from the stored gate runs."""
    refs = {r.digest: r for r in result_refs(registry, review.build_id)}
    if review.gate_result_digest not in refs:
        raise NotFoundError(f"review of {review.build_id}: gate result {review.gate_result_digest} is gone")
    result = get_result(registry, refs[review.gate_result_digest])
    cand = get_frames(registry, result.frames_blob)
    base_res = _baseline_result(registry, result)
    base = get_frames(registry, base_res.frames_blob)
    return cand[review.frames], base[review.frames]


def _baseline_result(registry: Registry, result: GateResult) -> GateResult:
    b = result.baseline
    assert b is not None  # a review opens only below the band, which is measured against a baseline
    for ref in result_refs(registry, b.build_id):
        if ref.digest == b.gate_result_digest:
            return get_result(registry, ref)
    raise NotFoundError(f"baseline gate result {b.gate_result_digest} of {b.build_id} not found")


def review_page(review: ReviewRecord, cand: np.ndarray, base: np.ndarray) -> str:
    """The blind page: pairs as neutral left/right images, no hint of which is the candidate.

    Needs the order, so only the seal key's holder (the gate machine, the review server) renders it."""
    left_is_candidate, _ = unseal_order(review)
    pairs = []
    for k, cand_left in enumerate(left_is_candidate):
        left, right = (cand[k], base[k]) if cand_left else (base[k], cand[k])
        pairs.append({"left": png_data_uri(left), "right": png_data_uri(right)})
    slots = {
        "pair_count": str(len(pairs)),
        "serve_command": html.escape(f"avatar-release review {review.build_id} --serve"),
        "build_id": html.escape(review.build_id),
        "pairs_json": json.dumps(pairs),  # data: URIs only; inside <script type='application/json'>
    }
    # One pass: a filled-in value is never scanned for slots itself.
    return _SLOT.sub(lambda m: slots[m.group(1)], _template())


@lru_cache(maxsize=1)
def _template() -> str:
    return files(__package__).joinpath("review_page.html").read_text(encoding="utf-8")
