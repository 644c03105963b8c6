"""The pipeline contract: what a pipeline spec's ``entry`` names, and what the toolchain reads of it.

A pipeline is any project's model, reached only through this contract (docs/reference/pipeline-contract.md
lists every member, its type and what the toolchain does with it). The toolchain never imports a
pipeline's packages by name: ``compile`` imports the spec's entry from the project, checks it with
``check_pipeline`` and from then on uses only the members below.

Values of the pipeline's own types (its config, its module tree, its stage modules) pass through
the toolchain untouched; only their declared shape is relied on: a config is a dataclass (so
``--set`` can override its fields), a stage is a ``torch.nn.Module`` (traced through torchax) or a
``JaxStage``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..errors import ContractError, SpecError
from ..specs import FlagProfile, PipelineSpec, TargetSpec
from ._author import CONTRACT_PAGE, calling, returned
from ._io import ChunkProgramSpec, RequestProgram

if TYPE_CHECKING:
    from jax.sharding import Mesh

__all__ = [
    "CONTRACT_PAGE",
    "ContractError",
    "TensorSpec",
    "StageSignature",
    "ChunkProgramSpec",
    "Lever",
    "LEVER_EFFECTS",
    "GateRequests",
    "TargetContext",
    "KernelRoute",
    "AnalysisContext",
    "Analysis",
    "JaxStage",
    "Pipeline",
    "check_pipeline",
    "signature_of",
]

LEVER_EFFECTS = ("reassociation", "precision")


@dataclass(frozen=True)
class TensorSpec:
    """One positional array of a stage: its name (how the chunk program wires it), shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy name: "float32", "bfloat16", "uint8", ...


@dataclass(frozen=True)
class StageSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Lever:
    """A config override that may change the output within the similarity band (tier 2)."""

    effect: str  # "reassociation" (same math, reductions in another order) | "precision" (a narrower type)
    note: str = ""

    def __post_init__(self) -> None:
        if self.effect not in LEVER_EFFECTS:
            raise ValueError(f"lever effect {self.effect!r}: expected one of {', '.join(LEVER_EFFECTS)}")


@dataclass(frozen=True)
class GateRequests:
    """The gate set's requests: every (sample image variant, sample audio variant) pair, one seed."""

    images: tuple[int, ...] = (0, 1)
    audio: tuple[int, ...] = (0, 1)
    seed: int = 0


@dataclass(frozen=True)
class TargetContext:
    """What the toolchain tells a pipeline about the machine it is traced for (``trace_context``)."""

    name: str  # the target spec's name, e.g. "cpu-8", "tpu-v6e-8"
    platform: str  # "cpu" | "tpu" | "gpu": what the kernels are built for (not the host's backend)
    mesh: Mesh  # over the target's devices
    axis: str  # the mesh axis weights and sequences are sharded over
    kernel_flags: Mapping[str, Any] = field(default_factory=dict)  # the flag profile's kernel_flags
    stage: str = ""  # the stage being traced
    # Where ``declare_route`` records (the toolchain's, one per stage; the manifest's kernel_routes).
    routes: dict[str, KernelRoute] = field(default_factory=dict, repr=False)

    def declare_route(
        self,
        kernel: str,
        *,
        requested: str,
        used: str,
        reason: str = "",
        program_kernel: str = "",
        estimate: Mapping[str, float] | None = None,
    ) -> None:
        """Say how one of the pipeline's kernels is routed for this target (recorded in the build's
        manifest, ``kernel_routes``): what its config asked for, what the program carries, and why
        they differ (e.g. a Pallas kernel that does not lower for this platform). Declaring the same
        kernel again in another trace of the stage replaces the first declaration.

        ``program_kernel`` and ``estimate``: for a kernel XLA's cost model cannot see into and that
        carries no ``pl.CostEstimate`` of its own (a Pallas kernel lowered through Triton), its name
        in the program (the ``pallas_call`` name) and the cost of one call on one device ("flops",
        "bytes accessed", "transcendentals"); the compile adds it for every call site it finds."""
        self.routes[kernel] = KernelRoute(
            kernel, requested, used, reason, program_kernel, dict(estimate) if estimate else None
        )


