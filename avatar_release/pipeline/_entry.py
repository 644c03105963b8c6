"""A pipeline spec's ``entry`` ("package.module:attribute"), imported from its project and checked."""

from __future__ import annotations

import sys
from pathlib import Path

from .._digest import StreamDigest
from ..specs import PipelineSpec, Project, find_project
from ._author import author_error
from ._contract import CONTRACT_PAGE, ContractError, Pipeline, check_pipeline

__all__ = ["load_entry", "project_source_digest"]


def load_entry(spec: PipelineSpec, project: Project | None = None) -> Pipeline:
    """The spec's pipeline; ContractError (exit 2) naming the entry, the project and the fix."""
    project = project or find_project()
    where = f"pipeline spec {spec.name}: entry {spec.entry!r}"
    module_name, sep, attr = spec.entry.partition(":")
    if not sep or not module_name or not attr:
        raise ContractError(
            f"{where}: expected 'package.module:attribute' (e.g. 'model.release:pipeline'). "
            f"The pipeline contract: {CONTRACT_PAGE}"
        )
    try:
        module = project.import_module(module_name)
    except ImportError as e:
        raise ContractError(
            f"{where}: cannot be imported from project {project.root} (found {project.found_by}): "
            f"{e}. Pass --project DIR for the project that holds this pipeline's code"
        ) from None
    except Exception as e:  # noqa: BLE001 - the module's own code raised while it was imported
        raise author_error(e, where, f"importing {module_name}", project.root) from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ContractError(
                f"{where}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                f"attribute {attr!r}. The pipeline contract: {CONTRACT_PAGE}"
            )
        obj = getattr(obj, part)
    return check_pipeline(obj, where, project.root)


def project_source_digest(pipeline: Pipeline, spec: PipelineSpec, project: Project | None = None) -> str:
    """Digest of the pipeline's source: every ``*.py`` of its source packages, by path under the project.

    The packages are ``pipeline.source_packages``, or else the top-level package of the entry module.
    """
    project = project or find_project()
    names = pipeline.source_packages or (spec.entry.partition(":")[0].split(".")[0],)
    h = StreamDigest()
    for name in names:
        module = sys.modules.get(name) or project.import_module(name)
        if hasattr(module, "__path__"):  # a package: every file under it, lazily imported ones too
            dirs = [Path(d) for d in module.__path__]
            paths, base = sorted(p for d in dirs for p in d.rglob("*.py")), dirs[0].parent
        else:
            file = getattr(module, "__file__", None)
            paths = [Path(file)] if file else []
            base = paths[0].parent if paths else Path(".")
        if not paths:
            raise ContractError(f"pipeline {spec.name}: source package {name!r} has no Python files to digest")
        for p in paths:
            h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.digest
