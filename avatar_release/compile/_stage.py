"""One stage x bucket: trace through torchax, lower with shardings, compile under flags,
serialize. Returns the blob and the evidence the manifest records."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._digest import sha256_digest
from .._dtypes import dtype_name, np_dtype
from ..errors import AvatarReleaseError, CompileError, ContractError, DoesNotFit
from ..pipeline import CONTRACT_PAGE, author_error, author_frame
from ..records import ArraySpec, CompileEvidence
from ._evidence import host_callbacks, kernels_in, schedule_of
from ._flops import loop_scale, pallas_kernels
from ._layout import pinned_layouts
from ._locations import portable_locations
from ._loopcost import run_cost
from ._outputs import match_outputs
from ._scan import scanned_blocks

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.stages import Compiled
    from jax.tree_util import PyTreeDef

__all__ = [
    "StagePlan",
    "LoweredStage",
    "CompiledStage",
    "fsdp_spec",
    "lower_stage",
    "compile_stage",
    "shared_stage",
    "check_outputs",
]


def fsdp_spec(shape: tuple[int, ...], axis: str, size: int) -> list[str | None]:
    """FSDP: shard a weight's first dimension over the mesh axis when it divides evenly."""
    if len(shape) >= 1 and shape[0] % size == 0 and shape[0] >= size:
        return [axis] + [None] * (len(shape) - 1)
    return [None] * len(shape)


@dataclass
class StagePlan:
    stage: str
    bucket: str
    jax_func: Any  # torchax-extracted callable: (params, args_tuple) -> outputs
    params: list[ArraySpec]  # full tensor names "<stage>.<param>", in sorted order
    param_keys: list[str]  # the keys jax_func expects
    inputs: list[ArraySpec]
    outputs: list[ArraySpec]
    # () -> the pipeline's trace context for this stage (its kernel routing for the target):
    # entered around every trace of the stage.
    trace_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    # The kernel routes the pipeline declares in that context (pipeline.KernelRoute by kernel name),
    # shared by the stage's buckets; the manifest's kernel_routes.
    routes: dict[str, Any] = field(default_factory=dict)
    # For messages: whose stage it is ("pipeline spec NAME") and where its signature is declared (file:line).
    where: str = ""
    signature_at: str = ""


@dataclass
class LoweredStage:
    plan: StagePlan
    lowered: Any
    trace_seconds: float
    lower_seconds: float
    exported: Any = None  # jax.export.Exported, for the portable "jax-export" format
    loop_scale: float = 1.0  # _flops.loop_scale of the traced program (1.0: no scans)
    devices: int = 1  # the mesh the stage is partitioned over
    kernel_names: tuple[str, ...] = ()  # the Pallas kernels the traced program calls (_flops.pallas_kernels)


@dataclass
class CompiledStage:
    plan: StagePlan
    payload: bytes  # the serialized executable (the StableHLO for "jax-export")
    evidence: CompileEvidence  # what the executable's manifest entry records of this compile
    compiled: Any = None  # the jax Compiled, for a caller that runs what it just built


def _sharding(mesh: Mesh, spec: list[str | None]) -> NamedSharding:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(*spec))


