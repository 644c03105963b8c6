"""Declared, versioned specs under ``manifests/``: targets, flag profiles, pipelines.

Each is a TOML file with ``schema_version``; unknown fields are errors, and so are
unknown names, with the list of known ones.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .._config_files import describe_validation_error as describe_problems
from .._digest import canonical_json, sha256_digest
from .._suggest import did_you_mean
from ..errors import SpecError
from ._project import find_project

__all__ = [
    "TargetSpec",
    "FlagProfile",
    "PipelineSpec",
    "BucketSpec",
    "WeightsSpec",
    "GateSpec",
    "manifests_dir",
    "load_target",
    "TargetDescription",
    "target_description",
    "load_flag_profile",
    "load_pipeline",
    "list_specs",
    "describe_validation_error",
    "SPECS_PAGE",
]

SPEC_SCHEMA_VERSION = 1
# Where a spec error sends the user: a page of the docs site (not a path: docs/ is not in their project).
SPECS_PAGE = "docs site: Reference > Spec formats"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = Field(
        SPEC_SCHEMA_VERSION,
        ge=1,
        le=SPEC_SCHEMA_VERSION,
        description="the format's version; this avatar-release reads 1",
    )


_S = TypeVar("_S", bound=_Spec)


class TargetSpec(_Spec):
    """manifests/targets/<name>.toml: the devices a build is compiled for and the mesh it runs on."""

    name: str = Field(description="the file's name without .toml")
    platform: str = Field(description='"cpu", "tpu" or "gpu"')  # "cpu" | "tpu" | "gpu"
    device_count: int = Field(gt=0, description="devices one build runs on (the product of mesh_shape)")
    mesh_axes: list[str] = Field(description='names of the mesh axes, e.g. ["data"]')
    mesh_shape: list[int] = Field(description="devices along each axis, in mesh_axes' order")
    flag_profile: str = Field(description="a flag profile under manifests/flags/, by name")
    topology: str | None = Field(None, description='TPU/GPU topology, e.g. "2x4" or "1x1x8" (GPU: required)')
    # Device memory per device (bytes). When set, a build whose per-device working set does
    # not fit (XLA's memory_analysis) is refused at compile.
    hbm_bytes_per_device: int | None = Field(
        None, gt=0, description="device memory per device; set: a build that does not fit is refused at compile"
    )
    # Published peak rates of one device, for the compiler-estimate roofline in `analyze`.
    peak_flops_per_second: float | None = Field(None, gt=0, description="one device's published peak (analyze)")
    hbm_bytes_per_second: float | None = Field(None, gt=0, description="one device's memory bandwidth (analyze)")
    # Bytes per second that can arrive at one device over the interconnect: what a collective
    # the schedule leaves exposed costs in the estimate (its wire time, nothing computed beside).
    ici_bytes_per_second: float | None = Field(
        None, gt=0, description="interconnect bytes/s into one device (analyze: exposed collectives)"
    )
    # "fsdp": weights sharded over the mesh axis by their first dimension (the default);
    # "replicated": every device holds every weight (exists to measure what FSDP buys).
    weight_sharding: Literal["fsdp", "replicated"] = Field(
        "fsdp", description='"fsdp": weights sharded by their first dimension; "replicated": on every device'
    )
    # Compile a build's stages side by side in one process (threads). False where the compiler
    # is not safe doing so (see the target's own comment); serial is the fallback, not an error.
    concurrent_compile: bool = Field(True, description="compile stages side by side (false: one at a time)")
    # Environment defaults for compiling through a topology description on a host without the
    # devices (libtpu reads them at start-up instead of querying cloud metadata). Set only when
    # the variable is unset, before JAX starts.
    compile_env: dict[str, str] = Field(
        {}, description="environment defaults for compiling without the devices (set only when unset)"
    )
    # GPU targets: the target description XLA compiles for without the device (a
    # stream_executor.GpuTargetConfigProto in text form: a file under manifests/, e.g.
    # "gpu/h100_sxm.txtpb"), pinned by the sha256 of its bytes. load_target refuses a spec whose
    # file is missing or differs; the digest is part of this spec's digest and of the build identity.
    target_config: str | None = Field(
        None,
        description="GPU: the target description under manifests/, e.g. "
        '"gpu/h100_sxm.txtpb" (a GpuTargetConfigProto in text form)',
    )
    target_config_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="GPU: the sha256 of target_config's bytes"
    )

    def digest(self) -> str:
        """What gate evidence names: the spec as declared (a redefined target is another digest)."""
        doc = self.model_dump(mode="json")
        for key in _ADDED_WHEN_SET:  # absent, as before they existed: a CPU or TPU spec keeps its digest
            if doc[key] is None:
                del doc[key]
        return sha256_digest(canonical_json(doc))


# TargetSpec fields added on 2026-12-02 (GPU targets), in its digest only when set.
_ADDED_WHEN_SET = ("target_config", "target_config_sha256")


class FlagProfile(_Spec):
    """manifests/flags/<name>.toml: the compiler options and flags a target's builds compile with."""

    name: str = Field(description="the file's name without .toml")
    version: int = Field(description="bump it with every change (recorded in each build)")
    platform: str = Field(description='"cpu", "tpu" or "gpu": the platform the flags are for')
    compiler_options: dict[str, Any] = Field({}, description="XLA compiler options by name")
    env_flags: list[str] = Field([], description="XLA_FLAGS entries, e.g. --xla_cpu_enable_fast_math=false")
    kernel_flags: dict[str, Any] = Field({}, description="flags the pipeline's kernels read")

    def digest(self) -> str:
        return sha256_digest(canonical_json(self.model_dump(mode="json")))


