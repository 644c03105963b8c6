"""A build's identity does not depend on the folder, the user or the machine (issue 40, item 1).

The example project (`examples/own-pipeline`) is copied to two folders of different name lengths
and compiled through the CLI in each, into two registries; the second with its packages imported
from another site-packages folder, as a virtual environment has them. Both give the same build:
same build id, and per executable the same scheduled-HLO digest, fingerprint and size (before,
the executables carried the absolute file names of the stack frames, and grew by the longer path).
A rebuild from the first folder reproduces the second folder's build.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
import zstandard

from avatar_release.registry import open_registry
from tests.helpers import cli_json, manifest_of

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"


def _env(**extra: str) -> dict[str, str]:
    # The CLI sets the device count from the target (XLA_FLAGS); no project or registry is preset.
    drop = ("XLA_FLAGS", "AVATAR_RELEASE_PROJECT", "AVATAR_RELEASE_MANIFESTS", "AVATAR_RELEASE_REGISTRY")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _project(folder: Path) -> Path:
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    return folder


def _site_packages_elsewhere(tmp_path: Path) -> str:
    """A PYTHONPATH whose first folder is this interpreter's site-packages under another path (a
    link), so torch, torchax, jax and the rest are imported from there, as from a virtual
    environment (whose site-packages, unlike a plain interpreter's, is no part of the standard
    library's folder, which jax leaves out of locations by itself)."""
    link = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    link.parent.mkdir(parents=True)
    link.symlink_to(sysconfig.get_paths()["purelib"], target_is_directory=True)
    return os.pathsep.join(p for p in (str(link), os.environ.get("PYTHONPATH")) if p)


def _executables(registry: str, build_id: str) -> dict[str, tuple]:
    """Per executable: what the identity covers of it, its size, and its bytes as compiled."""
    reg = open_registry(registry, create=False)
    m = manifest_of(reg, build_id)
    return {
        e.key: (
            e.hlo_digest,
            e.fingerprint,
            e.raw_size,
            zstandard.ZstdDecompressor().decompress(
                reg.get_blob(e.blob.digest, e.blob.size), max_output_size=e.raw_size
            ),
        )
        for e in m.executables
    }


def test_a_project_compiles_to_the_same_build_from_any_folder_and_site_packages(tmp_path):
    short = _project(tmp_path / "a")
    long = _project(tmp_path / "a-much-longer-folder-name" / "x")
    reg_short, reg_long = str(tmp_path / "registry-a"), str(tmp_path / "registry-b")
    compile_args = ("compile", "--pipeline", "puppet-tiny", "--target", "cpu-8", "--registry")

    first = cli_json(short, *compile_args, reg_short, env=_env(), timeout=300)["build_id"]
    second = cli_json(
        long, *compile_args, reg_long, env=_env(PYTHONPATH=_site_packages_elsewhere(tmp_path)), timeout=300
    )["build_id"]

    assert first == second
    ours, theirs = _executables(reg_short, first), _executables(reg_long, second)
    assert {k: v[:3] for k, v in ours.items()} == {k: v[:3] for k, v in theirs.items()}
    for key, (*_, raw) in {**ours, **theirs}.items():  # no folder of either compile is in what ships
        assert str(tmp_path).encode() not in raw, f"{key} names a folder of its compile"

    # The other folder's build, rebuilt here: the same HLO, fingerprints and identity.
    doc = cli_json(short, "rebuild", second, "--registry", reg_long, env=_env(), timeout=300)
    assert doc["identical"] and doc["rebuilt_id"] == second, doc["differences"]
