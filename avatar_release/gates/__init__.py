"""Gates: zero recompiles, twin baseline, bit-exact (tier 1), similarity band (tier 2), blind review.

Nothing here runs at import. ``run_gate`` is the entry point (``run_shard`` + ``merge_shards``: the
same gate split over machines); ``calibrate`` measures the band.
"""

from ..records import Band, GateEvidence, GateResult, ReviewRecord
from .band import calibrate, load_band
from .review_evidence import ReviewOutcome, review_outcome
from .run import GateOutcome, effective_status, run_gate
from .shards import ShardOutcome, merge_shards, parse_shard, run_shard
from .verdicts import (
    SignedVerdict,
    compared_with,
    describe_comparison,
    signed_verdicts,
    unpinned_inputs,
    verdict_status,
)

__all__ = [
    "run_gate",
    "run_shard",
    "merge_shards",
    "parse_shard",
    "ShardOutcome",
    "GateOutcome",
    "effective_status",
    "calibrate",
    "load_band",
    "GateResult",
    "GateEvidence",
    "ReviewRecord",
    "Band",
    "SignedVerdict",
    "signed_verdicts",
    "compared_with",
    "describe_comparison",
    "review_outcome",
    "ReviewOutcome",
    "verdict_status",
    "unpinned_inputs",
]
