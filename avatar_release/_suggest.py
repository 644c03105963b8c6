"""Closest names to a mistyped one, for "did you mean" hints (channels, keys, registries, targets).

A name that differs only in case comes first (``Prod`` -> ``prod``), then names the standard
library's sequence matcher rates close (``production`` -> ``prod``, ``dit.stepz`` -> ``dit.steps``),
then names that start with what was typed (``stag`` -> ``staging``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, choices: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` nearest to ``word``, best first (empty when none is near)."""
    pool = sorted(set(choices))
    low = word.lower()
    out = [c for c in pool if c.lower() == low and c != word]
    by_lower = {c.lower(): c for c in pool}
    out += [by_lower[m] for m in difflib.get_close_matches(low, list(by_lower), n=n, cutoff=cutoff)]
    if low:
        out += [c for c in pool if c.lower().startswith(low) or low.startswith(c.lower())]
    seen: list[str] = []
    for c in out:
        if c not in seen and c != word:
            seen.append(c)
    return seen[:n]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'prod'?"`` (or ``'a' or 'b'``), or ``""`` when nothing is close."""
    near = closest(word, choices)
    if not near:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in near) + "?"
