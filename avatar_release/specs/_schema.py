"""Every kind of file a project writes under ``manifests/``, as its pydantic model and JSON Schema.

One table (``SPEC_KINDS``) names each kind, where its files live and the model that reads them;
``avatar-release specs schema [KIND]`` prints the JSON Schema and the docs site renders its
"Reference > Spec formats" page from the same table (``docs/gen_spec_reference.py``), so neither
can describe a field the loaders no longer read.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._suggest import did_you_mean
from ..errors import SpecError
from ..records import Band
from ._load import (
    SPEC_SCHEMA_VERSION,
    SPECS_PAGE,
    FlagProfile,
    PipelineSpec,
    TargetSpec,
    _Spec,
    describe_validation_error,
)

__all__ = [
    "SpecKind",
    "SPEC_KINDS",
    "LeverEntry",
    "LeversSpec",
    "spec_schema",
    "load_levers_spec",
    "validate_levers",
    "levers_warning",
    "fields_of",
]


class LeverEntry(BaseModel):
    """One declared lever: a compiler option (or the jax/jaxlib toolchain) the similarity band may judge."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    effect: Literal["reassociation", "precision"] = Field(
        description='"reassociation": the same math with reductions in another order; "precision": a '
        "narrower type somewhere (the band decides)"
    )
    note: str = Field("", description="why it is a lever (shown to reviewers)")


class LeversSpec(_Spec):
    """manifests/levers.toml: which toolchain-side differences from the baseline may be judged by the
    similarity band (tier 2) instead of bit for bit (tier 1). Read by `gate` against prod; `compile`
    warns when it is missing."""

    schema_version: int = Field(
        ge=1, le=SPEC_SCHEMA_VERSION, description="the format's version; this avatar-release reads 1"
    )  # required here: the gate has always demanded it
    options: dict[str, LeverEntry] = Field({}, description="compiler options by name")
    toolchain: LeverEntry | None = Field(None, description="present: a jax/jaxlib upgrade may be tier 2")


@dataclass(frozen=True)
class SpecKind:
    name: str  # what `specs schema KIND` takes
    where: str  # the files, relative to the project
    model: type[BaseModel]
    format: str  # "TOML" | "JSON"


SPEC_KINDS: dict[str, SpecKind] = {
    k.name: k
    for k in (
        SpecKind("pipeline", "manifests/pipelines/<name>.toml", PipelineSpec, "TOML"),
        SpecKind("target", "manifests/targets/<name>.toml", TargetSpec, "TOML"),
        SpecKind("flags", "manifests/flags/<name>.toml", FlagProfile, "TOML"),
        SpecKind("levers", "manifests/levers.toml", LeversSpec, "TOML"),
        SpecKind("band", "manifests/bands/<pipeline>-<target>.json (written by `gate calibrate`)", Band, "JSON"),
    )
}


def spec_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind of project file (SpecError naming the kinds for an unknown one)."""
    if kind not in SPEC_KINDS:
        raise SpecError(f"no spec kind {kind!r}{did_you_mean(kind, SPEC_KINDS)} (kinds: {', '.join(SPEC_KINDS)})")
    k = SPEC_KINDS[kind]
    doc = k.model.model_json_schema()
    doc["$comment"] = f"{k.format} file at {k.where}"
    return doc


def fields_of(model: type[BaseModel]) -> tuple[list[str], list[str]]:
    """(required, optional) field names of ``model``, in declaration order."""
    fields = model.model_fields
    return [n for n, f in fields.items() if f.is_required()], [n for n, f in fields.items() if not f.is_required()]


def load_levers_spec(path: Path) -> LeversSpec | None:
    """The project's levers.toml checked against its model; None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        raw = tomllib.loads(path.read_text())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None
    return validate_levers(raw, path)


def validate_levers(doc: dict[str, Any], path: Path) -> LeversSpec:
    """A parsed levers.toml checked against its model (compile and the gate check the same way)."""
    try:
        return LeversSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(f"{path}: {describe_validation_error(LeversSpec, e)}") from None


def levers_warning(path: Path) -> str | None:
    """What ``compile`` says about the project's levers.toml before it compiles: None when the file is
    there and valid, a warning when it is missing (compile needs no lever list, but the first gate
    against prod does, and would refuse only after the whole compile), SpecError when it is invalid."""
    if load_levers_spec(path) is not None:
        return None
    return (
        f"{path} is missing: this compile goes on, but `gate` against prod reads it to decide the tier and "
        "refuses without it. With no levers to declare, write one line, schema_version = 1 (every difference "
        f"from prod is then judged bit for bit); `avatar-release specs schema levers`, {SPECS_PAGE} > levers"
    )
