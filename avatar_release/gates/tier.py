"""Which tier a candidate is held to, decided from what differs from its baseline.

Tier 1 (bit-exact) is the default. A candidate is tier 2 (similarity band) only when every
difference from the baseline is a declared lever that changes reduction order or precision:
config overrides by key, as the pipeline declares them (its contract's ``levers``, recorded in
each build's manifest: an override counts only where the candidate *and* the baseline declare it
with the same effect), compiler options by name and the jax/jaxlib versions, as the project's
``manifests/levers.toml`` declares them. The decision and its reasons go into the gate result,
with the digest of that levers.toml (``GateResult.levers_digest``: a trust policy may pin it).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .._digest import sha256_digest
from ..errors import SpecError
from ..records import Manifest
from ..specs import SPECS_PAGE, manifests_dir, validate_levers

__all__ = ["TierDecision", "decide_tier", "load_levers", "read_levers", "levers_path"]


@dataclass(frozen=True)
class TierDecision:
    tier: int
    reasons: list[str] = field(default_factory=list)  # every difference, and how it was classed


def load_levers(path: Path | None = None) -> dict:
    return read_levers(path)[0]


def levers_path() -> Path:
    return manifests_dir() / "levers.toml"


def read_levers(path: Path | None = None) -> tuple[dict, str, Path]:
    """(the lever list, the digest of its bytes, its path): read once, so the digest a gate result
    names is of the very bytes that decided its tier."""
    path = path or levers_path()
    if not path.is_file():
        raise SpecError(
            f"{path}: missing; it declares which levers may be judged by the similarity band. With none "
            f"to declare, write one line, schema_version = 1 (`avatar-release specs schema levers`; "
            f"{SPECS_PAGE} > levers)"
        )
    data = path.read_bytes()
    try:
        doc = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None
    if doc.get("schema_version") != 1:
        raise SpecError(f"{path}: schema_version {doc.get('schema_version')!r}, this tool reads 1")
    validate_levers(doc, path)  # the fields compile checked (`avatar-release specs schema levers`)
    return doc, sha256_digest(data), path


def _declared_overrides(candidate: Manifest, baseline: Manifest) -> dict:
    """Override levers both builds' pipelines declared with the same effect (every manifest in the
    support window records them)."""
    mine, theirs = candidate.levers or {}, baseline.levers or {}
    return {
        k: {"effect": v.effect, "note": v.note} for k, v in mine.items() if k in theirs and theirs[k].effect == v.effect
    }


def decide_tier(candidate: Manifest, baseline: Manifest, levers: dict | None = None) -> TierDecision:
    levers = load_levers() if levers is None else levers
    known_overrides = _declared_overrides(candidate, baseline)
    known_options = levers.get("options", {})
    tier1: list[str] = []
    tier2: list[str] = []

    def same(what: str, a: object, b: object) -> None:
        if a != b:
            tier1.append(f"{what} differs ({b} -> {a}): not a declared lever, so tier 1")

    same("pipeline", candidate.pipeline, baseline.pipeline)
    same("target", candidate.target, baseline.target)
    same("model entry", candidate.model_entry, baseline.model_entry)
    same("source digest", candidate.source_digest, baseline.source_digest)
    same("weights", candidate.weights.raw_digest, baseline.weights.raw_digest)
    same("noise recipe", candidate.program.noise_recipe, baseline.program.noise_recipe)
    same("buckets", [b.model_dump() for b in candidate.buckets], [b.model_dump() for b in baseline.buckets])

    for key in sorted(set(candidate.overrides) | set(baseline.overrides)):
        a, b = candidate.overrides.get(key), baseline.overrides.get(key)
        if a == b:
            continue
        if key in known_overrides:
            tier2.append(f"override {key}: {b} -> {a} ({known_overrides[key].get('effect', 'declared')})")
        else:
            tier1.append(f"override {key}: {b} -> {a} is not a lever both builds' pipelines declare, so tier 1")
    if candidate.overrides == baseline.overrides:
        # Same overrides: the resolved configs must agree too (a changed default is a source change).
        same("model config", candidate.config, baseline.config)

    co, bo = candidate.flags.compiler_options, baseline.flags.compiler_options
    for name in sorted(set(co) | set(bo)):
        if co.get(name) == bo.get(name):
            continue
        if name in known_options:
            tier2.append(
                f"compiler option {name}: {bo.get(name)} -> {co.get(name)} ({known_options[name].get('effect')})"
            )
        else:
            tier1.append(f"compiler option {name}: {bo.get(name)} -> {co.get(name)} is not declared, so tier 1")
    same(
        "flag env/kernel flags",
        (candidate.flags.env_flags, candidate.flags.kernel_flags),
        (baseline.flags.env_flags, baseline.flags.kernel_flags),
    )

    for tool in ("jax", "jaxlib"):
        a, b = getattr(candidate.toolchain, tool), getattr(baseline.toolchain, tool)
        if a != b:
            if "toolchain" in levers:
                tier2.append(f"{tool} {b} -> {a} (toolchain: {levers['toolchain'].get('effect')})")
            else:
                tier1.append(f"{tool} {b} -> {a}: toolchain changes are not declared, so tier 1")

    if tier1:
        return TierDecision(1, tier1 + tier2)
    if tier2:
        return TierDecision(2, tier2)
    return TierDecision(1, ["no differences from the baseline that change numerics: bit-exact expected"])
