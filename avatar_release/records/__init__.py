"""Every on-disk record in one room: build, channel, gate, review, statement, and schema export,
and a build's identity and seal (:mod:`.identity`: what its id names, which bytes it is made of).

Each stored kind carries ``kind`` and ``schema_version``; its module keeps a dated changelog.
``parse_record`` reads a supported range and refuses a newer version with a version error
(exit 11) before validating any field. ``STORED_KINDS`` lists every stored kind, so schema
export, stored examples under ``tests/data/`` and the version table never miss one.
"""

from __future__ import annotations

from ._base import BlobRef, Record, parse_record, readable_versions, utcnow
from .build import (
    BUILD_SCHEMA_VERSION,
    ArraySpec,
    AutotuneFinding,
    AutotuneRecord,
    Bucket,
    ChunkProgram,
    CompileEvidence,
    DeliveryRecord,
    RequestInputRecord,
    GateRequestsRecord,
    LeverRecord,
    EnvironmentRecord,
    ExecutableEntry,
    FlagProfileRecord,
    KernelRecord,
    KernelRouteRecord,
    Manifest,
    MemoryFit,
    Platform,
    ScheduleRecord,
    Toolchain,
    WeightsRecord,
    WeightTensor,
    WeightChunk,
    WEIGHT_CHUNK_BYTES,
    WEIGHT_CHUNKING,
    WEIGHT_COMPRESSIONS,
)
from .channel import CHANNEL_SCHEMA_VERSION, CHANNELS, HISTORY_SCHEMA_VERSION, ChannelState, HistoryEntry
from .gate import (
    BAND_SCHEMA_VERSION,
    COMPILE_GATE_SCHEMA_VERSION,
    FRAMES_MEDIA_TYPE,
    GATE_RESULT_SCHEMA_VERSION,
    GATE_SHARD_SCHEMA_VERSION,
    RESULT_MEDIA_TYPE,
    SHARD_MEDIA_TYPE,
    Band,
    BandVariant,
    BaselineRef,
    CompileCheck,
    CompileGateResult,
    GateEvidence,
    GateRequestRecord,
    GateResult,
    GateSetRecord,
    GateShard,
    GateShardRun,
)
from .identity import (
    build_id_for, check_identity, identity_digest, identity_flags, manifest_identity,
    manifest_seal,
)
from .move import MOVE_MEDIA_TYPE, MOVE_SCHEMA_VERSION, MoveRecord
from .review import REVIEW_SCHEMA_VERSION, ReviewAnswer, ReviewDecision, ReviewRecord
from .statement import (
    STATEMENT_SCHEMA_VERSION, TIMESTAMP_SCHEMA_VERSION,
    StatementPayload, TimestampPayload,
)

__all__ = [
    "Record", "BlobRef", "parse_record", "readable_versions", "utcnow", "STORED_KINDS",
    "BUILD_SCHEMA_VERSION", "ArraySpec", "AutotuneFinding", "AutotuneRecord", "KernelRouteRecord", "Bucket", "ChunkProgram", "CompileEvidence", "EnvironmentRecord",
    "DeliveryRecord", "RequestInputRecord",
    "ExecutableEntry",
    "GateRequestsRecord", "LeverRecord",
    "FlagProfileRecord", "KernelRecord", "Manifest", "MemoryFit", "Platform", "ScheduleRecord", "Toolchain",
    "WeightsRecord",
    "WeightTensor",
    "WeightChunk",
    "WEIGHT_CHUNK_BYTES",
    "WEIGHT_CHUNKING",
    "WEIGHT_COMPRESSIONS",
    "CHANNELS", "CHANNEL_SCHEMA_VERSION", "HISTORY_SCHEMA_VERSION", "ChannelState", "HistoryEntry",
    "GATE_RESULT_SCHEMA_VERSION", "BAND_SCHEMA_VERSION", "COMPILE_GATE_SCHEMA_VERSION", "FRAMES_MEDIA_TYPE",
    "RESULT_MEDIA_TYPE", "Band", "BandVariant", "BaselineRef", "CompileCheck", "CompileGateResult", "GateEvidence",
    "GateRequestRecord", "GateResult", "GateSetRecord", "GATE_SHARD_SCHEMA_VERSION", "SHARD_MEDIA_TYPE",
    "GateShard", "GateShardRun",
    "MOVE_SCHEMA_VERSION", "MOVE_MEDIA_TYPE", "MoveRecord",
    "REVIEW_SCHEMA_VERSION", "ReviewAnswer", "ReviewDecision", "ReviewRecord",
    "STATEMENT_SCHEMA_VERSION", "TIMESTAMP_SCHEMA_VERSION",
    "StatementPayload", "TimestampPayload",
    "build_id_for", "check_identity", "identity_digest", "identity_flags",
    "manifest_identity", "manifest_seal",
]

# Every kind that is stored on its own, by the file-name stem of its schema and stored example.
STORED_KINDS: dict[str, type[Record]] = {
    "build-manifest": Manifest,
    "channel-state": ChannelState,
    "history-entry": HistoryEntry,
    "move": MoveRecord,
    "gate-result": GateResult,
    "review": ReviewRecord,
    "band": Band,
    "statement": StatementPayload,
    "compile-gate": CompileGateResult,
    "gate-shard": GateShard,
    "timestamp": TimestampPayload,
}
