"""Declared, versioned specs under a project's ``manifests/``: targets, flag profiles, pipelines, levers;
and the project itself (where the specs and the pipeline's code live)."""

from ._load import (
    SPEC_SCHEMA_VERSION,
    SPECS_PAGE,
    BucketSpec,
    FlagProfile,
    PipelineSpec,
    TargetDescription,
    TargetSpec,
    WeightsSpec,
    list_specs,
    load_flag_profile,
    load_pipeline,
    load_target,
    manifests_dir,
    target_description,
)
from ._schema import SPEC_KINDS, LeverEntry, LeversSpec, SpecKind, levers_warning, load_levers_spec, spec_schema
from ._project import MANIFESTS_ENV, PROJECT_ENV, Project, find_project, use_project

__all__ = [
    "SPEC_SCHEMA_VERSION",
    "SPECS_PAGE",
    "SPEC_KINDS",
    "SpecKind",
    "spec_schema",
    "LeversSpec",
    "LeverEntry",
    "load_levers_spec",
    "levers_warning",
    "TargetSpec",
    "TargetDescription",
    "target_description",
    "FlagProfile",
    "PipelineSpec",
    "BucketSpec",
    "WeightsSpec",
    "manifests_dir",
    "load_target",
    "load_flag_profile",
    "load_pipeline",
    "list_specs",
    "Project",
    "find_project",
    "use_project",
    "PROJECT_ENV",
    "MANIFESTS_ENV",
]
