"""An audio -> audio pipeline released end to end from a copy outside the repository.

`examples/own-pipeline`'s third pipeline, `echo` (spec `echo-tiny`: one stage, 8 kHz audio in,
8 kHz audio out, no picture, no noise), declares its request with a ``RequestProgram`` that
delivers audio. Driven only through the CLI and HTTP, as its users would: compile, the first gate
(its delivered chunks hashed and compared), staging, prod, a render to a WAV and a served request
answering a WAV with zero compiles; the request fields and the OpenAPI document follow the
declaration, and what it does not declare is refused.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import cli_json, post_json, project_env, served_pod

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"
SR, SPF = 8000, 320  # 25 frames a second


def _cli(cwd: Path, *args: str, rc: int = 0) -> dict:
    return cli_json(cwd, *args, env=project_env(), rc=rc, timeout=300)


def _wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(SR)
        wf.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _read_wav(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as wf:
        assert (wf.getnchannels(), wf.getsampwidth()) == (1, 2)
        return wf.getframerate(), np.frombuffer(wf.readframes(wf.getnframes()), "<i2") / 32767


def test_an_audio_to_audio_pipeline_is_released_gated_by_its_chunks_and_served_as_wav(tmp_path):
    project = tmp_path / "own-pipeline"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    assert not project.resolve().is_relative_to(ROOT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reg = str(tmp_path / "registry")

    doc = _cli(project, "compile", "--pipeline", "echo-tiny", "--target", "cpu-8", "--registry", reg)
    build = doc["build_id"]
    program = _cli(project, "inspect", build, "--registry", reg)["manifest"]["program"]
    assert [(i["kind"], i["name"]) for i in program["inputs"]] == [("audio", "audio")]
    assert (program["delivers"]["kind"], program["delivers"]["sample_rate"]) == ("audio", SR)

    # The gate set follows it (audio variants only); the units are the delivered chunks.
    doc = _cli(project, "gate", build, "--baseline", "none", "--registry", reg, "--report", str(tmp_path / "r1"))
    assert doc["status"] == "passed"
    assert [q["name"] for q in doc["result"]["gate_set"]["requests"]] == ["audio0", "audio1"]
    gates = {g["name"]: g for g in doc["result"]["gates"]}
    assert gates["twin-baseline"]["status"] == "passed" and "chunks" in gates["twin-baseline"]["summary"]
    assert [len(h) for h in doc["result"]["frame_sha256"]] == [
        len(q["buckets"]) for q in doc["result"]["gate_set"]["requests"]
    ]

    assert _cli(project, "promote", build, "--to", "staging", "--registry", reg)["changed"] is True
    assert (
        _cli(elsewhere, "promote", "staging", "--to", "prod", "--project", str(project), "--registry", reg)["changed"]
        is True
    )

    # render: a WAV at the delivered rate, as long as the speech track (in whole frames).
    track = 0.3 * np.sin(np.arange(int(0.5 * SR)) * 2 * np.pi * 220 / SR)
    (tmp_path / "in.wav").write_bytes(_wav(track))
    out = tmp_path / "prod.wav"
    doc = _cli(
        elsewhere,
        "render",
        "--channel",
        "prod",
        "--audio",
        str(tmp_path / "in.wav"),
        "--out",
        str(out),
        "--registry",
        reg,
    )
    assert doc["build_id"] == build and doc["compiles"] == 0 and doc["frames"] == 13
    rate, rendered = _read_wav(out.read_bytes())
    assert rate == SR and rendered.shape == (13 * SPF,) and np.abs(rendered[: len(track)]).max() > 0.05

    with served_pod(reg, elsewhere, tmp_path / "pod.log", project_env()) as ready:
        assert ready["event"] == "ready" and ready["compiles"] == 0 and ready["build_id"] == build
        port = ready["port"]
        status, headers, body = post_json(port, {"audio_b64": base64.b64encode(_wav(track[: int(0.4 * SR)])).decode()})
        assert status == 200, body[:300]
        assert headers["Content-Type"] == "audio/wav" and headers["X-Compiles"] == "0"
        assert headers["X-Frames"] == "10" and headers["X-Build-Id"] == build
        rate, served = _read_wav(body)
        assert rate == SR and served.shape == (10 * SPF,)
        assert np.array_equal(served, rendered[: 10 * SPF])  # the same model, the same samples as render's
        for field in ("seed", "image_b64"):
            status, _, body = post_json(port, {field: 3 if field == "seed" else "AAAA"})
            assert status == 400 and json.loads(body)["message"].startswith(f"{field}: Extra inputs are not permitted")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=30) as resp:
            api = json.loads(resp.read())
        assert set(api["components"]["schemas"]["RenderRequest"]["properties"]) == {
            "seconds",
            "audio_b64",
            "audio_wav_b64",
        }
        render = api["paths"]["/render"]["post"]
        assert list(render["responses"]["200"]["content"]) == ["audio/wav"]
        assert render["summary"].startswith("render audio (WAV) from audio")
