"""The CLI as a thin layer: every failure leaves through the exception tree, so ``--json`` always
prints exactly one document on stdout (with the error and its evidence) and the exit code says why."""

from __future__ import annotations

import json
from pathlib import Path

from avatar_release.records import Manifest
from avatar_release.registry import LocalRegistry
from tests.helpers import cli, cpu_manifest, put_stand_in_build


def _store(tmp_path) -> tuple[Path, Manifest]:
    reg = LocalRegistry(tmp_path / "reg")
    m = cpu_manifest()
    put_stand_in_build(reg, m)
    return tmp_path / "reg", m


def test_a_failing_verify_prints_one_json_document_with_the_evidence_and_exits_4(tmp_path):
    root, m = _store(tmp_path)
    res = cli("verify", m.build_id, "--registry", str(root), "--json")
    assert res.exit_code == 4
    doc = json.loads(res.stdout)  # exactly one document: json.loads would fail on two
    assert doc["ok"] is False and doc["error"] == "IntegrityError" and doc["exit_code"] == 4
    rows = {b["digest"]: b for b in doc["blobs"]}
    assert all(rows[ref.digest]["ok"] is False for ref in m.blobs())
    assert "failed verification" in doc["message"]


def test_without_json_the_report_comes_first_and_the_error_on_stderr(tmp_path):
    root, m = _store(tmp_path)
    res = cli("verify", m.build_id, "--registry", str(root))
    assert res.exit_code == 4 and "FAIL" in res.stdout and res.stdout.lstrip().startswith(m.build_id)
    assert "error: build" in res.stderr


def test_ls_json_lists_builds_with_their_channels(tmp_path):
    root, m = _store(tmp_path)
    reg = LocalRegistry(root)
    from avatar_release.promote import publish_to_dev

    publish_to_dev(reg, reg.resolve(m.build_id), reason="test")
    res = cli("ls", "--registry", str(root), "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["builds"][0]["channels"] == ["dev"] and doc["problems"] == []


def test_channels_come_from_one_list_and_unknown_ones_are_usage_errors():
    res = cli("history", "canary")
    assert res.exit_code == 2 and "'dev', 'staging', 'prod'" in res.output


def test_registry_help_names_every_store():
    res = cli("ls", "--help")
    for scheme in ("file://", "oci://", "gar://", "memory://"):
        assert scheme in res.output


def test_version_names_the_toolchain_a_bug_report_needs():
    """``--version`` is what a bug report starts with: ours, Python, and each compiler and runtime a
    build depends on, with "not installed" for one that is absent; nothing is imported to say it."""
    import platform
    import subprocess
    import sys
    from importlib import metadata

    from avatar_release import __version__

    out = subprocess.run(
        [sys.executable, "-m", "avatar_release", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == [
        f"avatar-release {__version__}",
        f"python {platform.python_version()}",
        f"jax {metadata.version('jax')}",
    ]
    names = [line.split(" ", 1)[0] for line in lines]
    assert names == ["avatar-release", "python", "jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "torch", "torchax"]
    assert all(line.split(" ", 1)[1] for line in lines)  # a version, or "not installed"
