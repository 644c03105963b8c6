"""What a compiled program proves about itself, read from its scheduled HLO and XLA's analyses.

* ``kernels_in``: the Pallas kernels it contains: Mosaic custom calls on TPU (with the compiler
  flags each one carries in its backend config), Triton custom calls on GPU (with the warps and
  pipeline stages they were lowered for), or the Pallas interpreter's loops elsewhere.
* ``schedule_of``: its all-to-alls. On TPU, with async all-to-all enabled, XLA emits
  ``all-to-all-start`` / ``all-to-all-done`` pairs and schedules other work between them where
  it can; a pair with nothing between is turned back into a synchronous ``all-to-all`` (it keeps
  an ``async_collective_name`` attribute). Hidden = a pair with compute scheduled inside it.
* ``memory_fit``: per-device bytes of the whole pipeline against the device's capacity.
* ``host_callbacks``: custom calls that call back into the Python host (never allowed on the
  serving path: they cannot be serialised, and they stall the device).

All of it is text analysis of the compiled program: compiler evidence, not measurements.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .._dtypes import itemsize
from ..records import ArraySpec, ExecutableEntry, KernelRecord, MemoryFit, ScheduleRecord

__all__ = ["kernels_in", "schedule_of", "memory_fit", "per_device_bytes", "host_callbacks", "COMPUTE_OPCODES"]

# "%name = <shape> opcode(operands), attrs..." — one instruction per line in HLO text.
INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s")
# Instructions that do work on the device's compute units (anything that is not data
# movement, bookkeeping or another collective). A pair with one of these inside is hidden.
COMPUTE_OPCODES = frozenset(
    {
        "fusion",
        "convolution",
        "dot",
        "custom-call",
        "reduce",
        "reduce-window",
        "select-and-scatter",
        "scatter",
        "gather",
        "sort",
        "map",
        "add",
        "multiply",
        "subtract",
        "divide",
        "exponential",
        "while",
        "conditional",
        "call",
        "rng",
        "cholesky",
        "triangular-solve",
        "fft",
    }
)
_HOST_CALLBACK_TARGETS = (
    "xla_python_cpu_callback",
    "xla_python_gpu_callback",
    "xla_ffi_python_cpu_callback",
    "xla_ffi_python_gpu_callback",
    "xla_ffi_partitioned_python_cpu_callback",
)


class HloText:
    """One HLO module's text, split into its named computations (instruction lines in order)."""

    def __init__(self, text: str):
        self.lines = text.split("\n")
        self.spans: dict[str, tuple[int, int]] = {}  # name -> (header line, closing line)
        self.entry = ""
        current = None
        for i, line in enumerate(self.lines):
            if current is None:
                m = _HEAD.match(line)
                if m and line.rstrip().endswith("{") and "=" not in line.split("(")[0]:
                    current = (m.group(2), i)
                    if m.group(1):
                        self.entry = m.group(2)
            elif line.startswith("}"):
                self.spans[current[0]] = (current[1], i)
                current = None

    def body(self, name: str) -> list[str]:
        start, end = self.spans[name]
        return self.lines[start + 1 : end]


# Collectives, by what arrives at one device of a group of P: (P - 1) / P of the result for the
# gathering kinds, twice that for an all-reduce (reduce-scatter, then all-gather), the whole
# buffer for a collective-permute.
_GATHERING = ("all-gather", "all-to-all", "reduce-scatter")
_REDUCING = ("all-reduce",)
_MOVING = ("collective-permute",)
_COLLECTIVES = _GATHERING + _REDUCING + _MOVING


@dataclass(frozen=True)
class Collective:
    """One collective as the schedule leaves it, in one computation."""

    kind: str  # "all-gather", "all-to-all", ...
    result: str  # the shape text of what it hands on (a done's result, or a synchronous op's)
    synchronous: bool
    hidden: bool  # an async pair with compute scheduled between its start and done

    def arriving_bytes(self, devices: int) -> float:
        """Bytes that arrive at one of ``devices`` devices."""
        n = hlo_array_bytes(self.result)
        if self.kind in _REDUCING:
            return 2.0 * n * (devices - 1) / devices
        return float(n) if self.kind in _MOVING else n * (devices - 1) / devices


