"""tests/tools.py: a missing tool skips a test, and fails it where its AVATAR_RELEASE_REQUIRE_* switch is set."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tools

REPO = Path(__file__).resolve().parents[2]
SWITCH_VARS = [
    f"AVATAR_RELEASE_REQUIRE_{s}" for s in ("BROWSER", "REGISTRY", "TPU_COMPILER", "GPU_COMPILER", "DOCS", "PODMAN")
]


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """A machine with no external binary on PATH and no switch set."""
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in SWITCH_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_a_missing_binary_skips_without_its_switch_and_says_how_to_install_it(bare):
    with pytest.raises(pytest.skip.Exception, match=r"skopeo not found on PATH \(apt-get install skopeo\)"):
        tools.binary("skopeo")
    assert tools.binary_if_present("skopeo") is None


@pytest.mark.parametrize("name", ["skopeo", "openssl", "docker-registry"])
def test_a_missing_binary_fails_under_the_registry_switch(bare, name):
    bare.setenv("AVATAR_RELEASE_REQUIRE_REGISTRY", "1")
    with pytest.raises(pytest.fail.Exception, match=r"AVATAR_RELEASE_REQUIRE_REGISTRY is set: this run must not skip"):
        tools.binary(name)
    with pytest.raises(pytest.fail.Exception):
        tools.binary_if_present(name)  # an added check is not silently left out either


def test_another_tools_switch_does_not_turn_a_skip_into_a_failure(bare):
    bare.setenv("AVATAR_RELEASE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.skip.Exception):
        tools.binary("skopeo")
    with pytest.raises(pytest.fail.Exception, match="AVATAR_RELEASE_REQUIRE_BROWSER"):
        tools.binary("chromium")


def test_a_present_binary_is_returned_whatever_the_switch(bare, tmp_path):
    exe = tmp_path / "skopeo"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    bare.setenv("AVATAR_RELEASE_REQUIRE_REGISTRY", "1")
    assert tools.binary("skopeo") == str(exe) == tools.binary_if_present("skopeo")


def test_a_missing_module_skips_and_fails_under_its_extras_switch(bare):
    bare.setitem(sys.modules, "libtpu", None)  # blocked: find_spec raises, as for an absent module
    bare.setitem(sys.modules, "oras.client", None)
    with pytest.raises(pytest.skip.Exception, match=r"pip install -e '\.\[tpu\]'"):
        tools.need_extra("tpu")
    with pytest.raises(pytest.skip.Exception, match=r"oras\.client is not installed \(pip install -e '\.\[test\]'\)"):
        tools.module("oras.client")
    bare.setenv("AVATAR_RELEASE_REQUIRE_TPU_COMPILER", "1")
    bare.setenv("AVATAR_RELEASE_REQUIRE_REGISTRY", "1")
    with pytest.raises(pytest.fail.Exception, match="AVATAR_RELEASE_REQUIRE_TPU_COMPILER"):
        tools.need_extra("tpu")
    with pytest.raises(pytest.fail.Exception, match="AVATAR_RELEASE_REQUIRE_REGISTRY"):
        tools.module("oras.client")


def test_a_module_outside_the_table_is_an_error_not_a_skip():
    with pytest.raises(KeyError, match="add it to the table"):
        tools.module("not_a_listed_module")


def test_every_switch_ci_sets_covers_a_tool_in_the_table():
    """.ci/run's exports and the table agree: a switch CI sets but no tool reads would promise nothing."""
    exported = set(re.findall(r"AVATAR_RELEASE_REQUIRE_(\w+)=1", (REPO / ".ci" / "run").read_text()))
    covered = (
        {t.switch for t in tools.TOOLS.values()}
        | {s for _, s in tools.EXTRAS.values()}
        | set(tools._MODULE_SWITCH.values())
    )
    assert exported == {"BROWSER", "REGISTRY", "TPU_COMPILER", "GPU_COMPILER", "DOCS"}
    assert exported <= covered
    doc = tools.__doc__
    for switch in covered - {None}:
        assert f"``{switch}``" in doc, f"{switch} is missing from the table in tests/tools.py's docstring"


def test_no_test_decides_a_missing_tool_by_itself():
    """Every skip for an absent tool goes through tests/tools.py, so every one honours its switch."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name in ("tools.py", "test_tools.py"):
            continue
        code = re.sub(r'"""(.*?)"""', "", path.read_text(), flags=re.S)  # prose may name a switch
        for pattern in (
            "importorskip(",
            "AVATAR_RELEASE_REQUIRE_",
            'shutil.which("skopeo',
            'shutil.which("openssl',
            'shutil.which("chromium',
            'shutil.which("podman',
            'find_spec("libtpu',
            'find_spec("mkdocs',
        ):
            if pattern in code:
                offenders.append(f"{path.relative_to(REPO)}: {pattern}")
    assert offenders == []


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_a_test_without_skopeo_skips_and_under_the_switch_fails(tmp_path):
    """End to end, as CI sees it: the outcome pytest reports for a test that needs skopeo."""
    (tmp_path / "test_needs_skopeo.py").write_text(
        "from tests.tools import binary\n\ndef test_it():\n    binary('skopeo')\n"
    )
    (tmp_path / "conftest.py").write_text("from tests.tools import pytest_runtest_makereport  # noqa: F401\n")
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}

    def outcome(**switch: str) -> str:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "--rootdir",
                str(tmp_path),
                "-c",
                "/dev/null",
                str(tmp_path / "test_needs_skopeo.py"),
            ],
            capture_output=True,
            text=True,
            env={**env, **switch},
            cwd=tmp_path,
            timeout=120,
        )
        return proc.stdout

    skipped = outcome()
    assert "1 skipped" in skipped
    # listed with its reason, at the test that needed the tool (.ci/run's output shows this list)
    assert "SKIPPED [1] test_needs_skopeo.py:3: skopeo not found on PATH (apt-get install skopeo)" in skipped
    failed = outcome(AVATAR_RELEASE_REQUIRE_REGISTRY="1")
    assert "1 failed" in failed and "AVATAR_RELEASE_REQUIRE_REGISTRY is set" in failed