class BucketSpec(_Spec):
    """One [[buckets]] table of a pipeline: a chunk shape compiled ahead of time."""

    name: str = Field(description='the bucket\'s name, e.g. "f8" (unique in the pipeline)')
    frames: int = Field(gt=0, description="frames per chunk of this shape")


class WeightsSpec(_Spec):
    """The [weights] table of a pipeline: where the build's weights come from."""

    # "init" (deterministic random from seed), "abstract" (shapes only: compile-only builds whose
    # weights are never materialised, e.g. production shapes), or a safetensors path.
    source: str = Field(
        "init",
        description='"init" (random from seed), "abstract" (shapes only, compile-only builds) or a .safetensors path',
    )
    seed: int = Field(0, description='the seed of "init" weights')


class GateSpec(_Spec):
    """The [gate] table of a pipeline: the gate set's requests for this spec's builds, where they
    differ from what the pipeline declares (e.g. a CI spec that renders fewer pairs)."""

    images: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="sample image variants (default: the pipeline's gate_requests)"
    )
    audio: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="sample audio variants (default: the pipeline's gate_requests)"
    )
    seed: int | None = Field(None, ge=0, description="the requests' seed (default: the pipeline's gate_requests)")

    @field_validator("images", "audio")
    @classmethod
    def _distinct(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"each variant once: {v}")
        return v


class PipelineSpec(_Spec):
    """manifests/pipelines/<name>.toml: the model a build compiles, through its entry, and its shapes."""

    name: str = Field(description="the file's name without .toml")
    entry: str = Field(description='the pipeline\'s entry, "package.module:attribute", imported from the project')
    config: str = Field(description="a model config the entry's configs mapping names")
    buckets: list[BucketSpec] = Field(description="[[buckets]] tables, one per chunk shape (at least one)")
    weights: WeightsSpec = Field(WeightsSpec(), description="the [weights] table")
    gate: GateSpec | None = Field(
        None, description="the [gate] table: the gate set's requests (default: the pipeline's)"
    )
    # "seeded": chunk noise from (request seed, chunk index); "entropy": fresh noise per request.
    noise: Literal["seeded", "entropy"] = Field(
        "seeded", description='"seeded": chunk noise from (request seed, chunk index); "entropy": fresh per request'
    )
    description: str = Field("", description="free text about the pipeline")


def manifests_dir() -> Path:
    """The project's ``manifests/`` folder (``AVATAR_RELEASE_MANIFESTS`` overrides where it is)."""
    project = find_project()
    path = project.manifests
    if not path.is_dir():
        raise SpecError(
            f"manifests folder {path} not found (project {project.root}, found {project.found_by}); it holds "
            "targets/, flags/ and pipelines/. Pass --project DIR or set AVATAR_RELEASE_MANIFESTS"
        )
    return path