def hlo_array_bytes(shape_text: str) -> int:
    """Bytes of every array in an HLO shape text ("(bf16[8,128]{1,0}, f32[4])" -> 2064)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        bits = 8 if dtype == "pred" else (16 if dtype == "bf16" else int(dtype[1:]))
        total += math.prod(int(d) for d in dims.split(",") if d) * bits // 8
    return total


_ARRAY = re.compile(r"\b(pred|[subf]\d+|bf16)\[([\d,]*)\]")


def _collective_kind(hlo: HloText, opcode: str, rest: str) -> str | None:
    base = opcode.removesuffix("-start").removesuffix("-done")
    if base in _COLLECTIVES:
        return base
    if opcode == "call-start" and 'async_execution_thread="sparsecore"' in rest:  # an offloaded collective
        called = re.search(r"to_apply=%([\w.\-]+)", rest)
        if called and called.group(1) in hlo.spans:
            for line in hlo.body(called.group(1)):
                m = INSTR.match(line)
                if m and m.group(3) in _COLLECTIVES:
                    return m.group(3)
    return None


def collectives(hlo: HloText, name: str) -> list[Collective]:
    """The collectives written directly in computation ``name``, in its scheduled order. An
    async pair (``*-start`` / ``*-done``, or a call offloaded to the SparseCore) with compute
    scheduled between is hidden; a synchronous collective, or a pair with nothing between, is
    exposed. (With async all-to-all enabled, XLA turns a pair with nothing between back into a
    synchronous ``all-to-all``.)"""
    out: list[Collective] = []
    open_pairs: dict[str, list] = {}  # start name -> [kind, compute ops seen since]
    for line in hlo.body(name):
        m = INSTR.match(line)
        if not m:
            continue
        instr, shape, opcode, rest = m.groups()
        if opcode.endswith("-done"):
            operand = re.match(r"\s*%([\w.\-]+)", rest)
            pair = open_pairs.pop(operand.group(1), None) if operand else None
            if pair is not None:
                out.append(Collective(pair[0], shape, synchronous=False, hidden=pair[1] > 0))
            continue
        kind = _collective_kind(hlo, opcode, rest)
        if kind is not None and opcode.endswith("-start"):
            open_pairs[instr] = [kind, 0]
        elif kind is not None:
            out.append(Collective(kind, shape, synchronous=True, hidden=False))
        elif opcode in COMPUTE_OPCODES:
            for pair in open_pairs.values():
                pair[1] += 1
    return out


def schedule_of(hlo: str) -> ScheduleRecord:
    """The all-to-alls of a scheduled program, each occurrence once (loops not multiplied)."""
    text = HloText(hlo)
    found = [c for name in text.spans for c in collectives(text, name) if c.kind == "all-to-all"]
    pairs = sum(not c.synchronous for c in found)
    hidden = sum(c.hidden for c in found)
    synchronous = len(found) - pairs
    return ScheduleRecord(
        all_to_alls=pairs + synchronous,
        async_pairs=pairs,
        synchronous=synchronous,
        hidden=hidden,
        exposed=pairs - hidden + synchronous,
    )


_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _kernel_name(line: str) -> str:
    """The pallas_call's name: the path component before ``pallas_call`` in the op name."""
    m = _OP_NAME.search(line)
    if m:
        parts = m.group(1).split("/")
        for i, part in enumerate(parts):
            if part.startswith("pallas_call") and i > 0:
                return parts[i - 1]
    head = INSTR.match(line)
    return re.sub(r"\.\d+$", "", head.group(1)) if head else "pallas_call"


def _mosaic_flags(line: str) -> dict:
    m = re.search(r"backend_config=(\{.*\})\s*(?:,\s*\w+=|$)", line)
    flags: dict = {}
    if not m:
        return flags
    text = m.group(1)
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        config = None
    if isinstance(config, dict):
        for f in config.get("flag_configs", []):
            value = f.get("value", {})
            flags[f.get("flag_type", "?")] = next(iter(value.values())) if len(value) == 1 else value
        return flags
    for name, value in re.findall(r'"flag_type":"([A-Z0-9_]+)","value":\{"\w+":([^}]*)\}', text):
        flags[name] = json.loads(value) if value in ("true", "false") or value.lstrip("-").isdigit() else value
    return flags


