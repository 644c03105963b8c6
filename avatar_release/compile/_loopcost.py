"""The cost of a compiled program as it runs: every while loop counted as often as it turns.

XLA's ``cost_analysis()`` counts a while loop's body once. A compiled stage has loops the traced
program cannot see: the scanned block stack, but also loops the partitioner writes itself
(windowed einsums, collective matmuls) and loops inside fusions. A single scale factor from the
traced jaxpr (``_flops.loop_scale``) multiplies everything, the work outside the loops included,
and misses the partitioner's loops entirely: measured on ``avatar-720p``'s DiT, it over-counted
the weights' stacking copy 36 times and under-counted the windowed einsums 4 times.

Here XLA's own ``HloCostAnalysis`` is run again, through the host's CPU client (it analyses any
HLO module, whatever backend compiled it), on each loop body of the compiled program, made the
module's entry in turn. Each loop's trip count comes from the loop (``known_trip_count``) or its
condition (``i < N``, counting from 0); a loop whose count cannot be read is counted once and
listed. Pallas kernels (Mosaic custom calls) are opaque to the generic analysis; their own
``CostEstimate`` (in the custom call's backend config) is added, times the loops around them.
XLA:GPU's cuDNN convolutions and Pallas-on-Triton kernels are custom calls too, which the generic
analysis counts as nothing: each is charged its operands and result (read and written once), a
convolution its flops (2 x output elements x the kernel's window and input features, from the
call's ``dim_labels`` and operand shapes), and a Triton kernel the estimate its pipeline declared
for one call (``kernel_estimates``, by kernel name; its bytes then replace the operand count).
An async call (an all-gather offloaded to the SparseCore) has its result counted by XLA at the
start and again at the done; it is counted once here.

A compiler estimate, like the rest: it counts what the scheduled program does, not what a
device measures.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._evidence import INSTR, HloText, collectives, hlo_array_bytes

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    from jaxlib.xla_client import Client

__all__ = ["RunCost", "run_cost", "PER_RUN_KEYS"]

KEYS = ("flops", "bytes accessed", "transcendentals")
# Bytes arriving at one device through collectives, all of them / those the schedule leaves
# exposed (nothing computed while they are in flight), every loop counted as it turns.
COLLECTIVE_KEYS = ("collective bytes", "exposed collective bytes")
# Stored beside XLA's own figures in an executable's ``cost`` record.
PER_RUN_KEYS = {k: f"{k} per run" for k in KEYS + COLLECTIVE_KEYS}

_WHILE = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=.*?\swhile\((.*)$")
_COND_BODY = re.compile(r"condition=%([\w.\-]+), body=%([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_CALLS = re.compile(r"(?:calls|to_apply)=%([\w.\-]+)|branch_computations=\{([^}]*)\}")
_STACK_FRAME = re.compile(r",?\s*stack_frame_id=\d+")
_COST_ESTIMATE = re.compile(r'"cost_estimate"\s*:\s*(\{[^{}]*\})')
_CALL_DONE = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.*?)\scall-done\(")


@dataclass
class RunCost:
    """Trip-weighted flops, bytes and transcendentals of one program, per device."""

    flops: float
    bytes_accessed: float
    transcendentals: float
    loops: list[tuple[str, int | None]] = field(default_factory=list)  # (body, trips; None: unknown)
    kernels: int = 0  # Pallas call sites whose CostEstimate was added (each counted once)
    collective_bytes: float = 0.0  # arriving at one device, per run
    exposed_collective_bytes: float = 0.0  # of which nothing was scheduled to compute beside

    @property
    def unknown_loops(self) -> list[str]:
        return [body for body, trips in self.loops if trips is None]

    def as_cost(self) -> dict[str, float]:
        return {
            PER_RUN_KEYS["flops"]: self.flops,
            PER_RUN_KEYS["bytes accessed"]: self.bytes_accessed,
            PER_RUN_KEYS["transcendentals"]: self.transcendentals,
            PER_RUN_KEYS["collective bytes"]: self.collective_bytes,
            PER_RUN_KEYS["exposed collective bytes"]: self.exposed_collective_bytes,
        }


class _Module(HloText):
    """A scheduled HLO module's text (stack-frame ids dropped: they name a table the module text
    carries in a form the parser warns about when a computation is made the entry)."""

    def __init__(self, text: str):
        super().__init__(_STACK_FRAME.sub("", text))
        if not self.entry:
            raise ValueError("no ENTRY computation in the HLO text")

    def as_entry(self, name: str) -> str:
        """The module text with ``name`` as its entry (the header's entry layout dropped)."""
        lines = list(self.lines)
        lines[0] = "HloModule loop_cost"
        lines[self.spans[self.entry][0]] = lines[self.spans[self.entry][0]].replace("ENTRY ", "", 1)
        lines[self.spans[name][0]] = "ENTRY " + lines[self.spans[name][0]]
        return "\n".join(lines)

    def callees(self, name: str) -> set[str]:
        """Computations ``name`` calls outright (fusions, calls, branches; not loop bodies)."""
        out = set()
        for line in self.body(name):
            for single, branches in _CALLS.findall(line):
                out.update([single] if single else re.findall(r"%([\w.\-]+)", branches))
        return out & set(self.spans)


def _trips(module: _Module, line: str, condition: str) -> int | None:
    m = _TRIP.search(line)
    if m:
        return int(m.group(1))
    cond = "\n".join(module.body(condition))
    if "direction=LT" not in cond:
        return None
    bounds = [int(x) for x in re.findall(r"\bconstant\((\d+)\)", cond)]
    return max(bounds) if bounds else None


_CUDNN_CONV = re.compile(r'custom_call_target="__cudnn\$conv(?:Forward|BiasActivationForward)"')
_DIM_LABELS = re.compile(r"dim_labels=\w+_(\w+)->\w+")
_DIMS = re.compile(r"\[([\d,]*)\]")


def _conv_flops(line: str, shapes: dict[str, str]) -> float:
    """Flops of one cuDNN forward convolution: 2 x output elements x (window x input features),
    the kernel's dims other than its output feature ("o" in the rhs dim labels). 0 when unreadable."""
    m, labels = INSTR.match(line), _DIM_LABELS.search(line)
    if not m or not labels:
        return 0.0
    operands = re.findall(r"%([\w.\-]+)", m.group(4).split(")")[0])
    out, kernel = _DIMS.search(m.group(2)), _DIMS.search(shapes.get(operands[1], "")) if len(operands) > 1 else None
    if not out or not kernel:
        return 0.0
    dims = [int(d) for d in kernel.group(1).split(",") if d]
    if len(dims) != len(labels.group(1)):
        return 0.0
    window = math.prod(size for label, size in zip(labels.group(1), dims) if label != "o")
    elements = math.prod(int(size) for size in out.group(1).split(",") if size)
    return 2.0 * elements * window


_TRITON_CALL = 'custom_call_target="__gpu$xla.gpu.triton"'
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _io_bytes(line: str, shapes: dict[str, str]) -> float:
    """Bytes a custom call reads and writes once: its operands and its result (a cuDNN call's u8
    workspace excluded)."""
    m = INSTR.match(line)
    if not m:
        return 0.0
    operands = re.findall(r"%([\w.\-]+)", m.group(4).split(")")[0])
    result = re.sub(r",?\s*u8\[\d*\]\{[\d,]*\}", "", m.group(2))
    return float(hlo_array_bytes(result) + sum(hlo_array_bytes(shapes.get(o, "")) for o in operands))


def _triton_name(line: str) -> str:
    m = _OP_NAME.search(line)
    parts = m.group(1).split("/") if m else []
    return next((parts[i - 1] for i, part in enumerate(parts) if part.startswith("pallas_call") and i), "")


def _kernel_costs(
    module: _Module, name: str, estimates: Mapping[str, Mapping[str, float]] | None = None
) -> tuple[dict[str, float], int]:
    """The CostEstimates of the Pallas calls written directly in computation ``name``; for its
    cuDNN convolutions and Triton kernels, their operand and result bytes and their flops (a
    convolution's counted, a Triton kernel's from ``estimates``)."""
    total, n = dict.fromkeys(KEYS, 0.0), 0
    body = module.body(name)
    shapes = {m.group(1): m.group(2) for m in map(INSTR.match, body) if m}
    for line in body:
        if _CUDNN_CONV.search(line):
            total["flops"] += _conv_flops(line, shapes)
            total["bytes accessed"] += _io_bytes(line, shapes)
            continue
        if _TRITON_CALL in line:
            est = (estimates or {}).get(_triton_name(line))
            total["bytes accessed"] += (
                float(est["bytes accessed"]) if est and "bytes accessed" in est else _io_bytes(line, shapes)
            )
            if est:
                total["flops"] += float(est.get("flops", 0))
                total["transcendentals"] += float(est.get("transcendentals", 0))
                n += 1
            continue
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        m = _COST_ESTIMATE.search(line.replace('\\"', '"'))
        if not m:
            continue
        est = json.loads(m.group(1))
        total["flops"] += float(est.get("flops", 0))
        total["bytes accessed"] += float(est.get("bytes_accessed", 0))
        total["transcendentals"] += float(est.get("transcendentals", 0))
        n += 1
    return total, n


def _async_results(module: _Module, name: str) -> float:
    """Bytes XLA counts twice in ``name``: the result of each async call (an all-gather offloaded
    to the SparseCore runs as call-start / call-done), counted at its start and again at its done.
    Measured on a v6e-8 compile: the difference with the offload on is exactly the gathered bytes."""
    return float(sum(hlo_array_bytes(m.group(1)) for m in map(_CALL_DONE.match, module.body(name)) if m))


def _collective_bytes(module: _Module, name: str, devices: int) -> tuple[float, float]:
    """(all, exposed) bytes arriving at one device through the collectives written in ``name``."""
    if devices <= 1:
        return 0.0, 0.0
    found = collectives(module, name)
    return (
        sum(c.arriving_bytes(devices) for c in found),
        sum(c.arriving_bytes(devices) for c in found if not c.hidden),
    )


def _kernels_within(
    module: _Module,
    name: str,
    seen: frozenset = frozenset(),
    estimates: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[dict[str, float], int]:
    """Pallas estimates in ``name`` and the computations it calls outright (loops excluded)."""
    total, n = _kernel_costs(module, name, estimates)
    for callee in module.callees(name) - seen - {name}:
        inner, m = _kernels_within(module, callee, seen | {name}, estimates)
        for k in KEYS:
            total[k] += inner[k]
        n += m
    return total, n


def _cost_analysis(client: Client | None) -> Callable[[str], Mapping[str, float]]:
    """XLA's own cost analysis of an HLO module's text, on ``client`` (default: the CPU client)."""
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax
    from jax._src.lib import xla_client

    # jaxlib ships no stub for its private _hlo extension (the HLO text parser), only the module itself
    from jaxlib import _hlo  # type: ignore[attr-defined]

    client = client or jax.devices("cpu")[0].client

    def analyse(text: str) -> Mapping[str, float]:
        return xla_client._xla.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(text))

    return analyse


def _loops_in(module: _Module, name: str, seen: frozenset) -> Iterator[tuple[str, int | None]]:
    """The while loops computation ``name`` runs, as (body, known trip count); a body already being
    counted further up the call chain (in ``seen``) is skipped."""
    for line in module.body(name):
        m = _WHILE.match(line)
        if not m:
            continue
        cb = _COND_BODY.search(m.group(1))
        if not cb or cb.group(2) in seen:
            continue
        condition, body = cb.groups()
        yield body, _trips(module, line, condition)


def run_cost(
    hlo_text: str,
    client: Client | None = None,
    *,
    devices: int = 1,
    kernel_estimates: Mapping[str, Mapping[str, float]] | None = None,
) -> RunCost:
    """Trip-weighted cost of a compiled module's HLO text (``compiled.as_text()``), and the bytes
    its collectives bring to each of ``devices`` devices (hidden or exposed by the schedule).
    ``kernel_estimates``: one call's cost, by kernel name, for kernels with no estimate in the program."""
    analyse = _cost_analysis(client)
    module = _Module(hlo_text)
    generic: dict[str, dict[str, float]] = {}
    loops: list[tuple[str, int | None]] = []
    kernels = 0

    def once(name: str) -> dict[str, float]:
        """XLA's count of ``name`` run once, each loop inside it counted once (its own rule)."""
        if name not in generic:
            raw = analyse(module.as_entry(name))
            generic[name] = {k: max(float(raw.get(k, 0.0)), 0.0) for k in KEYS}
        return generic[name]

    def full(name: str, seen: frozenset = frozenset()) -> dict[str, float]:
        nonlocal kernels
        cost = dict(once(name))
        own, n = _kernels_within(module, name, estimates=kernel_estimates)
        kernels += n
        for k in KEYS:
            cost[k] += own[k]
        cost["bytes accessed"] -= _async_results(module, name)
        cost["collective bytes"], cost["exposed collective bytes"] = _collective_bytes(module, name, devices)
        for body, trips in _loops_in(module, name, seen):
            loops.append((body, trips))
            inner, counted = full(body, seen | {name}), dict(once(body))
            counted["bytes accessed"] -= _async_results(module, body)  # as counted inside `inner`
            for k in KEYS:  # replace the once-counted body (XLA's rule) by body x trips
                cost[k] += (trips or 1) * inner[k] - counted[k]
            for k in COLLECTIVE_KEYS:  # counted here per computation: add the body's, x trips
                cost[k] += (trips or 1) * inner[k]
        return cost

    total = full(module.entry)
    return RunCost(
        total["flops"],
        total["bytes accessed"],
        total["transcendentals"],
        loops,
        kernels,
        total["collective bytes"],
        total["exposed collective bytes"],
    )
