"""Declared, versioned specs under ``manifests/``: targets, flag profiles, pipelines.

Each is a TOML file with ``schema_version``; unknown fields are errors, and so are
unknown names, with the list of known ones.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    "manifests_dir",
    "load_target",
    "TargetDescription",
    "target_description",
    "load_flag_profile",
    "load_pipeline",
    "list_specs",
]

SPEC_SCHEMA_VERSION = 1


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = Field(SPEC_SCHEMA_VERSION, ge=1, le=SPEC_SCHEMA_VERSION)


_S = TypeVar("_S", bound=_Spec)


class TargetSpec(_Spec):
    name: str
    platform: str  # "cpu" | "tpu" | "gpu"
    device_count: int = Field(gt=0)
    mesh_axes: list[str]
    mesh_shape: list[int]
    flag_profile: str
    topology: str | None = None
    # Device memory per device (bytes). When set, a build whose per-device working set does
    # not fit (XLA's memory_analysis) is refused at compile.
    hbm_bytes_per_device: int | None = Field(None, gt=0)
    # Published peak rates of one device, for the compiler-estimate roofline in `analyze`.
    peak_flops_per_second: float | None = Field(None, gt=0)
    hbm_bytes_per_second: float | None = Field(None, gt=0)
    # Bytes per second that can arrive at one device over the interconnect: what a collective
    # the schedule leaves exposed costs in the estimate (its wire time, nothing computed beside).
    ici_bytes_per_second: float | None = Field(None, gt=0)
    # "fsdp": weights sharded over the mesh axis by their first dimension (the default);
    # "replicated": every device holds every weight (exists to measure what FSDP buys).
    weight_sharding: Literal["fsdp", "replicated"] = "fsdp"
    # Compile a build's stages side by side in one process (threads). False where the compiler
    # is not safe doing so (see the target's own comment); serial is the fallback, not an error.
    concurrent_compile: bool = True
    # Environment defaults for compiling through a topology description on a host without the
    # devices (libtpu reads them at start-up instead of querying cloud metadata). Set only when
    # the variable is unset, before JAX starts.
    compile_env: dict[str, str] = {}
    # GPU targets: the target description XLA compiles for without the device (a
    # stream_executor.GpuTargetConfigProto in text form: a file under manifests/, e.g.
    # "gpu/h100_sxm.txtpb"), pinned by the sha256 of its bytes. load_target refuses a spec whose
    # file is missing or differs; the digest is part of this spec's digest and of the build identity.
    target_config: str | None = None
    target_config_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

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
    name: str
    version: int
    platform: str
    compiler_options: dict[str, Any] = {}
    env_flags: list[str] = []
    kernel_flags: dict[str, Any] = {}

    def digest(self) -> str:
        return sha256_digest(canonical_json(self.model_dump(mode="json")))


class BucketSpec(_Spec):
    name: str
    frames: int = Field(gt=0)


class WeightsSpec(_Spec):
    # "init" (deterministic random from seed), "abstract" (shapes only: compile-only builds whose
    # weights are never materialised, e.g. production shapes), or a safetensors path.
    source: str = "init"
    seed: int = 0


class PipelineSpec(_Spec):
    name: str
    entry: str  # "package.module:Class"
    config: str  # model config name
    buckets: list[BucketSpec]
    weights: WeightsSpec = WeightsSpec()
    # "seeded": chunk noise from (request seed, chunk index); "entropy": fresh noise per request.
    noise: Literal["seeded", "entropy"] = "seeded"
    description: str = ""


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
        raise SpecError(f"unknown {label} {name!r}{did_you_mean(name, specs)} (known: {', '.join(specs) or 'none'}); "
                        f"specs live in {path.parent}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None
    try:
        spec = cls.model_validate(raw)
    except ValidationError as e:
        errors = e.errors()
        # A misspelled key is both an unknown key and a missing one: name the unknown one, with the fix.
        err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
        loc = ".".join(str(p) for p in err["loc"])
        hint = ""
        if err["type"] == "extra_forbidden" and err["loc"]:
            allowed = _fields_at(cls, err["loc"][:-1])
            hint = f"{did_you_mean(str(err['loc'][-1]), allowed)}; allowed here: {', '.join(sorted(allowed))}"
        raise SpecError(f"{path}: {loc}: {err['msg']} (got {err.get('input')!r}){hint}") from None
    named = getattr(spec, "name", name)
    if named != name:
        raise SpecError(f"{path}: name = {named!r} but the file is named {name!r}; make them agree")
    return spec


def _fields_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the (nested) model at ``loc`` inside ``cls`` (empty when it is not a model)."""
    model: Any = cls
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(getattr(model, "model_fields", {}))


def load_target(name: str) -> TargetSpec:
    t = _load("targets", "target", name, TargetSpec)
    if len(t.mesh_axes) != len(t.mesh_shape) or _prod(t.mesh_shape) != t.device_count:
        raise SpecError(
            f"target {name}: mesh {dict(zip(t.mesh_axes, t.mesh_shape))} does not cover "
            f"device_count {t.device_count}"
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
        raise SpecError(f"{where}: a GPU target names its target description and its sha256 "
                        "(target_config = \"gpu/<device>.txtpb\", target_config_sha256 = \"<hex>\") and a topology "
                        "(\"<slices>x<hosts>x<devices per host>\", e.g. \"1x1x8\"); see manifests/gpu/PROVENANCE.md")
    root = manifests_dir().resolve()
    path = (root / t.target_config).resolve()
    if root not in path.parents or not path.is_file():
        raise SpecError(f"{where}: target_config {t.target_config!r} is not a file under {root}")
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != t.target_config_sha256:
        raise SpecError(f"{where}: {path} has sha256 {got}, the target pins {t.target_config_sha256}: the description "
                        "changed; restore it, or pin the new file (a new digest is a new target: re-gate its builds)")
    return TargetDescription(path, raw.decode(), "sha256:" + got)


def load_flag_profile(name: str) -> FlagProfile:
    return _load("flags", "flag profile", name, FlagProfile)


def load_pipeline(name: str) -> PipelineSpec:
    p = _load("pipelines", "pipeline", name, PipelineSpec)
    if not p.buckets:
        raise SpecError(f"pipeline {name}: declares no shape buckets")
    names = [b.name for b in p.buckets]
    if len(set(names)) != len(names):
        raise SpecError(f"pipeline {name}: duplicate bucket names {names}")
    return p


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
