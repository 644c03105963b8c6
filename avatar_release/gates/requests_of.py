"""Gate a build on another build's gate requests (``gate BUILD --baseline none --requests-of OTHER``).

Each build records the requests its gates render (manifest v4: its spec's ``[gate]`` table, or
the pipeline's ``gate_requests``) when it is compiled, and a candidate is compared frame by frame
only with a baseline gated on the same gate set. After a ``[gate]`` table changes, the build in
prod still records the old requests, and re-gating it renders those again. This lets its gate
render the candidate's instead: the gate set is the build's own layout and inputs with OTHER's
requests, and the stored verdict names that gate set, so a candidate on those requests can then
be gated against it.
"""

from __future__ import annotations

from ..errors import InputError
from ..records import GateRequestsRecord, Manifest
from ..registry import Registry, read_manifest
from .gateset import declared_requests

__all__ = ["requests_to_render", "with_requests"]


def with_requests(manifest: Manifest, requests: GateRequestsRecord | None) -> Manifest:
    """``manifest`` as the gate set sees it when it renders ``requests`` (None: its own)."""
    return manifest if requests is None else manifest.model_copy(update={"gate_requests": requests})


def requests_to_render(
    registry: Registry, other: str | None, baseline: str, build_id: str
) -> GateRequestsRecord | None:
    """The gate requests recorded by build ``other`` (None when not asked); only for a gate on its
    own (``--baseline none``), which is what a baseline is re-gated with."""
    if other is None:
        return None
    if baseline != "none":
        raise InputError(
            f"--requests-of {other} with --baseline {baseline}: it re-gates a build on its own, to serve as a "
            f"baseline on another build's requests; use --baseline none (avatar-release gate {build_id} "
            f"--baseline none --requests-of {other})"
        )
    return declared_requests(read_manifest(registry, other)[1])
