"""A pipeline that is no talking head, released end to end from a copy outside the repository.

`examples/own-pipeline`'s second pipeline, `still` (spec `still-tiny`: one stage, image -> video, the
frame times fed by the runtime, no audio, no noise), declares its request with a ``RequestProgram``.
Driven only through the CLI and HTTP, as its users would: compile, the first gate, staging, prod, a
render and a served request with zero compiles; the request fields, the OpenAPI document and the
gate set follow its declaration (no audio, no seed), and what it does not declare is refused.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import cli_json, post_json, project_env, served_pod

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"
H, W = 32, 64


def _cli(cwd: Path, *args: str, rc: int = 0) -> dict:
    return cli_json(cwd, *args, env=project_env(), rc=rc, timeout=300)


def test_an_image_to_video_pipeline_is_released_served_and_asked_only_for_what_it_declares(tmp_path):
    project = tmp_path / "own-pipeline"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    assert not project.resolve().is_relative_to(ROOT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reg = str(tmp_path / "registry")

    doc = _cli(project, "compile", "--pipeline", "still-tiny", "--target", "cpu-8", "--registry", reg)
    build = doc["build_id"]
    assert [e["key"] for e in doc["executables"]] == ["sway/f8"]
    program = _cli(project, "inspect", build, "--registry", reg)["manifest"]["program"]
    # The declaration, recorded: an image and the frame times in, video out; no audio, no noise.
    assert [(i["kind"], i["name"], i["required"]) for i in program["inputs"]] == [
        ("image", "image", True),
        ("time", "times", False),
    ]
    assert (program["delivers"]["kind"], program["delivers"]["outputs"]) == ("video", ["frames"])
    assert program["audio_input"] is None and program["noise_input"] is None and program["sample_rate"] == 0

    # The gate set follows it: image variants only, no audio; zero recompiles and identical twins.
    doc = _cli(project, "gate", build, "--baseline", "none", "--registry", reg, "--report", str(tmp_path / "r1"))
    assert doc["status"] == "passed"
    assert [q["name"] for q in doc["result"]["gate_set"]["requests"]] == ["image0", "image1"]
    assert {g["name"]: g["status"] for g in doc["result"]["gates"]} == {
        "zero-recompile": "passed",
        "twin-baseline": "passed",
    }

    assert _cli(project, "promote", build, "--to", "staging", "--registry", reg)["changed"] is True
    assert (
        _cli(elsewhere, "promote", "staging", "--to", "prod", "--project", str(project), "--registry", reg)["changed"]
        is True
    )

    # render: the length is --seconds (0.5 s at 25 fps: 13 frames), the video has no audio track.
    out = tmp_path / "prod.mp4"
    doc = _cli(elsewhere, "render", "--channel", "prod", "--seconds", "0.5", "--out", str(out), "--registry", reg)
    assert doc["build_id"] == build and doc["compiles"] == 0 and doc["frames"] == 13 and doc["chunks"] == 2
    from avatar_release.media import probe_mp4

    probe = probe_mp4(out)
    assert (probe.width, probe.height, probe.frames, probe.audio_codec) == (W, H, 13, None)
    refused = _cli(
        elsewhere,
        "render",
        "--channel",
        "prod",
        "--audio",
        str(ROOT / "examples" / "media" / "speech.wav"),
        "--out",
        str(tmp_path / "x.mp4"),
        "--registry",
        reg,
        rc=2,
    )
    assert "declares no audio input" in refused["message"]

    with served_pod(reg, elsewhere, tmp_path / "pod.log", project_env()) as ready:
        assert ready["event"] == "ready" and ready["compiles"] == 0 and ready["build_id"] == build
        port = ready["port"]
        # The request's fields are the declaration's: a picture and the length; no audio, no seed.
        picture = np.full((H, W, 3), 200, np.uint8)
        buf = io.BytesIO()
        np.save(buf, picture, allow_pickle=False)
        status, headers, body = post_json(
            port, {"seconds": 0.4, "image_b64": base64.b64encode(buf.getvalue()).decode()}
        )
        assert status == 200, body[:300]
        assert headers["X-Compiles"] == "0" and headers["X-Frames"] == "10" and headers["X-Build-Id"] == build
        (tmp_path / "served.mp4").write_bytes(body)
        status, _, body = post_json(port, {"seconds": 0.4, "seed": 3})
        assert status == 400 and json.loads(body)["message"].startswith("seed: Extra inputs are not permitted")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=30) as resp:
            api = json.loads(resp.read())
        fields = api["components"]["schemas"]["RenderRequest"]["properties"]
        assert set(fields) == {"seconds", "fit", "image_b64", "image_png_b64"}
        assert api["paths"]["/render"]["post"]["summary"].startswith("render a video from a picture")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/still-tiny", timeout=30) as resp:
            meta = json.loads(resp.read())
        assert [i["name"] for i in meta["inputs"]] == ["image", "seconds"]
    served = probe_mp4(tmp_path / "served.mp4")
    assert (served.width, served.height, served.frames, served.audio_codec) == (W, H, 10, None)