@dataclass(frozen=True)
class KernelRoute:
    """One kernel as a pipeline routed it for a target (``TargetContext.declare_route``)."""

    kernel: str  # the pipeline's name for the call site, e.g. "dit attention"
    requested: str  # what the config asks for ("flash", "blocksparse", "xla", ...)
    used: str  # what the compiled program carries ("pallas-triton", "pallas-mosaic", "xla", ...)
    reason: str = ""
    program_kernel: str = ""  # the kernel's name in the compiled program, when ``estimate`` is given
    estimate: Mapping[str, float] | None = None  # one call on one device: flops, bytes accessed, transcendentals


@dataclass(frozen=True)
class AnalysisContext:
    """What an analysis is run with: the spec, its config (overrides applied) and the options given."""

    pipeline: Pipeline  # checked (check_pipeline)
    spec: PipelineSpec
    config: Any  # the pipeline's own config (a dataclass instance); None where an analysis reads options only
    target: TargetSpec | None = None  # when the analysis takes one
    flags: FlagProfile | None = None  # the target's flag profile
    options: Mapping[str, Any] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda msg: None


@dataclass(frozen=True)
class Analysis:
    """An optional, pipeline-specific analysis that ``avatar-release analyze`` runs.

    ``run(ctx) -> dict`` (JSON-ready); ``text(result) -> str`` for the terminal (default: JSON).
    ``needs_target``: the analysis compiles for a target (its devices are prepared first).
    """

    run: Callable[[AnalysisContext], dict]
    help: str
    text: Callable[[dict], str] | None = None
    needs_target: bool = False


@dataclass(frozen=True)
class JaxStage:
    """A stage written in JAX: ``fn(params, *inputs) -> outputs``, returned as a torch module's are:
    an array, a tuple or list (by position), or a dict or dataclass (by declared name)."""

    fn: Callable[..., Any]
    params: Mapping[str, Any]  # name -> array (its shape and dtype are what is compiled)


def _no_context(config: Any, target: TargetContext) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Pipeline:
    """A releasable pipeline. Build one in the project's entry point and return it.

    Required: ``name``, ``stages``, ``configs``, ``create``, ``init_weights``, ``load_weights``,
    ``stage``, ``signature``, ``chunk_program``. The rest have defaults.
    """

    name: str
    stages: tuple[str, ...]  # in the order the chunk program runs them
    configs: Mapping[str, Callable[[], Any]]  # config name -> () -> config (a dataclass instance)
    create: Callable[[Any], Any]  # config -> module tree (placeholder weights; must work on torch's meta device)
    init_weights: Callable[[Any, int], Any]  # (config, seed) -> module tree with deterministic weights
    load_weights: Callable[[Any, str], Any]  # (config, safetensors path) -> module tree; ValueError on mismatch
    stage: Callable[[Any, str], Any]  # (module tree, stage name) -> torch.nn.Module | JaxStage
    signature: Callable[[Any, int], Mapping[str, StageSignature]]  # (config, frames) -> per stage
    # config -> how a request flows chunk by chunk: its inputs by kind, carry, what it delivers (_io)
    chunk_program: Callable[[Any], RequestProgram | ChunkProgramSpec]
    trace_context: Callable[[Any, TargetContext], AbstractContextManager[Any]] = _no_context
    levers: Mapping[str, Lever] = field(default_factory=dict)  # override key -> lever (tier 2)
    gate_requests: GateRequests = GateRequests()
    # Overrides `gate calibrate` builds to measure the band from: the same math, reductions reordered.
    band_variants: tuple[Mapping[str, str], ...] = ()
    analyses: Mapping[str, Analysis] = field(default_factory=dict)
    source_packages: tuple[str, ...] = ()  # top-level packages of the project whose source the build digests

    def config(self, name: str, root: str | os.PathLike | None = None) -> Any:
        """The named config; SpecError listing the known names otherwise, ContractError naming the
        innermost frame under ``root`` (the project) when the pipeline's function raises."""
        if name not in self.configs:
            raise SpecError(f"pipeline {self.name}: no config named {name!r} (known: {', '.join(self.configs)})")
        with calling(f"pipeline {self.name}", f"configs[{name!r}]", root):
            config = returned(self.configs[name](), f"pipeline {self.name}", f"configs[{name!r}]")
        if not dataclasses.is_dataclass(config) or isinstance(config, type):
            raise ContractError(
                f"pipeline {self.name}: configs[{name!r}]() returned {type(config).__name__}, "
                f"not a dataclass instance; see {CONTRACT_PAGE} (configs)"
            )
        return config


