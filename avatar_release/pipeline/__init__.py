"""The pipeline contract: how any project's model reaches the toolchain (docs/reference/pipeline-contract.md).

A pipeline spec (``manifests/pipelines/NAME.toml``) names an ``entry``; the entry is a ``Pipeline``
(or a function returning one). Model code may also use the hints here (``replicated``,
``run_blocks``, ``weight_layout`` attributes) to tell a compiler how its tensors should sit on the
mesh; eager PyTorch ignores them. Importing this package imports neither torch nor jax.
"""

from ._author import author_error, author_frame, calling, defined_at, returned
from ._contract import (
    CONTRACT_PAGE,
    LEVER_EFFECTS,
    Analysis,
    AnalysisContext,
    ChunkProgramSpec,
    ContractError,
    GateRequests,
    JaxStage,
    KernelRoute,
    Lever,
    Pipeline,
    StageSignature,
    TargetContext,
    TensorSpec,
    check_pipeline,
    signature_of,
)
from ._entry import load_entry, project_source_digest
from ._hints import (
    WEIGHT_LAYOUTS,
    block_runner,
    layout_hints,
    replicated,
    run_blocks,
    stationary_params,
    weight_layout_of,
)
from ._io import (
    DELIVERY_KINDS,
    INPUT_KINDS,
    RESERVED_FIELDS,
    Delivery,
    RequestInput,
    RequestProgram,
    check_request_program,
    request_program,
)

__all__ = [
    "CONTRACT_PAGE",
    "LEVER_EFFECTS",
    "WEIGHT_LAYOUTS",
    "Pipeline",
    "TensorSpec",
    "StageSignature",
    "ChunkProgramSpec",
    "RequestProgram",
    "RequestInput",
    "Delivery",
    "INPUT_KINDS",
    "DELIVERY_KINDS",
    "RESERVED_FIELDS",
    "request_program",
    "check_request_program",
    "Lever",
    "GateRequests",
    "TargetContext",
    "KernelRoute",
    "Analysis",
    "AnalysisContext",
    "JaxStage",
    "ContractError",
    "check_pipeline",
    "signature_of",
    "calling",
    "returned",
    "author_error",
    "author_frame",
    "defined_at",
    "load_entry",
    "project_source_digest",
    "replicated",
    "layout_hints",
    "run_blocks",
    "block_runner",
    "weight_layout_of",
    "stationary_params",
]
