"""The band's reference frames from the reference build's own gate verdict, when one proves them.

A band is measured against the reference's gate-set frames, rendered twice in fresh processes so a
non-deterministic reference is refused. A passing gate of that build has already done exactly this:
its twins rendered the gate set in two fresh processes and were identical, and its frames are stored
with the verdict. ``stored_reference`` finds such a verdict, read as every decision reads gate
results (signed by a key the trust policy accepts for the build's target, for this manifest:
``verdicts.signed_verdicts``), on the same gate set and on a machine with this one's environment
fingerprint (jax, jaxlib, backend, device kind and count, the CPU's instruction-set features), so
the frames are the ones two fresh renders here would give. ``calibrate`` then renders only the
variants. Anything else (no such verdict, another machine, another gate set) renders the reference
twice, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..records import EnvironmentRecord, GateSetRecord, Manifest
from ..registry import Registry
from ..trust.policy import load_policy
from .store import get_frames
from .verdicts import signed_verdicts

__all__ = ["StoredReference", "stored_reference"]


@dataclass(frozen=True)
class StoredReference:
    frames: np.ndarray  # the gate set's delivered frames, as the verdict stored them
    verdict: str  # the signed verdict's digest: where the frames came from (the band's method says)


def stored_reference(
    registry: Registry, build_id: str, manifest: Manifest, gs: GateSetRecord, here: EnvironmentRecord
) -> StoredReference | None:
    """The newest signed passing verdict of ``build_id`` on gate set ``gs``, rendered on a machine
    with ``here``'s environment fingerprint, and its frames; None when there is none. A passing
    verdict's twins were identical (``steps.compare`` passes nothing else)."""
    verdicts, _ = signed_verdicts(registry, build_id, manifest, load_policy())
    for v in reversed(verdicts):
        r = v.result
        if r.status == "passed" and r.gate_set.digest == gs.digest and r.environment.fingerprint == here.fingerprint:
            return StoredReference(get_frames(registry, r.frames_blob), v.digest)
    return None
