"""The project: the directory that holds a pipeline's ``manifests/`` and the code its entry names.

Found the way pytest finds its rootdir: ``--project DIR`` (which sets ``AVATAR_RELEASE_PROJECT``,
so gate workers and other child processes see the same project), else ``AVATAR_RELEASE_PROJECT``,
else the nearest directory upward from the current one that holds ``manifests/``. A build
machine imports a pipeline's entry from its project (``Project.import_module``); a serving pod
needs no project at all.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import SpecError

__all__ = ["PROJECT_ENV", "MANIFESTS_ENV", "Project", "find_project", "use_project"]

PROJECT_ENV = "AVATAR_RELEASE_PROJECT"
# Only the manifests folder, elsewhere (tests, CI variations); code is still imported from the project.
MANIFESTS_ENV = "AVATAR_RELEASE_MANIFESTS"


@dataclass(frozen=True)
class Project:
    root: Path
    found_by: str  # how: "--project / AVATAR_RELEASE_PROJECT", "upward from <cwd>"

    @property
    def manifests(self) -> Path:
        override = os.environ.get(MANIFESTS_ENV)
        return Path(override) if override else self.root / "manifests"

    def import_module(self, name: str) -> ModuleType:
        """Import ``name`` with the project's root first on ``sys.path`` (its packages win)."""
        root = str(self.root)
        if root not in sys.path:
            sys.path.insert(0, root)
        return importlib.import_module(name)

    def owns(self, path: str | os.PathLike | None) -> bool:
        """Does ``path`` (a module's file) lie inside the project?"""
        if not path:
            return False
        try:
            Path(path).resolve().relative_to(self.root)
        except ValueError:
            return False
        return True


def use_project(path: str | os.PathLike) -> Project:
    """Make ``path`` the project of this process and of every process it starts (``--project``)."""
    root = Path(path).expanduser().resolve()
    if not (root / "manifests").is_dir():
        raise SpecError(
            f"--project {path}: {root} holds no manifests/ folder; a project is the directory with "
            "manifests/pipelines/, manifests/targets/ and manifests/flags/ (and the code its "
            "pipeline entry names)"
        )
    os.environ[PROJECT_ENV] = str(root)
    return Project(root, f"--project / {PROJECT_ENV}")


def find_project(start: str | os.PathLike | None = None) -> Project:
    """The project of this process (see the module docstring); SpecError naming where it looked."""
    explicit = os.environ.get(PROJECT_ENV)
    if explicit:
        root = Path(explicit).expanduser().resolve()
        if not (root / "manifests").is_dir() and not os.environ.get(MANIFESTS_ENV):
            raise SpecError(f"{PROJECT_ENV}={explicit}: {root} holds no manifests/ folder")
        return Project(root, f"--project / {PROJECT_ENV}")
    here = Path(start or os.getcwd()).resolve()
    looked = []
    for d in (here, *here.parents):
        looked.append(str(d))
        if (d / "manifests").is_dir():
            return Project(d, f"upward from {here}")
    override = os.environ.get(MANIFESTS_ENV)
    if override:  # manifests elsewhere, code on sys.path: the manifests' parent stands for the project
        return Project(Path(override).resolve().parent, MANIFESTS_ENV)
    raise SpecError(
        f"no project found: none of {', '.join(looked[:4])}{' ...' if len(looked) > 4 else ''} holds a manifests/ "
        f"folder. Run from inside a project (the directory with manifests/), or pass --project DIR "
        f"(or set {PROJECT_ENV})"
    )