def _triton_params(line: str) -> dict:
    """What a Pallas-on-Triton call was lowered with (its typed backend config: ``num_warps = 4 : i32``)."""
    return {k: int(v) for k, v in re.findall(r"\b(num_warps|num_stages) = (\d+) : i32", line)}


def kernels_in(hlo: str, names: tuple[str, ...] | list[str] = ()) -> list[KernelRecord]:
    """Pallas kernels in a compiled program, by name, with their Mosaic flags (TPU) or Triton
    launch parameters (GPU).

    A Mosaic kernel is one ``tpu_custom_call`` per call site, named in its backend config; a
    Pallas kernel lowered through Triton is one ``__gpu$xla.gpu.triton`` custom call per call site,
    named by its op name (``.../<kernel>/pallas_call``). An interpreted kernel (CPU) is inlined as
    ordinary loops; it is found by its name scope, given the ``names`` the traced program's
    ``pallas_call``s carry, and its call sites are not counted.
    """
    mosaic: dict[str, list[dict]] = {}
    triton: dict[str, list[dict]] = {}
    interpreted: set[str] = set()
    for line in hlo.splitlines():
        if 'custom_call_target="tpu_custom_call"' in line:
            mosaic.setdefault(_kernel_name(line), []).append(_mosaic_flags(line))
            continue
        if 'custom_call_target="__gpu$xla.gpu.triton"' in line:
            triton.setdefault(_kernel_name(line), []).append(_triton_params(line))
            continue
        m = _OP_NAME.search(line)
        if m:
            interpreted.update(k for k in names if f"/{k}/" in m.group(1))
    records = [
        KernelRecord(name=n, backend="mosaic", count=len(fl), flags=_common(fl)) for n, fl in sorted(mosaic.items())
    ]
    records += [
        KernelRecord(name=n, backend="triton", count=len(fl), flags=_common(fl)) for n, fl in sorted(triton.items())
    ]
    records += [
        KernelRecord(name=n, backend="interpret", count=None) for n in sorted(interpreted - set(mosaic) - set(triton))
    ]
    return records


def _common(flag_sets: list[dict]) -> dict:
    """Flags every call site of a kernel carries (a site without them shows as absent)."""
    if not flag_sets:
        return {}
    keys = set(flag_sets[0]).intersection(*flag_sets[1:])
    return {k: flag_sets[0][k] for k in sorted(keys) if all(f[k] == flag_sets[0][k] for f in flag_sets)}


def host_callbacks(hlo: str) -> list[str]:
    """Custom-call targets in the program that call back into Python on the host."""
    found = re.findall(r'custom_call_target="([^"]+)"', hlo)
    return sorted({t for t in found if t in _HOST_CALLBACK_TARGETS or "callback" in t})


def per_device_bytes(spec: ArraySpec, mesh_size: int) -> int:
    """Bytes one device holds of an array with this sharding (one mesh axis)."""
    total = math.prod(spec.shape) * itemsize(spec.dtype)
    return total // mesh_size if any(s is not None for s in spec.sharding) else total


def memory_fit(entries: Sequence[ExecutableEntry], capacity: int, mesh_size: int, weight_sharding: str) -> MemoryFit:
    """Every stage's weights resident at once; the largest stage working set on top of them."""
    weights: dict[str, int] = {}
    for e in entries:  # buckets of a stage share its weights
        weights.setdefault(e.stage, sum(per_device_bytes(p, mesh_size) for p in e.params))
    peak_key, peak = "", -1
    for e in entries:
        m = e.memory
        working = (
            m.get("argument_size", 0)
            - weights[e.stage]
            + m.get("output_size", 0)
            + m.get("temp_size", 0)
            + m.get("generated_code_size", 0)
            - m.get("alias_size", 0)
        )
        if working > peak:
            peak_key, peak = e.key, working
    resident = sum(weights.values())
    total = resident + max(peak, 0)
    return MemoryFit(
        capacity_bytes=capacity,
        weights_bytes=resident,
        peak_stage=peak_key,
        peak_working_bytes=max(peak, 0),
        total_bytes=total,
        fits=total <= capacity,
        weight_sharding=weight_sharding,
    )
