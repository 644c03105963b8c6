"""A pipeline author's mistakes, made in a copy of examples/own-pipeline outside the repository and
compiled through the CLI: each is exit 2 before anything is compiled or published, naming the
contract member, the file and line in the project, and what was declared against what was traced.

A wrong declaration used to compile with exit 0 and record the declared shape in the manifest; a
ValueError in the model's code ended as exit 70 ("a bug; please report it"); a trace failure named
neither the model's file nor its line; a factory without ``return`` was told "member 'name' must be
a str; missing".
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import cli_json

pytestmark = [pytest.mark.slow, pytest.mark.extra("compile")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"
MOTION_FORWARD = "        frames = noise.shape[0]\n"  # the first line of Motion.forward's body


def _edit(path: Path, old: str, new: str) -> int:
    """Replace ``old`` (once) in ``path``; the line ``new`` starts on."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r}: update this test's mistake"
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def _compile(tmp_path: Path, rc: int) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "AVATAR_RELEASE_PROJECT", "AVATAR_RELEASE_MANIFESTS", "AVATAR_RELEASE_REGISTRY")
    }
    return cli_json(
        tmp_path / "own-pipeline",
        "compile",
        "--pipeline",
        "puppet-tiny",
        "--target",
        "cpu-8",
        "--registry",
        tmp_path / "registry",
        env=env,
        rc=rc,
        timeout=300,
    )


@pytest.fixture
def project(tmp_path) -> Path:
    copy = tmp_path / "own-pipeline"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__", ".avatar-release", "gate-reports"))
    assert not copy.resolve().is_relative_to(ROOT)
    return copy


def _refused(tmp_path: Path) -> str:
    doc = _compile(tmp_path, rc=2)
    assert doc["error"] == "ContractError" and doc["exit_code"] == 2
    registry = tmp_path / "registry"
    assert not registry.exists() or not any(registry.rglob("*.json")), "a refused compile published something"
    return doc["message"]


def _signature_line(project: Path) -> int:
    text = (project / "puppet" / "release.py").read_text()
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("def _signature("))


def test_an_output_declared_twice_as_wide_as_traced_is_refused_with_both_shapes(tmp_path, project):
    _edit(
        project / "puppet" / "model.py",
        '("poses", (frames, P), "float32"), ("last_pose"',
        '("poses", (frames, 2 * P), "float32"), ("last_pose"',
    )
    message = _refused(tmp_path)
    assert message.startswith(
        f"pipeline spec puppet-tiny: signature (puppet/release.py:{_signature_line(project)}): "
        "stage motion, bucket f8: output 'poses' is declared (8, 32) float32, traced (8, 16) "
        "float32"
    ), message


def test_an_output_declared_with_another_dtype_is_refused(tmp_path, project):
    _edit(project / "puppet" / "model.py", '("last_pose", (P,), "float32")]', '("last_pose", (P,), "bfloat16")]')
    message = _refused(tmp_path)
    assert "stage motion, bucket f8: output 'last_pose' is declared (16,) bfloat16, traced (16,) float32" in message, (
        message
    )


def test_delivered_video_declared_with_one_channel_is_refused(tmp_path, project):
    _edit(
        project / "puppet" / "model.py",
        '(frames, config.height, config.width, 3), "uint8")]',
        '(frames, config.height, config.width, 1), "uint8")]',
    )
    message = _refused(tmp_path)
    assert message.startswith(
        "pipeline spec puppet-tiny, bucket f8: chunk_program does not match the stage "
        "signatures: the delivered video 'frames' (stage decode output) is declared "
        "(8, 32, 64, 1) uint8, expected (8, 32, 64, 3) uint8"
    ), message


def test_a_value_error_in_the_models_forward_names_the_stage_and_its_line(tmp_path, project):
    line = _edit(
        project / "puppet" / "model.py",
        MOTION_FORWARD,
        '        raise ValueError("pose_dim must be even")\n' + MOTION_FORWARD,
    )
    message = _refused(tmp_path)
    assert message.startswith(
        "pipeline spec puppet-tiny: stage(tree, 'motion') (bucket f8), while traced, raised "
        f"ValueError: pose_dim must be even at puppet/model.py:{line} (in forward)"
    ), message


def test_a_tensor_made_outside_the_traced_device_names_its_line(tmp_path, project):
    # torch.full with no device makes a CPU tensor inside the trace: torchax refuses the mixed math.
    line = (
        _edit(
            project / "puppet" / "model.py",
            MOTION_FORWARD,
            MOTION_FORWARD + "        pose = pose + torch.full((pose.shape[0],), 0.5)\n",
        )
        + 1
    )
    message = _refused(tmp_path)
    assert message.startswith("pipeline spec puppet-tiny: stage(tree, 'motion') (bucket f8), while traced, raised "), (
        message
    )
    assert f"at puppet/model.py:{line} (in forward)" in message, message


def test_a_value_error_while_the_model_is_built_names_init_weights_and_its_line(tmp_path, project):
    line = _edit(
        project / "puppet" / "model.py",
        "        self.decode = Decode(config)\n",
        '        raise ValueError("decode needs a config.decode")\n',
    )
    message = _refused(tmp_path)
    assert message.startswith(
        "pipeline spec puppet-tiny: init_weights(config, 0) raised ValueError: decode needs "
        f"a config.decode at puppet/model.py:{line} (in __init__)"
    ), message


def test_a_factory_without_return_is_told_so(tmp_path, project):
    _edit(
        project / "puppet" / "release.py", "    return init_weights(config, seed)\n", "    init_weights(config, seed)\n"
    )
    message = _refused(tmp_path)
    assert message.startswith(
        "pipeline spec puppet-tiny: factory init_weights(config, 0) returned None; did it forget `return`?"
    ), message


def test_an_entry_function_without_return_is_told_so(tmp_path, project):
    _edit(project / "puppet" / "release.py", "pipeline = Pipeline(\n", "def make_pipeline():\n    Pipeline(\n")
    text = (project / "puppet" / "release.py").read_text()
    head, _, tail = text.partition("def make_pipeline():\n")
    body = "".join(("    " + line if line else line) for line in tail.splitlines(keepends=True)[1:])
    (project / "puppet" / "release.py").write_text(head + "def make_pipeline():\n    Pipeline(\n" + body)
    _edit(
        project / "manifests" / "pipelines" / "puppet-tiny.toml",
        'entry = "puppet.release:pipeline"',
        'entry = "puppet.release:make_pipeline"',
    )
    message = _refused(tmp_path)
    assert message.startswith(
        "pipeline spec puppet-tiny: entry 'puppet.release:make_pipeline': factory "
        "make_pipeline returned None; did it forget `return`?"
    ), message
