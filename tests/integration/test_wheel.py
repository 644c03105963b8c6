"""The serving install as a pod gets it: a wheel built from this repository, installed into a
clean virtual environment outside it, serving a build with nothing from the checkout.

The wheel holds one top-level package, `avatar_release`: the bundled pipeline (`model/`,
`kernels/`) is a project beside it that build machines import from the checkout, never part of
the toolchain; the installed pod has no `manifests/` folder at all: serving reads only the build's
own manifest from the registry.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.integration.installs import build_wheel_venv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(wheel path, venv) for a wheel of this checkout installed in a fresh venv."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))


def _clean_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "PIP_FIND_LINKS", "PIP_CERT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), AVATAR_RELEASE_CONFIG_DIR=str(home / "config"))
    return env  # no PYTHONPATH, no AVATAR_RELEASE_MANIFESTS, no XLA_FLAGS


def test_the_wheel_holds_one_top_level_package_and_no_repository_folders(wheel_env):
    wheel, _ = wheel_env
    names = zipfile.ZipFile(wheel).namelist()
    top = sorted({n.split("/")[0] for n in names})
    assert top == ["avatar_release", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"]
    # The toolchain only: no pipeline (model/, kernels/, examples/), nothing of tests/, manifests/ or
    # benchmarks/; the contract a pipeline satisfies is in it.
    assert "avatar_release/pipeline/__init__.py" in names and "avatar_release/runtime/__init__.py" in names
    assert not [
        n
        for n in names
        if n.startswith(("model/", "kernels/", "examples/"))
        or "/model/" in n
        or "/kernels/" in n
        or "/tests/" in n
        or "/manifests/" in n
        or "benchmarks" in n
    ]


def test_a_clean_environment_serves_a_build_from_the_wheel(wheel_env, built_registry, tmp_path):
    _, venv = wheel_env
    root, result = built_registry
    env = _clean_env(tmp_path)
    py = str(venv / "bin" / "python")

    # Everything imported comes from the venv, and there is no manifests folder to lean on.
    probe = (
        "import avatar_release, sys\n"
        "from avatar_release.errors import SpecError\n"
        "from avatar_release.specs import manifests_dir\n"
        "try:\n    manifests_dir(); found = True\n"
        "except SpecError:\n    found = False\n"
        "import importlib.util as u\n"
        "print(avatar_release.__file__); print(found); print(u.find_spec('torch') is None and u.find_spec('torchax') is None)"
    )
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    where, found, no_torch = out.stdout.split()
    assert where.startswith(str(venv)) and found == "False"
    assert no_torch == "True"  # the runtime-only install: no torch, no torchax
    site = Path(where).parents[1]
    assert not (site / "model").exists() and not (site / "kernels").exists()

    proc = subprocess.Popen(
        [str(venv / "bin" / "avatar-release"), "serve", "--registry", str(root), "--channel", "dev", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "pod.log", "w"),
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line, (tmp_path / "pod.log").read_text()[-2000:]
        ready = json.loads(line)
        assert ready["build_id"] == result.build_id and ready["compiles"] == 0
        base = f"http://127.0.0.1:{ready['port']}"
        assert json.loads(urllib.request.urlopen(base + "/readyz", timeout=30).read())["ready"] is True
        req = urllib.request.Request(
            base + "/render",
            data=json.dumps({"seconds": 0.4}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            data = resp.read()
            assert resp.headers["X-Compiles"] == "0" and resp.headers["X-Build-Id"] == result.build_id
        assert data[4:8] == b"ftyp" and b"moof" in data
        health = json.loads(urllib.request.urlopen(base + "/healthz", timeout=30).read())
        assert health["compiles"] == 0 and health["build_id"] == result.build_id
    finally:
        proc.terminate()
        try:
            assert proc.wait(60) == 0  # SIGTERM drains and exits 0
        finally:
            if proc.poll() is None:
                proc.kill()
