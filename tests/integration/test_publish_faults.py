"""Publishing never leaves a half-written build visible: failure mid-publish, kill -9, bad store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import RegistryError
from avatar_release.registry import LocalRegistry


@pytest.mark.slow  # compiles a pipeline
def test_failure_in_the_middle_of_publishing_leaves_the_registry_unchanged(tmp_path, monkeypatch):
    from avatar_release.compile import compile_build

    reg = LocalRegistry(tmp_path / "reg")
    calls = {"n": 0}
    real = LocalRegistry.put_blob

    def flaky(self, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RegistryError(f"registry {self.root}: cannot write blob (disk full)")
        return real(self, data)

    monkeypatch.setattr(LocalRegistry, "put_blob", flaky)
    with pytest.raises(RegistryError, match="disk full"):
        compile_build("tiny", "cpu-8", registry=reg)
    assert reg.list_builds() == [] and reg.get_channel("dev") is None and reg.history() == []
    assert os.listdir(tmp_path / "reg" / "tmp") == []


def test_kill_9_mid_publish_never_shows_a_partial_build(tmp_path):
    """A publisher killed after writing blobs but before the commit marker: nothing visible."""
    root = tmp_path / "reg"
    code = f"""
import os, signal
from avatar_release.registry import LocalRegistry
reg = LocalRegistry({str(root)!r})
for i in range(5):
    reg.put_blob(os.urandom(1 << 20))
os.kill(os.getpid(), signal.SIGKILL)
reg.put_build("never-committed", b"{{}}")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    reg = LocalRegistry(root, create=False)
    assert reg.list_builds() == []
    assert list((root / "builds").iterdir()) == []


def test_unwritable_registry_is_exit_7_with_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = CliRunner().invoke(cli, ["compile", "--registry", str(blocker / "reg")])
    assert res.exit_code == 7, res.output
    assert str(blocker / "reg") in res.output and "cannot create it" in res.output
