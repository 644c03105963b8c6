"""A newcomer's walk, scripted (issue 29, "Measure"): from a directory outside the project, with
only a config file naming the registry, every step answers with the exit code a script expects
and, where it refuses, a message that carries the fix.

Each step is a real ``python -m avatar_release`` process, as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from avatar_release.registry import LocalRegistry
from tests.helpers import cli_json, cpu_manifest, put_stand_in_build

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "AVATAR_RELEASE_PROJECT", "AVATAR_RELEASE_MANIFESTS", "AVATAR_RELEASE_REGISTRY")
    }
    return {**keep, "AVATAR_RELEASE_CONFIG_DIR": str(tmp_path / "user-config")}


def _run(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "avatar_release", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_newcomer_outside_the_project_gets_exit_codes_and_fixes_at_every_step(registry_copy, tmp_path):
    root, first = registry_copy
    other = cpu_manifest()
    put_stand_in_build(LocalRegistry(root), other)  # a second build to compare with (its manifest only)
    env = _env(tmp_path)
    config = tmp_path / "user-config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'default = "team"\n\n[registries.team]\nuri = "{root}"\n')
    home = tmp_path / "elsewhere"  # no manifests/, no .avatar-release/ here or above
    home.mkdir()

    # Which registry, and why: the config file's default.
    where = cli_json(home, "registries", env=env)
    assert where["current"]["uri"] == str(root) and "default = 'team'" in where["current"]["source"]

    # render: dev by default, zero compiles; the deadline says what this host is.
    doc = cli_json(home, "render", "--seconds", "0.4", "--out", str(tmp_path / "a.mp4"), env=env)
    assert doc["build_id"] == first.build_id and doc["compiles"] == 0
    pace = doc["pace"]
    assert pace["emulated"] and pace["misses_on_target"] == 0 and pace["realtime_factor"] > 0
    if pace["chunks_over_deadline"]:
        assert "not a deadline miss" in pace["summary"]

    # serve: prod is empty; the message names the channel that holds a build and the command.
    res = _run(home, env, "serve", "--port", "0")
    assert res.returncode == 3 and "channel 'prod' is empty" in res.stderr
    assert "avatar-release serve dev" in res.stderr

    # A mistyped channel: a usage error (exit 2) with the closest name, as one JSON document too.
    doc = cli_json(home, "promote", "dev", "--to", "production", env=env, rc=2)
    assert doc["error"] == "UsageError" and "did you mean 'prod'?" in doc["message"]

    # A mistyped --set key: the closest keys (the project named, as from anywhere outside it).
    res = _run(home, env, "compile", "--project", str(ROOT), "--set", "dit.stepz=2", "--registry", str(tmp_path / "r"))
    assert res.returncode == 2 and "did you mean 'dit.steps'" in res.stderr

    # diff of two builds: what differs, by section.
    doc = cli_json(home, "diff", "dev", other.build_id, env=env)
    sections = {r["section"] for r in doc["differences"]}
    assert {"build", "executables"} <= sections and not doc["identical"]

    # promote --dry-run under the newcomer's own first-use policy: this registry's signed state is
    # rooted in the team's keys, so it is not trusted (exit 4), and the message says which policy to use.
    doc = cli_json(home, "promote", "dev", "--to", "staging", "--dry-run", env=env, rc=4)
    assert doc["error"] == "TrustError" and "AVATAR_RELEASE_TRUST_POLICY" in doc["message"]
    env["AVATAR_RELEASE_TRUST_POLICY"] = str(Path(os.environ["AVATAR_RELEASE_CONFIG_DIR"]) / "trust.toml")  # the team's
    # promote --dry-run: the real decision with its fix, nothing written.
    doc = cli_json(home, "promote", "dev", "--to", "staging", "--dry-run", env=env, rc=1)
    assert doc["error"] == "Refusal" and "--project DIR" in doc["message"]  # the target spec is the project's
    doc = cli_json(home, "promote", "dev", "--to", "staging", "--dry-run", "--project", str(ROOT), env=env, rc=1)
    assert (
        doc["error"] == "Refusal"
        and "never been gated" in doc["message"]
        and "gate" in doc["message"].split("never been gated")[1]
    )
    assert LocalRegistry(root).get_channel("staging") is None

    # Where nothing names a registry: exit 3, every place looked, and the command that makes one.
    config.unlink()
    doc = cli_json(home, "ls", env=env, rc=3)
    assert doc["error"] == "NotFoundError" and len(doc["looked"]) == 4 and "avatar-release compile" in doc["message"]