def lower_stage(
    plan: StagePlan, mesh: Mesh, *, export: bool = False, project_root: str | os.PathLike | None = None
) -> LoweredStage:
    """Trace and lower ``plan`` (and export it, with ``export``) with portable source locations:
    file names relative to ``project_root`` or an import root (_locations.py), so the program, and
    the build id, are the same from any folder, user and machine."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    def stage_fn(params: dict[str, jax.Array], *inputs: jax.Array) -> tuple[Any, ...]:
        # A tuple in declared order, whatever container the stage returned (_outputs.py).
        out = match_outputs(plan.jax_func(params, inputs), [s.name for s in plan.outputs], _where(plan), _PAGE)
        check_outputs(plan, out)  # here, before the out_shardings meet them: the declared shapes are refused first
        return out

    p_abstract = {
        key: jax.ShapeDtypeStruct(tuple(s.shape), np_dtype(s.dtype), sharding=_sharding(mesh, s.sharding))
        for key, s in zip(plan.param_keys, plan.params)
    }
    i_abstract = [
        jax.ShapeDtypeStruct(tuple(s.shape), np_dtype(s.dtype), sharding=_sharding(mesh, s.sharding))
        for s in plan.inputs
    ]
    out_shardings = tuple(_sharding(mesh, s.sharding) for s in plan.outputs)
    jitted = jax.jit(stage_fn, out_shardings=out_shardings)
    try:
        with portable_locations(project_root):
            t0 = time.perf_counter()
            with plan.trace_context(), scanned_blocks(mesh), pinned_layouts(mesh):
                traced = jitted.trace(p_abstract, *i_abstract)
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            exported = None
            if export:
                with plan.trace_context(), scanned_blocks(mesh), pinned_layouts(mesh):
                    exported = jax.export.export(jitted)(p_abstract, *i_abstract)
    except AvatarReleaseError:
        raise
    except Exception as e:  # noqa: BLE001
        if author_frame(e, project_root) is not None:  # raised in the pipeline's code: its author's to fix
            raise author_error(
                e,
                plan.where or "pipeline",
                f"stage(tree, {plan.stage!r}) (bucket {plan.bucket}), while traced,",
                project_root,
            ) from e
        raise CompileError(
            f"stage {plan.stage}/{plan.bucket}: tracing or lowering failed: {type(e).__name__}: {str(e)[:500]}"
        ) from e
    return LoweredStage(
        plan, lowered, t1 - t0, t2 - t1, exported, loop_scale(traced.jaxpr), mesh.size, pallas_kernels(traced.jaxpr)
    )


def check_outputs(plan: StagePlan, outputs: tuple[Any, ...]) -> None:
    """ContractError (exit 2) unless the traced outputs are the declared ones: their number, and each
    one's shape and dtype. A wrong declaration would otherwise compile and be recorded as the build's."""
    declared = plan.outputs
    where, page = _where(plan), _PAGE
    if len(outputs) != len(declared):
        traced = ", ".join(_aval(o) for o in outputs)
        raise ContractError(
            f"{where}: declares {len(declared)} outputs ({', '.join(s.name for s in declared)}), "
            f"the traced program returns {len(outputs)} ({traced}). {page}"
        )
    wrong = [
        f"output {s.name!r} is declared {_spec(s.shape, s.dtype)}, traced {_aval(o)}"
        for s, o in zip(declared, outputs)
        if _aval(o) != _spec(s.shape, s.dtype)
    ]
    if wrong:
        raise ContractError(f"{where}: {'; '.join(wrong)}. {page}")


_PAGE = f"Fix the signature or the stage. The pipeline contract: {CONTRACT_PAGE}"


def _where(plan: StagePlan) -> str:
    """Whose signature, where it is declared, and the stage x bucket: how a mismatch is introduced."""
    signature = "signature" + (f" ({plan.signature_at})" if plan.signature_at else "")
    return f"{plan.where + ': ' if plan.where else ''}{signature}: stage {plan.stage}, bucket {plan.bucket}"


def _spec(shape: Any, dtype: Any) -> str:
    return f"{tuple(int(d) for d in shape)} {dtype_name(dtype)}"


def _aval(x: Any) -> str:
    """A traced output as ``(shape) dtype``; what it is when it is not an array."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return _spec(x.shape, x.dtype)
    return f"a {type(x).__name__}, not an array"


def _text_tree(tree: PyTreeDef) -> str:
    return str(tree)


def _fingerprint(executable: Compiled) -> str | None:
    try:
        runtime = executable.runtime_executable()
        raw = None if runtime is None else runtime.fingerprint
    except Exception:  # noqa: BLE001 - not every backend reports one
        return None
    return raw.decode() if isinstance(raw, bytes) else (str(raw) if raw is not None else None)


def _loaded_fingerprint(compiled: Compiled, payload: bytes, in_tree: PyTreeDef, out_tree: PyTreeDef) -> str | None:
    """The fingerprint a loader will see: that of ``payload`` deserialized (never run).

    Not ``compiled``'s own: XLA:CPU rewrites the HLO's stack-frame metadata when it serializes,
    so the deserialized executable fingerprints differently from the one just compiled
    (measured, jax 0.10.2), yet the same for every compile of one program. A client that cannot
    load what it compiled (compile-only TPU) records None: nothing a loader could compare.
    """
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.experimental.serialize_executable import deserialize_and_load

    runtime = compiled.runtime_executable()
    if runtime is None or _fingerprint(compiled) is None:  # (a runtime executable is what has the fingerprint)
        return None
    try:  # our own bytes, just produced in this process: jax's unrestricted loader is fine here
        loaded = deserialize_and_load(
            payload, in_tree, out_tree, backend=runtime.client, execution_devices=runtime.local_devices()
        )
    except Exception:  # noqa: BLE001 - a backend that cannot load what it compiled: no fingerprint to check
        return None
    return _fingerprint(loaded)