def list_specs(kind: str) -> list[str]:
    d = manifests_dir() / kind
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def _load(kind: str, label: str, name: str, cls: type[_S]) -> _S:
    path = manifests_dir() / kind / f"{name}.toml"
    if "/" in name or name.startswith(".") or not path.is_file():
        specs = list_specs(kind)
        raise SpecError(
            f"unknown {label} {name!r}{did_you_mean(name, specs)} (known: {', '.join(specs) or 'none'}); "
            f"specs live in {path.parent}"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None
    try:
        spec = cls.model_validate(raw)
    except ValidationError as e:
        raise SpecError(f"{path}: {describe_validation_error(cls, e)}") from None
    named = getattr(spec, "name", name)
    if named != name:
        raise SpecError(f"{path}: name = {named!r} but the file is named {name!r}; make them agree")
    return spec


def describe_validation_error(cls: type[BaseModel], e: ValidationError) -> str:
    """Every problem pydantic found, in one message (``avatar_release._config_files``), then a
    pointer to the docs site's reference page."""
    return describe_problems(cls, e, f"`avatar-release specs schema` prints every field; {SPECS_PAGE}")


def load_target(name: str) -> TargetSpec:
    t = _load("targets", "target", name, TargetSpec)
    if len(t.mesh_axes) != len(t.mesh_shape) or _prod(t.mesh_shape) != t.device_count:
        raise SpecError(
            f"target {name}: mesh {dict(zip(t.mesh_axes, t.mesh_shape))} does not cover device_count {t.device_count}"
        )
    if t.platform == "gpu" or t.target_config is not None:
        target_description(t)  # present, inside manifests/, and the pinned bytes
    return t


@dataclass(frozen=True)
class TargetDescription:
    """A GPU target's description as the compiler reads it: the file, its text, its digest."""

    path: Path
    text: str
    digest: str  # "sha256:<hex>" of the file's bytes (what the build's platform records)


def target_description(t: TargetSpec) -> TargetDescription:
    """Read and check the target description a GPU target pins (SpecError naming the fix)."""
    where = f"target {t.name}"
    if t.platform != "gpu":
        raise SpecError(f"{where}: target_config is for GPU targets; platform {t.platform!r} takes none")
    if not t.target_config or not t.target_config_sha256 or not t.topology:
        raise SpecError(
            f"{where}: a GPU target names its target description and its sha256 "
            '(target_config = "gpu/<device>.txtpb", target_config_sha256 = "<hex>") and a topology '
            '("<slices>x<hosts>x<devices per host>", e.g. "1x1x8"); '
            f"`avatar-release specs schema target`, {SPECS_PAGE} > target"
        )
    root = manifests_dir().resolve()
    path = (root / t.target_config).resolve()
    if root not in path.parents or not path.is_file():
        raise SpecError(f"{where}: target_config {t.target_config!r} is not a file under {root}")
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != t.target_config_sha256:
        raise SpecError(
            f"{where}: {path} has sha256 {got}, the target pins {t.target_config_sha256}: the description "
            "changed; restore it, or pin the new file (a new digest is a new target: re-gate its builds)"
        )
    return TargetDescription(path, raw.decode(), "sha256:" + got)


def load_flag_profile(name: str) -> FlagProfile:
    return _load("flags", "flag profile", name, FlagProfile)


def load_pipeline(name: str) -> PipelineSpec:
    p = _load("pipelines", "pipeline", name, PipelineSpec)
    if not p.buckets:
        raise SpecError(
            f"pipeline {name}: declares no shape buckets; add one [[buckets]] table per chunk shape, "
            f'each with name (str) and frames (int > 0), e.g. [[buckets]] name = "f8" frames = 8 '
            f"({SPECS_PAGE})"
        )
    names = [b.name for b in p.buckets]
    if len(set(names)) != len(names):
        raise SpecError(f"pipeline {name}: duplicate bucket names {names}")
    return p


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
