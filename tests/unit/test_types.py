"""The typed seams hold (issue 27 item 5): mypy, with the settings in pyproject.toml, reports no
error in a room whose every function is annotated.

Those rooms are the modules of the last ``[[tool.mypy.overrides]]`` that sets
``disallow_untyped_defs``: a room joins the check by joining that list, so this test needs no
list of its own. mypy runs over the whole package (a seam is checked from both sides); errors in
rooms not yet on the list are left to their owners and are not this test's to fail on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tools import module

pytestmark = pytest.mark.slow  # mypy reads the package and jax, numpy, starlette ...: half a minute or more

ROOT = Path(__file__).resolve().parents[2]
_ERROR = re.compile(r"^(?P<path>avatar_release/[^:]+\.py):(?P<line>\d+): error: (?P<message>.*)$")


def _typed_rooms() -> list[str]:
    """Module patterns ("avatar_release.cli.*", "avatar_release.errors") held to full annotations."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return [m for o in config.get("overrides", []) if o.get("disallow_untyped_defs") for m in o["module"]]


def _module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _covered(module: str, patterns: list[str]) -> bool:
    return any(module == p.removesuffix(".*") or (p.endswith(".*") and module.startswith(p[:-1]))
               for p in patterns)


def test_the_module_patterns_are_read_as_mypy_reads_them():
    patterns = ["avatar_release.cli.*", "avatar_release.errors"]
    assert _covered(_module_of("avatar_release/cli/__init__.py"), patterns)
    assert _covered(_module_of("avatar_release/cli/_app.py"), patterns)
    assert _covered(_module_of("avatar_release/errors.py"), patterns)
    assert not _covered(_module_of("avatar_release/client.py"), patterns)
    assert not _covered(_module_of("avatar_release/errors_more.py"), patterns)


def test_mypy_finds_no_error_in_the_fully_annotated_rooms():
    module("mypy")
    rooms = _typed_rooms()
    assert _covered("avatar_release.trust.policy", rooms) and _covered("avatar_release.compile._stage", rooms), \
        "every room is held to full annotations (pyproject.toml: module = [\"avatar_release\", \"avatar_release.*\"])"
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode in (0, 1) and re.search(r"^(Success|Found \d+ errors?)", out, re.M), \
        f"mypy did not finish a check (exit {run.returncode}):\n{out[-3000:]}"
    errors = [m for m in map(_ERROR.match, out.splitlines()) if m]
    ours = [f"{m['path']}:{m['line']}: {m['message']}" for m in errors if _covered(_module_of(m["path"]), rooms)]
    assert not ours, ("mypy errors in rooms held to full annotations (pyproject.toml [tool.mypy]):\n"
                      + "\n".join(ours))