def compile_stage(ls: LoweredStage, compiler_options: dict[str, Any]) -> CompiledStage:
    """Compile, serialize, and gather the evidence the manifest entry records of this compile."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.experimental.serialize_executable import serialize

    plan = ls.plan
    t0 = time.perf_counter()
    compiled = _xla_compile(ls, compiler_options)
    seconds = time.perf_counter() - t0
    payload, in_tree, out_tree = serialize(compiled)
    if ls.exported is not None:  # portable: ship the StableHLO; the pod compiles it
        payload = bytes(ls.exported.serialize())
    fp = _loaded_fingerprint(compiled, payload, in_tree, out_tree) if ls.exported is None else _fingerprint(compiled)
    # A compile-only client (a TPU topology on a CPU host) reports no fingerprint, and its
    # serialized bytes are no substitute: two compiles of one program in one process differ
    # (measured). The scheduled HLO's digest (hlo_digest) is what reproducibility is checked on.
    cost = _xla_cost(compiled)
    memory = _xla_memory(compiled)
    hlo = compiled.as_text() or ""
    if hlo:  # XLA counts each loop body once; add the per-run figures, every loop counted as it turns
        cost.update(_run_cost(ls, hlo))

    evidence = CompileEvidence(
        in_tree=_text_tree(in_tree),
        out_tree=_text_tree(out_tree),
        hlo_digest=sha256_digest(hlo.encode()),
        fingerprint=fp,
        trace_seconds=round(ls.trace_seconds, 4),
        lower_seconds=round(ls.lower_seconds, 4),
        compile_seconds=round(seconds, 4),
        cost=cost,
        cost_loop_scale=round(ls.loop_scale, 6),
        memory=memory,
        kernels=kernels_in(hlo, ls.kernel_names),
        schedule=schedule_of(hlo),
        host_callbacks=host_callbacks(hlo),
    )
    return CompiledStage(plan=plan, payload=payload, evidence=evidence, compiled=compiled)


def shared_stage(ls: LoweredStage, compiled: CompiledStage) -> CompiledStage:
    """``ls`` as the executable ``compiled`` already is (the same program, _share.py): its blob and
    evidence, with ``ls``'s own trace and lower times and no compile time of its own."""
    evidence = compiled.evidence.model_copy(
        update={
            "trace_seconds": round(ls.trace_seconds, 4),
            "lower_seconds": round(ls.lower_seconds, 4),
            "compile_seconds": 0.0,
        }
    )
    return CompiledStage(plan=ls.plan, payload=compiled.payload, evidence=evidence, compiled=compiled.compiled)


def _xla_compile(ls: LoweredStage, compiler_options: dict[str, Any]) -> Compiled:
    """``ls.lowered`` compiled under ``compiler_options``; XLA's refusal as DoesNotFit or CompileError."""
    plan = ls.plan
    try:
        return ls.lowered.compile(compiler_options=dict(compiler_options))
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        if "RESOURCE_EXHAUSTED" in msg and "memory" in msg.lower():
            first = next((line for line in msg.splitlines() if "memory" in line.lower()), msg)[:400]
            raise DoesNotFit(
                f"stage {plan.stage}/{plan.bucket} does not fit the device: XLA refused it at compile ({first.strip()}). "
                "Nothing was published. Options: a smaller bucket (fewer frames per chunk), the weights sharded "
                "(fsdp), or the frame-aligned attention kernel (--set attention_kernel=blocksparse)"
            ) from None
        hint = ""
        if "No such compile option" in msg:
            hint = " — the flag profile names an option this XLA does not know; fix or remove it in manifests/flags/"
        elif "autotune_cache_hit_required" in msg or "Failed to get configs for" in msg:
            hint = (
                " — the autotune results lack a config for this program (measured for other programs, another "
                "GPU or another XLA?): measure them again on the build's GPUs (avatar-release autotune BUILD "
                "there), or accept XLA's defaults for what is missing (--allow-incomplete)"
            )
        raise CompileError(f"stage {plan.stage}/{plan.bucket}: XLA compile failed: {msg[:500]}{hint}") from None


def _xla_cost(compiled: Compiled) -> dict[str, float]:
    """XLA's ``cost_analysis()`` (each loop body counted once), its plain numeric entries; {} if it has none."""
    cost: dict[str, float] = {}
    try:
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        cost = {k: float(v) for k, v in (ca or {}).items() if "{" not in k and isinstance(v, (int, float))}
    except Exception:  # noqa: BLE001
        pass
    return cost


def _xla_memory(compiled: Compiled) -> dict[str, int]:
    """XLA's ``memory_analysis()`` sizes, in bytes, by name without the ``_in_bytes`` suffix."""
    memory: dict[str, int] = {}
    try:
        ma = compiled.memory_analysis()
        for name in (
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "temp_size_in_bytes",
            "alias_size_in_bytes",
            "generated_code_size_in_bytes",
        ):
            if hasattr(ma, name):
                memory[name.removesuffix("_in_bytes")] = int(getattr(ma, name))
    except Exception:  # noqa: BLE001
        pass
    return memory


def _run_cost(ls: LoweredStage, hlo: str) -> dict[str, float]:
    """The per-run figures (every loop counted as it turns) of the compiled HLO; {} where they cannot be had."""
    plan = ls.plan
    try:
        estimates = {r.program_kernel: r.estimate for r in plan.routes.values() if r.program_kernel and r.estimate}
        return run_cost(hlo, devices=ls.devices, kernel_estimates=estimates).as_cost()
    except Exception:  # noqa: BLE001 - evidence, not a condition of the build: cost.py falls back
        return {}
