"""The build manifest and what it is made of: blobs, executables, the platform, the program.

Changelog of ``avatar-release/build`` (``BUILD_SCHEMA_VERSION``). This avatar-release reads the
current version and the one before (the support window, ``records.window``); the entries about
what older versions did, and what was "still read", are history: older manifests are refused (exit
11) naming the fix, compile the build again (tests/data keeps them as refusal examples).
  * 1 (2026-11-29): first version (stored example: tests/data/build-manifest.v1.json).
  * 2 (2026-12-01): ``seal``; weights that are never materialised (``weights.blob`` None,
    ``materialized``); ``memory_fit``; per executable ``cost_loop_scale``, ``kernels``,
    ``schedule`` and ``host_callbacks``. These fields were first written on 2026-11-29 still
    labelled 1, which a reader of the first version refused as an integrity error; a reader
    now reads 1..2, and an older reader refuses a version-2 manifest with a version error.
  * 3 (2026-12-01): same fields; ``ExecutableEntry.fingerprint`` is now the fingerprint the
    backend reports for the executable *after* a serialize/deserialize round trip (what a
    loader sees), not the compile-time one, which XLA:CPU does not reproduce after the round
    trip (it rewrites the HLO's stack-frame metadata). The loader and ``verify`` compare it with
    the loaded executable's; the build identity covers ``schema_version`` from 3 on, so a v3
    manifest relabelled 2 no longer matches its build id (``avatar_release.records.identity``).

  * 4 (2026-12-01): ``levers`` (the override keys the pipeline declares as tier-2 levers, with
    their effect) and ``gate_requests`` (the pipeline's gate-set requests): what the pipeline
    contract declares, recorded so a gate judges a build by what its own pipeline declared, with
    no pipeline import. Absent (None) in older versions: no override is a lever, and the gate set
    takes its default requests. ``model_entry`` names an entry in the project, e.g.
    ``model.release:pipeline``.

  * 5 (2026-12-02): weights in chunks: ``weights.chunks`` lists content-addressed pieces of at most
    ``WEIGHT_CHUNK_BYTES`` raw bytes each (tensor-aligned by the rule ``weights.chunking``), each
    zstd-compressed and digested on its own, with the tensors it holds (name, dtype, shape,
    offset, bytes); ``weights.blob`` is None and ``weights.raw_digest`` is the digest of that
    chunk table. A build whose weights differ in one layer shares every other chunk. Older
    versions keep one safetensors blob (still read).

  * 6 (2026-12-02): GPU targets. ``platform.target_config`` (the sha256 of the GPU target
    description the executables were compiled for; the identity covers it through the platform),
    ``autotune`` (what XLA:GPU assigned without measuring it: per executable, the convolutions left
    to run time and the GEMM and block-level fusions given default configs, and the settings that
    decided it), ``kernel_routes`` (per stage, each kernel the pipeline routed for the target: what
    its config asked for, what the program carries, why they differ) and ``KernelRecord.backend``
    ``"triton"`` (a Pallas kernel lowered through Triton). The three new fields are left out of the
    stored JSON when unset (``_omit_when_none``), so a v5 manifest read and written again keeps its
    bytes, its content digest (what signatures bind) and its identity.

  * 7 (2026-12-02): autotuned GPU builds (``avatar-release autotune``). ``autotune.results`` is now
    the ``sha256:`` digest of the autotune results (XLA's ``AutotuneResults`` text) the compile
    loaded, which the identity covers (it was a path and no profile ever set it);
    ``autotune.results_blob`` keeps those results in the build (zstd), ``results_size`` and
    ``results_entries`` describe them, and ``complete_required`` says whether XLA was told to refuse
    any instruction they lack (``xla_gpu_require_complete_aot_autotune_results``). Left out when
    unset, so a v6 manifest keeps its bytes and identity.

  * 8 (2026-12-05): raw weight chunks. ``weights.compression`` says how every chunk is stored:
    ``"none"`` (the default: the blob *is* the chunk's raw bytes) or ``"zstd"``; unset, as in
    v5-v7, it is zstd. Each chunk records ``raw_blake3``, the BLAKE3 digest of its raw bytes, the
    one hash a loader takes of them (the blob's sha256 stays the transport digest). Both are left
    out when unset, so a v7 manifest keeps its bytes and identity.

  * 8 (2026-12-05), also: declared request inputs and outputs. ``program.inputs`` lists the
    request inputs a pipeline declares by kind (image, audio, text, tensor, noise, time: name,
    required, shape, dtype, audio layout) and ``program.delivers`` what its chunks deliver (video,
    audio or tensors, by output name); ``image_input``, ``audio_input`` and ``noise_input`` are
    None where it declares no such input, ``height``/``width`` (video) and
    ``sample_rate``/``samples_per_frame`` (audio) 0 where nothing has that size. Both new fields
    are written only for a pipeline that is not a talking head (photo, audio and noise in, video
    out), so a talking head's program keeps its bytes; ``ChunkProgram.request_inputs`` and
    ``delivery`` derive its declaration, and that of every older manifest.

``EnvironmentRecord`` (where a gate ran) lives here beside ``Platform`` (what a build was
compiled for); ``avatar_release.machine`` describes the live machine as either and diffs them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ._base import BlobRef, Record
from ._omit import _omit_when_none
from .weights import (
    WEIGHT_CHUNK_BYTES,
    WEIGHT_CHUNKING,
    WEIGHT_COMPRESSIONS,
    WeightChunk,
    WeightsRecord,
    WeightTensor,
)

__all__ = [
    "BUILD_SCHEMA_VERSION",
    "WEIGHT_COMPRESSIONS",
    "ArraySpec",
    "Bucket",
    "Toolchain",
    "Platform",
    "EnvironmentRecord",
    "FlagProfileRecord",
    "CompileEvidence",
    "ExecutableEntry",
    "WeightsRecord",
    "WeightTensor",
    "WeightChunk",
    "WEIGHT_CHUNK_BYTES",
    "WEIGHT_CHUNKING",
    "KernelRecord",
    "KernelRouteRecord",
    "AutotuneFinding",
    "AutotuneRecord",
    "ScheduleRecord",
    "MemoryFit",
    "ChunkProgram",
    "RequestInputRecord",
    "DeliveryRecord",
    "LeverRecord",
    "GateRequestsRecord",
    "Manifest",
]

BUILD_SCHEMA_VERSION = 8


class ArraySpec(Record):
    """One positional array of an executable: name, shape, dtype and its sharding.

    ``sharding`` is the PartitionSpec, one entry per dimension: a mesh axis name or None.
    """

    name: str
    shape: list[int]
    dtype: str
    sharding: list[str | None]


class Bucket(Record):
    """A shape bucket: one compiled shape of the per-chunk program."""

    # height x width: the delivered video's; 1 x 1 for a build that delivers audio or tensors
    name: str
    frames: int = Field(gt=0)
    height: int = Field(gt=0)
    width: int = Field(gt=0)


class Toolchain(Record):
    python: str
    jax: str
    jaxlib: str
    torch: str | None
    torchax: str | None
    avatar_release: str


class Platform(Record):
    """What the executables were compiled for; the loader compares this with the pod."""

    backend: str
    # A live client's platform version; "topology:<topology>" for a compile-only client (a TPU or
    # GPU topology on a host without the devices), whose version no live device reports.
    platform_version: str
    device_kind: str
    device_count: int
    mesh_axes: list[str]
    mesh_shape: list[int]
    topology: str | None = None
    # XLA:CPU code is built for the host's CPU features; recorded for CPU targets.
    cpu_features: list[str] | None = None
    # v6, GPU targets: "sha256:<hex>" of the target description (GpuTargetConfigProto text) the
    # executables were compiled for (manifests/gpu/); part of the identity through the platform.
    target_config: str | None = None

    _omit = _omit_when_none("target_config")


class EnvironmentRecord(Record):
    """Where a gate ran (the live machine, not a build's target). Outputs are only compared
    between equal fingerprints."""

    fingerprint: str  # sha256 over the other fields
    backend: str
    platform_version: str
    device_kind: str
    device_count: int
    jax: str
    jaxlib: str
    cpu_features: list[str] | None = None


class FlagProfileRecord(Record):
    name: str
    version: int
    compiler_options: dict[str, Any]
    env_flags: list[str]
    kernel_flags: dict[str, Any] = {}
    digest: str


class CompileEvidence(Record):
    """What compiling one stage x bucket found, recorded in its executable entry."""

    # The one list of these fields: compile_stage (compile/_stage.py) fills every one of them, the
    # packager (compile/_package.py) copies them whole into the ExecutableEntry, which inherits them,
    # and tests/unit/test_executable_fields.py fails if either step leaves one out.
    in_tree: str  # pytree structure, as text (never pickled)
    out_tree: str
    hlo_digest: str
    # The backend's fingerprint of the executable as a loader deserializes it (v3; compile-time
    # before). None where the compiling client cannot load what it compiled (compile-only TPU).
    fingerprint: str | None
    trace_seconds: float
    lower_seconds: float
    compile_seconds: float
    # XLA's own estimates from compiled.cost_analysis(): flops, bytes accessed, transcendentals,
    # and on TPU optimal_seconds. Compiler estimates, never measurements. XLA counts each while
    # loop's body once; "flops per run", "bytes accessed per run" and "transcendentals per run"
    # (since 2026-12-01, where the compiler could compute them) are XLA's same analysis with every
    # loop counted as often as it turns, Pallas kernels' CostEstimates included (compile/_loopcost.py).
    cost: dict[str, float] = {}
    # XLA counts a while loop's body once: with scanned blocks, the cost above covers one block
    # per scan. Multiply by this (traced matmul flops with / without scan trip counts) for the stage
    # (an approximation, used only for a manifest without the per-run figures above).
    cost_loop_scale: float = 1.0
    memory: dict[str, int] = {}  # compiled.memory_analysis(), bytes per device
    kernels: list[KernelRecord] = []  # Pallas kernels in the compiled program
    schedule: ScheduleRecord | None = None  # all-to-alls in the scheduled program
    host_callbacks: list[str] = []  # custom calls into the Python host (the compile gate refuses any)


class _ExecutableSlot(Record):
    """Which stage x bucket an executable is, its blob and its arrays: what the packager adds."""

    key: str  # "<stage>/<bucket>"
    stage: str
    bucket: str
    # "xla-executable": a compiled, serialized XLA executable (loads without compiling).
    # "jax-export": portable StableHLO (jax.export); the pod compiles it on first use, so the
    # zero-recompile gate refuses it. Kept for hosts whose exact device the builder cannot know.
    format: Literal["xla-executable", "jax-export"] = "xla-executable"
    blob: BlobRef  # the zstd-compressed serialized executable
    raw_size: int
    raw_digest: str
    params: list[ArraySpec]  # weights, in call order
    inputs: list[ArraySpec]  # per-chunk inputs, in call order
    outputs: list[ArraySpec]


# pydantic lists inherited fields from the last base to the first: the slot's, then the evidence's,
# the order the exported schema (manifests/schema/) has always had.
class ExecutableEntry(CompileEvidence, _ExecutableSlot):
    """One compiled stage x bucket."""


class KernelRecord(Record):
    """One Pallas kernel as compiled into the program."""

    name: str
    # Mosaic custom call (TPU), the Pallas interpreter (inlined loops), or (v6) a Triton custom call (GPU)
    backend: Literal["mosaic", "interpret", "triton"]
    count: int | None  # call sites in the compiled program (None: interpreted, inlined as loops)
    flags: dict[str, Any] = {}  # Mosaic compiler flags the kernel requested, as found in the program


class KernelRouteRecord(Record):
    """One kernel of the pipeline as routed for the build's target, as the pipeline declared it
    while tracing (``TargetContext.declare_route``): e.g. the DiT's attention asked for "flash" and
    carried as "pallas-triton" on a GPU, or "xla" where the Pallas kernel does not lower."""

    kernel: str  # the pipeline's name for the call site, e.g. "dit attention"
    requested: str  # what the config asks for
    used: str  # what the compiled program carries
    reason: str = ""  # why, when ``used`` is not what was requested
    # For a kernel XLA's cost model cannot see into (Triton): its name in the program and the cost
    # of one call on one device as the pipeline declared it, added to the executable's per-run cost.
    program_kernel: str = ""
    estimate: dict[str, float] | None = None


class AutotuneFinding(Record):
    """Per executable: the instructions XLA:GPU gives a config without measuring it on the device
    (read from the compiled program, not measured)."""

    # cuDNN convolutions whose algorithm is -1: XLA picks it when the program first runs.
    convolutions_at_run_time: int = 0
    # GEMM fusions (Triton, cuDNN, custom kernels) and cuBLAS calls: the config or algorithm the
    # compile assigned (a default without a device) is what runs.
    gemm_fusions: int = 0
    cublas_calls: int = 0
    # Triton block-level fusions (softmax, reductions): their tiling as the compile assigned it.
    block_fusions: int = 0


class AutotuneRecord(Record):
    """What a GPU build's autotuning rests on (v6). Without the device XLA measures nothing: every
    GEMM and block-level fusion keeps the default config and every cuDNN convolution is left to run
    time. With ``select_first`` (the deterministic flags) XLA takes the first valid config even with a
    device. ``results`` is the digest of the autotune results the compile loaded (None: none; v7,
    ``avatar-release autotune``), kept in the build as ``results_blob``."""

    deviceless: bool
    select_first: bool
    results: str | None = None  # v7: "sha256:<hex>" of the results text; the identity covers it
    settings: dict[str, Any] = {}  # the flag profile's options that decide autotuning, as compiled
    executables: dict[str, AutotuneFinding] = {}  # by executable key
    convolutions_at_run_time: int = 0  # over every executable: what a pod would choose at start
    results_blob: BlobRef | None = None  # v7: the results text, zstd
    results_size: int | None = None  # v7: its raw bytes
    results_entries: int | None = None  # v7: how many configs it holds
    complete_required: bool | None = None  # v7: XLA refused to compile anything the results lacked

    _omit = _omit_when_none("results_blob", "results_size", "results_entries", "complete_required")


class ScheduleRecord(Record):
    """All-to-alls in the compiled (scheduled) program: how many overlap with compute.

    ``hidden``: an async start/done pair with compute scheduled between them; ``exposed``: a
    pair with none, or a synchronous all-to-all. Read from the scheduled HLO, not measured.
    """

    all_to_alls: int
    async_pairs: int
    synchronous: int
    hidden: int
    exposed: int


class MemoryFit(Record):
    """Per-device memory of the whole pipeline against the device's capacity, from XLA's
    memory_analysis(): every stage's weights stay resident; one stage runs at a time."""

    capacity_bytes: int
    weights_bytes: int  # resident weight arguments of all stages, per device
    peak_stage: str  # the stage x bucket with the largest working set
    peak_working_bytes: int  # its non-weight arguments + outputs + temporaries - aliased
    total_bytes: int  # weights_bytes + peak_working_bytes
    fits: bool
    weight_sharding: Literal["fsdp", "replicated"]


class RequestInputRecord(Record):
    """One declared request input (v8), fed to the stage input ``name`` (``avatar_release.pipeline``
    documents what the runtime feeds for each kind)."""

    name: str
    kind: Literal["image", "audio", "text", "tensor", "noise", "time"]
    required: bool = True
    shape: list[int] = Field(default_factory=list)  # image (H, W, 3); text (max_bytes,); tensor; [] audio, noise
    dtype: str
    sample_rate: int = 0  # audio
    samples_per_frame: int = 0  # audio


class DeliveryRecord(Record):
    """What a build's chunks deliver (v8), by stage output names."""

    kind: Literal["video", "audio", "tensors"]
    outputs: list[str] = Field(min_length=1)
    sample_rate: int = 0  # audio: of the delivered samples
    samples_per_frame: int = 0  # audio: a chunk of F frames delivers F * samples_per_frame samples


class ChunkProgram(Record):
    """How the runtime drives the stages for one chunk, without knowing the model.

    Stages run in ``stages`` order; each reads its inputs by name from the chunk's
    environment: request inputs (``inputs``, v8; before it, ``image``, ``audio``, ``noise``),
    carried state and earlier stages' outputs. ``carry`` maps a state input to the output that
    feeds it in the next chunk (zeros before the first). ``deliver`` names the delivered output
    (uint8 frames for video; ``delivers`` says what, v8).
    """

    stages: list[str]
    image_input: str | None  # v8: None without an image input
    audio_input: str | None  # v8: None without an audio input
    noise_input: str | None  # v8: None without a noise input
    carry: dict[str, str]
    deliver: str
    # "numpy-pcg64-standard-normal/v1": noise from (request seed, chunk index), reproducible.
    # "os-entropy-standard-normal/v1": fresh noise every request (varied takes); such a build
    # can never pass the twin-baseline gate.
    noise_recipe: Literal["numpy-pcg64-standard-normal/v1", "os-entropy-standard-normal/v1"] = (
        "numpy-pcg64-standard-normal/v1"
    )
    fps: int
    sample_rate: int  # of the audio input or the delivered audio; v8: 0 without audio
    samples_per_frame: int  # v8: 0 without audio
    height: int  # of the image input or the delivered video; v8: 0 without either
    width: int
    inputs: list[RequestInputRecord] | None = None  # v8: the declared request inputs
    delivers: DeliveryRecord | None = None  # v8: what the chunks deliver

    _omit = _omit_when_none("inputs", "delivers")

    def request_inputs(self) -> list[RequestInputRecord]:
        """The declared request inputs; without ``inputs`` (a talking head), its photo, audio and noise."""
        if self.inputs is not None:
            return list(self.inputs)
        return [
            RequestInputRecord(
                name=str(self.image_input), kind="image", shape=[self.height, self.width, 3], dtype="uint8"
            ),
            RequestInputRecord(
                name=str(self.audio_input),
                kind="audio",
                dtype="float32",
                sample_rate=self.sample_rate,
                samples_per_frame=self.samples_per_frame,
            ),
            RequestInputRecord(name=str(self.noise_input), kind="noise", required=False, dtype="float32"),
        ]

    def input_of(self, kind: str) -> RequestInputRecord | None:
        """The request input of ``kind`` (image, audio and noise are declared at most once)."""
        return next((i for i in self.request_inputs() if i.kind == kind), None)

    def delivery(self) -> DeliveryRecord:
        """What the chunks deliver; without ``delivers``, the uint8 video ``deliver`` names."""
        return self.delivers if self.delivers is not None else DeliveryRecord(kind="video", outputs=[self.deliver])

    @property
    def talking_head(self) -> bool:
        """Photo and audio in, video out: the shape every build had before inputs were declared."""
        return (
            self.input_of("image") is not None
            and self.input_of("audio") is not None
            and self.delivery().kind == "video"
        )


class LeverRecord(Record):
    """A config override the pipeline declares may change the output within the band (tier 2)."""

    effect: Literal["reassociation", "precision"]
    note: str = ""


class GateRequestsRecord(Record):
    """The gate set's requests, as the pipeline declares them: every (image, audio) variant pair."""

    images: list[int] = Field(min_length=1)
    audio: list[int] = Field(min_length=1)
    seed: int = 0


class Manifest(Record):
    schema_version: int = BUILD_SCHEMA_VERSION
    kind: Literal["avatar-release/build"] = "avatar-release/build"
    build_id: str
    identity: str  # hash over everything that changes the binary or its output
    # Hash over the identity and the exact bytes of every executable and the weights (their
    # digests): binds this build's blobs to it, so entries mixed in from another build are refused.
    seal: str | None = None
    created_at: str
    created_by: str
    pipeline: str
    model_entry: str
    config: dict[str, Any]
    overrides: dict[str, Any]
    source_digest: str
    weights: WeightsRecord
    target: str
    flags: FlagProfileRecord
    toolchain: Toolchain
    platform: Platform
    buckets: list[Bucket]
    program: ChunkProgram
    executables: list[ExecutableEntry]
    memory_fit: MemoryFit | None = None  # targets that declare their device memory
    levers: dict[str, LeverRecord] | None = None  # v4: the pipeline's declared levers, by override key
    gate_requests: GateRequestsRecord | None = None  # v4: the pipeline's gate-set requests
    autotune: AutotuneRecord | None = None  # v6: GPU builds
    kernel_routes: dict[str, list[KernelRouteRecord]] | None = None  # v6: by stage, where the pipeline declared any

    _omit = _omit_when_none("autotune", "kernel_routes")

    def executable(self, stage: str, bucket: str) -> ExecutableEntry:
        for e in self.executables:
            if e.stage == stage and e.bucket == bucket:
                return e
        raise KeyError(f"{stage}/{bucket}")

    def blobs(self) -> list[BlobRef]:
        kept = [self.autotune.results_blob] if self.autotune and self.autotune.results_blob else []
        return self.weights.chunk_blobs() + [e.blob for e in self.executables] + kept
