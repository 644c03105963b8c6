"""A project the toolchain has never heard of, released end to end from a copy outside the repository.

`examples/own-pipeline` (package `puppet`: two stages motion -> decode, a pose carried from chunk to
chunk, 32x64 frames) is copied to a temporary directory and driven only through the `avatar-release`
CLI, as its users would: compile, the first gate, staging, prod, a render and a streamed request from
prod with zero compiles, then a changed build (tier 1, fails against prod) and a build with the
pipeline's declared lever (tier 2, judged by the band the example commits).
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import cli_json, project_env, served_pod

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"
H, W = 32, 64  # the example's tiny config


def _cli(cwd: Path, *args: str, rc: int = 0) -> dict:
    """`avatar-release ARGS --json` in `cwd`, in a user's environment (`project_env`)."""
    return cli_json(cwd, *args, env=project_env(), rc=rc, timeout=300)


def _gate(doc: dict, name: str) -> dict:
    return next(g for g in doc["result"]["gates"] if g["name"] == name)


def test_an_unknown_project_is_compiled_gated_promoted_served_and_judged_by_its_own_band(tmp_path):
    project = tmp_path / "own-pipeline"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    assert not project.resolve().is_relative_to(ROOT)
    elsewhere = tmp_path / "elsewhere"  # no manifests/ here or above: --project names the project
    elsewhere.mkdir()
    reg = str(tmp_path / "registry")

    # compile: the entry is imported from the copy (found upward from its cwd), two stages x one bucket.
    doc = _cli(project, "compile", "--pipeline", "puppet-tiny", "--target", "cpu-8", "--registry", reg)
    first = doc["build_id"]
    assert doc["ok"] and doc["pipeline"] == "puppet-tiny" and first.startswith("puppet-tiny-cpu-8-")
    assert [e["key"] for e in doc["executables"]] == ["motion/f8", "decode/f8"]
    manifest = _cli(project, "inspect", first, "--registry", reg)["manifest"]
    program = manifest["program"]
    assert manifest["model_entry"] == "puppet.release:pipeline" and program["stages"] == ["motion", "decode"]
    assert program["carry"] == {"pose": "last_pose"} and (program["height"], program["width"]) == (H, W)
    assert set(manifest["levers"]) == {"matmul_k_split"}

    # The first gate: zero recompiles in fresh serving processes, identical twins; no baseline.
    doc = _cli(project, "gate", first, "--baseline", "none", "--registry", reg, "--report", str(tmp_path / "r1"))
    assert doc["status"] == "passed" and doc["result"]["tier"] is None
    zero = _gate(doc, "zero-recompile")
    assert zero["status"] == "passed" and "0 compiles" in zero["summary"]
    assert _gate(doc, "twin-baseline")["status"] == "passed"
    # The serving processes never imported torch or the compiler.
    assert not {"torch", "torchax", "avatar_release.compile"} & set(zero["details"]["imports"])

    assert _cli(project, "promote", first, "--to", "staging", "--registry", reg)["changed"] is True
    # From outside the project, promotion names it: the policy checks the build against its target spec.
    refused = _cli(elsewhere, "promote", "staging", "--to", "prod", "--registry", reg, rc=1)
    assert (
        "cannot check that the build is a cpu-8 program" in refused["message"] and "--project DIR" in refused["message"]
    )
    assert (
        _cli(elsewhere, "promote", "staging", "--to", "prod", "--project", str(project), "--registry", reg)["changed"]
        is True
    )

    # A render from prod as a pod does it: the example's frame size, 0 compiles (cwd: no project needed).
    frames_dir = tmp_path / "frames"
    doc = _cli(
        elsewhere,
        "render",
        "--channel",
        "prod",
        "--seconds",
        "0.5",
        "--out",
        str(tmp_path / "prod.mp4"),
        "--frames-dir",
        str(frames_dir),
        "--registry",
        reg,
    )
    assert doc["build_id"] == first and doc["compiles"] == 0 and doc["frames"] == 13 and doc["chunks"] == 2
    from PIL import Image

    pngs = sorted(frames_dir.glob("*.png"))
    assert len(pngs) == 13 and {Image.open(p).size for p in pngs} == {(W, H)}

    # A streamed request through the serving pod: ready only after a warm chunk with 0 compiles.
    with served_pod(reg, elsewhere, tmp_path / "pod.log", project_env()) as ready:
        assert ready["event"] == "ready" and ready["compiles"] == 0 and ready["build_id"] == first
        req = urllib.request.Request(
            f"http://127.0.0.1:{ready['port']}/render",
            data=b'{"seconds": 0.4, "seed": 3}',
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            headers, body = resp.headers, resp.read()
        assert headers["X-Compiles"] == "0" and headers["X-Frames"] == "10" and headers["X-Build-Id"] == first
        assert body[4:8] == b"ftyp" and b"moof" in body
    from avatar_release.media import probe_mp4

    (tmp_path / "served.mp4").write_bytes(body)
    probe = probe_mp4(tmp_path / "served.mp4")
    assert (probe.width, probe.height, probe.frames) == (W, H, 10)

    # A changed build (a config key that is no lever) against prod: tier 1, not bit-exact, exit 1.
    changed = _cli(project, "compile", "--pipeline", "puppet-tiny", "--set", "decode.contrast=0.3", "--registry", reg)[
        "build_id"
    ]
    doc = _cli(project, "gate", changed, "--registry", reg, "--report", str(tmp_path / "r2"), rc=1)
    assert doc["result"]["status"] == "failed" and doc["result"]["tier"] == 1
    assert any("decode.contrast" in r and "tier 1" in r for r in doc["result"]["tier_reasons"])
    assert _gate(doc, "bit-exact")["status"] == "failed" and _gate(doc, "similarity-band")["status"] == "skipped"

    # The declared lever, compiled and gated from elsewhere with --project: tier 2, judged by the
    # example's own band (k = 2 is one of its band_variants: one frame moves by one level, inside it).
    lever = _cli(
        elsewhere,
        "compile",
        "--project",
        str(project),
        "--pipeline",
        "puppet-tiny",
        "--set",
        "matmul_k_split=2",
        "--registry",
        reg,
    )["build_id"]
    doc = _cli(elsewhere, "gate", lever, "--project", str(project), "--registry", reg, "--report", str(tmp_path / "r3"))
    result = doc["result"]
    assert result["status"] == "passed" and result["tier"] == 2 and result["baseline"]
    assert result["tier_reasons"] == ["override matmul_k_split: None -> 2 (reassociation)"]
    band_file = project / "manifests" / "bands" / "puppet-tiny-cpu-8.json"
    band = json.loads(band_file.read_text())
    assert Path(result["band"]["path"]).resolve() == band_file.resolve()
    assert result["band"]["psnr_floor_db"] == band["psnr_floor_db"]
    assert _gate(doc, "bit-exact")["status"] == "failed"  # the lever moved pixels: the band decided
    sb = _gate(doc, "similarity-band")
    assert sb["status"] == "passed" and sb["details"]["min_psnr_db"] >= band["psnr_floor_db"]
    assert sb["details"]["max_abs_diff"] <= band["max_abs_diff_ceiling"]

    rows = {r["build_id"]: r for r in _cli(elsewhere, "ls", "--registry", reg)["builds"]}
    assert set(rows[first]["channels"]) == {"staging", "prod"} and rows[lever]["channels"] == ["dev"]
    assert rows[changed]["gate"] == "failed" and rows[lever]["gate"] == "passed"
