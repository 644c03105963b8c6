"""What differs between two builds: the release manager's first question before a promotion.

Both manifests are read through the registry (any two refs: channels, build ids, digests) and
compared field by field in sections: the build itself, toolchain, platform, flags, overrides,
config, inputs (source and weights digests), executables (by key: HLO digest, sizes, cost
estimates, memory) and gates (the verdict promotion sees and what it was compared with).
Nothing is loaded or verified: a diff is read-only and cheap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..gates import effective_status
from ..gates.compile_gate import load_compile_gate
from ..records import ExecutableEntry, Manifest
from ..registry import Registry, Resolved, read_manifest

__all__ = ["Difference", "BuildDiff", "diff_builds", "SECTIONS"]

SECTIONS = ("build", "toolchain", "platform", "flags", "overrides", "config", "inputs", "executables", "gates")
_ABSENT = None  # a field one side does not have (an override the other did not set, a missing executable)


@dataclass(frozen=True)
class Difference:
    """One field whose value is not the same in A and B (``None``: that side has no such field)."""

    section: str
    key: str
    a: Any
    b: Any

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "key": self.key, "a": self.a, "b": self.b}


@dataclass(frozen=True)
class BuildDiff:
    """Every field that differs between A and B, and how many agree per section."""

    a: Resolved
    b: Resolved
    differences: list[Difference] = field(default_factory=list)
    same: dict[str, int] = field(default_factory=dict)  # section -> fields that agree

    @property
    def substantive(self) -> list[Difference]:
        """The differences outside bookkeeping (build id, when, by whom, seal) and gate verdicts."""
        return [d for d in self.differences if d.section != "gates" and d.key not in _BOOKKEEPING]

    @property
    def identical(self) -> bool:
        """The same binary and inputs: only bookkeeping and gate verdicts differ."""
        return not self.substantive

    def to_json(self) -> dict[str, Any]:
        side = lambda r: {"ref": r.ref, "build_id": r.build_id, "digest": r.digest}  # noqa: E731
        return {
            "a": side(self.a),
            "b": side(self.b),
            "identical": self.identical,
            "differences": [d.to_json() for d in self.differences],
            "same": dict(self.same),
        }


_BOOKKEEPING = ("build_id", "created_at", "created_by", "seal")


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Nested dicts as dotted keys; lists and scalars as leaves."""
    if isinstance(value, Mapping):
        for k in sorted(value):
            yield from _flat(f"{prefix}.{k}" if prefix else str(k), value[k])
    else:
        yield prefix, value


def _executable_fields(e: ExecutableEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": e.format,
        "hlo_digest": e.hlo_digest,
        "fingerprint": e.fingerprint,
        "raw_digest": e.raw_digest,
        "raw_size": e.raw_size,
        "stored_size": e.blob.size,
        "params": len(e.params),
        "inputs": [f"{a.name}{a.shape}" for a in e.inputs],
        "outputs": [f"{a.name}{a.shape}" for a in e.outputs],
    }
    out |= {f"cost.{k}": v for k, v in sorted(e.cost.items())}
    out |= {f"memory.{k}": v for k, v in sorted(e.memory.items())}
    out["kernels"] = sorted(k.name for k in e.kernels)
    return out


def _gate_fields(registry: Registry, build_id: str) -> dict[str, Any]:
    status, result, _ = effective_status(registry, build_id)
    compiled = load_compile_gate(registry, build_id)
    against = None
    if result is not None:
        against = result.baseline.build_id if result.baseline is not None else "nothing (--baseline none)"
    return {
        "status": status,
        "compared_with": against,
        "tier": None if result is None else result.tier,
        "compile_gate": None if compiled is None else compiled.status,
    }


def _sections(registry: Registry, m: Manifest) -> dict[str, dict[str, Any]]:
    weights = m.weights
    inputs = {
        "source_digest": m.source_digest,
        "weights.raw_digest": weights.raw_digest,
        "weights.raw_size": weights.raw_size,
        "weights.tensors": weights.tensors,
        "weights.source": weights.source,
        "weights.chunking": weights.chunking,
        "weights.chunks": None if weights.chunks is None else len(weights.chunks),
    }
    executables = {f"{e.key}.{k}": v for e in m.executables for k, v in _executable_fields(e).items()}
    executables |= {f"{e.key}": "present" for e in m.executables}
    return {
        "build": {
            "build_id": m.build_id,
            "pipeline": m.pipeline,
            "target": m.target,
            "model_entry": m.model_entry,
            "identity": m.identity,
            "seal": m.seal,
            "schema_version": m.schema_version,
            "created_at": m.created_at,
            "created_by": m.created_by,
            "buckets": [f"{b.name}:{b.frames}x{b.height}x{b.width}" for b in m.buckets],
        },
        "toolchain": m.toolchain.model_dump(mode="json"),
        "platform": m.platform.model_dump(mode="json"),
        "flags": dict(_flat("", m.flags.model_dump(mode="json"))),
        "overrides": dict(_flat("", m.overrides)),
        "config": dict(_flat("", m.config)),
        "inputs": inputs,
        "executables": executables,
        "gates": _gate_fields(registry, m.build_id),
    }


def diff_builds(registry: Registry, a: str, b: str) -> BuildDiff:
    """Compare builds ``a`` and ``b`` (any refs) field by field; see the module's docstring."""
    ra, ma = read_manifest(registry, a)
    rb, mb = read_manifest(registry, b)
    sa, sb = _sections(registry, ma), _sections(registry, mb)
    out: list[Difference] = []
    same: dict[str, int] = {}
    for section in SECTIONS:
        left, right = sa[section], sb[section]
        keys = sorted(set(left) | set(right), key=lambda k: (k.split(".")[0], k))
        agree = 0
        for k in keys:
            va, vb = left.get(k, _ABSENT), right.get(k, _ABSENT)
            if va == vb:
                agree += 1
            else:
                out.append(Difference(section, k, va, vb))
        same[section] = agree
    return BuildDiff(ra, rb, out, same)