# (member, what it must be, check) for every member a duck-typed entry object must carry.
_REQUIRED: tuple[tuple[str, str], ...] = (
    ("name", "a str"),
    ("stages", "a non-empty tuple of stage names"),
    ("configs", "a mapping of config name -> function returning a dataclass config"),
    ("create", "a function (config) -> module tree"),
    ("init_weights", "a function (config, seed) -> module tree"),
    ("load_weights", "a function (config, path) -> module tree"),
    ("stage", "a function (module tree, stage name) -> torch module or JaxStage"),
    ("signature", "a function (config, frames) -> {stage: StageSignature}"),
    ("chunk_program", "a function (config) -> RequestProgram"),
)
_OPTIONAL = ("trace_context", "levers", "gate_requests", "band_variants", "analyses", "source_packages")


def _refuse(where: str, member: str, expected: str, got: Any) -> ContractError:
    shown = "missing" if got is _MISSING else f"got {type(got).__name__} {_short(got)}"
    return ContractError(
        f"{where}: member {member!r} must be {expected}; {shown}. The pipeline contract: {CONTRACT_PAGE}"
    )


_MISSING = object()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_pipeline(obj: Any, where: str, root: str | os.PathLike | None = None) -> Pipeline:
    """``obj`` as a checked Pipeline, or ContractError naming the first missing or wrong member.

    ``obj`` is a Pipeline, any object with the same members, or a function of no arguments that
    returns one (called once here; what it raises names its innermost frame under ``root``).
    """
    if not isinstance(obj, Pipeline) and callable(obj) and not hasattr(obj, "stages"):
        obj = _call_entry(obj, where, root)
    members = _members(obj, where)
    _check_optional(members, where)
    return obj if isinstance(obj, Pipeline) else Pipeline(**members)


def _call_entry(obj: Callable[[], Any], where: str, root: str | os.PathLike | None) -> Any:
    """What an entry function of no arguments returns (refused when it needs arguments)."""
    try:
        inspect.signature(obj).bind()
    except TypeError as e:
        raise ContractError(
            f"{where}: names a callable that cannot be called with no arguments ({e}); an "
            f"entry names a Pipeline, or a function of no arguments returning one. "
            f"The pipeline contract: {CONTRACT_PAGE}"
        ) from None
    except ValueError:  # no signature to read (a builtin): calling it tells
        pass
    with calling(where, "the entry function", root):
        obj = returned(obj(), where, getattr(obj, "__qualname__", "the entry function"))
    return obj


def _members(obj: Any, where: str) -> dict[str, Any]:
    """``obj``'s required members (each checked) and the optional ones it has; stages as a tuple of
    distinct names."""
    members: dict[str, Any] = {}
    for member, expected in _REQUIRED:
        value = getattr(obj, member, _MISSING)
        ok = (
            {
                "name": lambda v: isinstance(v, str) and v,
                "stages": lambda v: isinstance(v, (tuple, list)) and v and all(isinstance(s, str) and s for s in v),
                "configs": lambda v: isinstance(v, Mapping) and v and all(callable(c) for c in v.values()),
            }.get(member, callable)(value)
            if value is not _MISSING
            else False
        )
        if not ok:
            raise _refuse(where, member, expected, value)
        members[member] = value
    for member in _OPTIONAL:
        value = getattr(obj, member, _MISSING)
        if value is not _MISSING:
            members[member] = value
    members["stages"] = tuple(members["stages"])
    if len(set(members["stages"])) != len(members["stages"]):
        raise _refuse(where, "stages", "a tuple of distinct names", members["stages"])
    return members


