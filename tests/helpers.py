"""What test files share: the CLI as a test drives it, and a build's manifest as the tool reads it.

Imported as ``tests.helpers`` (pyproject's ``pythonpath = ["."]``), like ``tests.standin_build``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from email.message import Message
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from avatar_release.errors import CRASH_EXIT_CODE
from avatar_release.records import (
    BUILD_SCHEMA_VERSION,
    Manifest,
    build_id_for,
    manifest_identity,
    manifest_seal,
    parse_record,
)
from avatar_release.registry import Registry, read_manifest

__all__ = [
    "DATA",
    "BENCHMARKS",
    "stored_manifest",
    "cpu_manifest",
    "resealed",
    "manifest_of",
    "put_stand_in_build",
    "with_release_state",
    "signed_holder",
    "local_blob_path",
    "cli",
    "cli_json",
    "run_smoke",
]

DATA = Path(__file__).resolve().parent / "data"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def stored_manifest(version: int) -> Manifest:
    """The checked-in example of build manifest ``version`` (tests/data/build-manifest.v<N>.json)."""
    path = DATA / f"build-manifest.v{version}.json"
    return parse_record(Manifest, path.read_bytes(), where=f"tests/data/{path.name}")


def cpu_manifest(**update: Any) -> Manifest:
    """A tiny build for cpu-8 at the manifest version this tool writes (the support window reads
    no older CPU example): the stored v5 one relabelled, its identity, build id and seal
    recomputed as a compile of the same program would name it. ``update``: fields set first."""
    doc = json.loads((DATA / "build-manifest.v5.json").read_bytes())
    doc.update(schema_version=BUILD_SCHEMA_VERSION, **update)
    return resealed(Manifest.model_validate(doc))


def resealed(m: Manifest, **update: Any) -> Manifest:
    """``m`` with ``update`` applied and its identity, build id and seal recomputed, as a compile of
    that manifest's content would name and seal it."""
    m = m.model_copy(update=update)
    identity = manifest_identity(m)
    m = m.model_copy(update={"identity": identity, "build_id": build_id_for(m.pipeline, m.target, identity)})
    return m.model_copy(update={"seal": manifest_seal(m)})


def put_stand_in_build(reg: Registry, m: Manifest) -> str:
    """Publish ``m`` with stand-in blob bytes (right names, wrong bytes: nothing loads them, and
    verify fails on each); returns the build's digest."""
    for ref in m.blobs():
        reg._write_atomic(reg._blob_key(ref.digest), b"stand-in")  # type: ignore[attr-defined]
    return reg.put_build(m.build_id, m.to_json_bytes())[0]


def with_release_state(reg: Registry) -> Registry:
    """``reg`` with a signed release state from the trust policy in force (what `registry init` does)."""
    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_write import init_state

    init_state(reg, load_policy())
    return reg


def signed_holder(reg: Registry, channel: str) -> str | None:
    """The build ``channel`` holds as the signed release state names it (what every decision reads),
    verified from the trust policy in force; None when the channel is empty."""
    from avatar_release.trust.policy import load_policy
    from avatar_release.trust.state_read import load_state

    holder = load_state(reg, load_policy()).holder(channel)
    return holder.build_id if holder else None


def local_blob_path(root: Path, digest: str) -> Path:
    """Where a local registry at ``root`` (LocalRegistry's layout) keeps the blob ``digest``."""
    return root / "blobs" / "sha256" / digest.split(":")[1]


def manifest_of(registry: Registry, ref: str = "dev") -> Manifest:
    """The manifest ``ref`` (a channel, build id or digest) names, read as every command reads it."""
    return read_manifest(registry, ref)[1]


def cli(*args: str | Path) -> Result:
    """`avatar-release ARGS` in this process (click's CliRunner), with stdout and stderr in ``output``.

    A crash fails the test here: no test expects one, and a refusal it does expect has its own exit
    code (``AvatarReleaseError.exit_code``), which the caller asserts.
    """
    from avatar_release.cli import cli as group  # the whole CLI (torch included): only for tests that drive it

    res = CliRunner().invoke(group, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code != CRASH_EXIT_CODE and "Traceback" not in res.output, (
        f"avatar-release {' '.join(map(str, args))} crashed:\n{res.output[-4000:]}"
    )
    return res


def cli_json(
    cwd: Path,
    *args: str | Path,
    env: Mapping[str, str],
    rc: int = 0,
    timeout: float | None = 600,
    program: Sequence[str] = (sys.executable, "-m", "avatar_release"),
) -> dict:
    """`avatar-release ARGS --json` as its users run it: another process, in ``cwd``, with ``env``.

    Asserts the exit code is ``rc`` (the output in the message when not) and returns the one JSON
    document printed. ``program``: how the CLI is started (``("avatar-release",)``: the installed script).
    """
    proc = subprocess.run(
        [*program, *map(str, args), "--json"], cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == rc, (
        f"avatar-release {' '.join(map(str, args))}: exit {proc.returncode}, expected {rc}\n"
        f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    )
    return json.loads(proc.stdout)


def project_env() -> dict[str, str]:
    """This process's environment without what points at this repository's project or registry, as a
    user's shell in their own project has it."""
    drop = ("XLA_FLAGS", "AVATAR_RELEASE_PROJECT", "AVATAR_RELEASE_MANIFESTS", "AVATAR_RELEASE_REGISTRY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def post_json(port: int, body: dict, path: str = "/render") -> tuple[int, Message, bytes]:
    """POST ``body`` as JSON to a pod on this host: (status, headers, body), an HTTP error included."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@contextlib.contextmanager
def served_pod(registry: str, cwd: Path, log: Path, env: Mapping[str, str], channel: str = "prod") -> Iterator[dict]:
    """`avatar-release serve` on ``channel`` in another process; yields its ready line (port, build,
    compiles) and, on leaving, asserts it drains and exits 0 on SIGTERM (its stderr kept in ``log``:
    an unread pipe could fill and block the pod)."""
    with open(log, "w") as err:
        pod = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "avatar_release",
                "serve",
                "--registry",
                registry,
                "--channel",
                channel,
                "--port",
                "0",
            ],
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert pod.stdout is not None
        line = pod.stdout.readline()
        assert line, log.read_text()[-3000:]
        ready = json.loads(line)
        assert ready["event"] == "ready", ready
        yield ready
    finally:
        pod.terminate()
        assert pod.wait(60) == 0, log.read_text()[-3000:]


def run_smoke(script: str, *args: str | Path, out: Path, timeout: float = 600) -> Any:
    """``python benchmarks/SCRIPT --smoke ARGS --out OUT`` in OUT's directory, as a user runs a
    benchmark; returns the JSON it wrote. A failure shows the benchmark's own output."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *map(str, args), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=out.parent,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"benchmarks/{script} --smoke: exit {proc.returncode}\n"
        f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    )
    return json.loads(out.read_text())
