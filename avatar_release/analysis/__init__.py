"""Compiler evidence about any program: the labelled estimate of time per chunk from a build's own
records (XLA's cost analysis, the schedule, the target's published peaks). Nothing here is about
one model; a pipeline's own analyses come through its contract (``Pipeline.analyses``)."""

from ._cost import LABEL, ChunkEstimate, StageEstimate, estimate_chunks

__all__ = ["LABEL", "ChunkEstimate", "StageEstimate", "estimate_chunks"]