def _check_optional(members: dict[str, Any], where: str) -> None:
    """The optional members' shapes, checked; band_variants and source_packages made tuples."""
    if "trace_context" in members and not callable(members["trace_context"]):
        raise _refuse(
            where, "trace_context", "a function (config, TargetContext) -> context manager", members["trace_context"]
        )
    for member, kind, expected in (
        ("levers", Lever, "a mapping of override key -> Lever"),
        ("analyses", Analysis, "a mapping of name -> Analysis"),
    ):
        value = members.get(member, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, kind) for k, v in value.items()
        ):
            raise _refuse(where, member, expected, value)
    if not isinstance(members.get("gate_requests", GateRequests()), GateRequests):
        raise _refuse(where, "gate_requests", "a GateRequests", members["gate_requests"])
    variants = members.get("band_variants", ())
    if not isinstance(variants, (tuple, list)) or not all(
        isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())
        for v in variants
    ):
        raise _refuse(where, "band_variants", "a tuple of {override key: value string} mappings", variants)
    members["band_variants"] = tuple(dict(v) for v in variants)
    packages = members.get("source_packages", ())
    if not isinstance(packages, (tuple, list)) or not all(isinstance(p, str) and p for p in packages):
        raise _refuse(where, "source_packages", "a tuple of top-level package names", packages)
    members["source_packages"] = tuple(packages)


def signature_of(
    pipeline: Pipeline, config: Any, frames: int, where: str, root: str | os.PathLike | None = None
) -> dict[str, StageSignature]:
    """``pipeline.signature(config, frames)``, checked: one StageSignature of TensorSpecs per stage."""
    with calling(where, f"signature(config, {frames})", root):
        sigs = returned(pipeline.signature(config, frames), where, f"signature(config, {frames})")
    if not isinstance(sigs, Mapping) or set(sigs) != set(pipeline.stages):
        got = sorted(sigs) if isinstance(sigs, Mapping) else type(sigs).__name__
        raise ContractError(
            f"{where}: signature(config, {frames}) must map every stage {list(pipeline.stages)} to a "
            f"StageSignature; got {got}. The pipeline contract: {CONTRACT_PAGE}"
        )
    out = {}
    for stage in pipeline.stages:
        sig = sigs[stage]
        if not isinstance(sig, StageSignature):
            raise ContractError(
                f"{where}: signature(...)[{stage!r}] must be a StageSignature, got "
                f"{type(sig).__name__}. The pipeline contract: {CONTRACT_PAGE}"
            )
        out[stage] = StageSignature(_tensors(sig.inputs, where, stage), _tensors(sig.outputs, where, stage))
    return out


def _tensors(items: Sequence[Any], where: str, stage: str) -> tuple[TensorSpec, ...]:
    out = []
    for t in items:
        name, shape, dtype = (
            (t.name, t.shape, t.dtype)
            if isinstance(t, TensorSpec)
            else (t if isinstance(t, (tuple, list)) and len(t) == 3 else (None, None, None))
        )
        if name is not None:
            try:
                out.append(TensorSpec(str(name), tuple(int(d) for d in cast(Any, shape)), str(dtype)))
            except (TypeError, ValueError):
                raise ContractError(
                    f"{where}: stage {stage}: {str(name)!r}'s shape must be a tuple of ints, got "
                    f"{_short(shape)}. The pipeline contract: {CONTRACT_PAGE}"
                ) from None
        else:
            raise ContractError(
                f"{where}: stage {stage}: a signature entry must be a TensorSpec or a "
                f"(name, shape, dtype) tuple, got {_short(t)}. The pipeline contract: {CONTRACT_PAGE}"
            )
    return tuple(out)
