"""The pipeline contract seen from outside: a project the toolchain has never heard of
(examples/own-pipeline, package `puppet`) satisfies it; entries that do not are refused with a
ContractError that names the member and the contract's page, from the library and from the CLI."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import ContractError
from avatar_release.pipeline import (
    CONTRACT_PAGE,
    ChunkProgramSpec,
    Pipeline,
    check_pipeline,
    load_entry,
    signature_of,
)
from avatar_release.specs import PROJECT_ENV, find_project, load_pipeline

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-pipeline"
MEMBERS = ("name", "stages", "configs", "create", "init_weights", "load_weights", "stage", "signature", "chunk_program")


@pytest.fixture(autouse=True)
def _no_project_env(monkeypatch):
    monkeypatch.delenv(PROJECT_ENV, raising=False)
    monkeypatch.delenv("AVATAR_RELEASE_MANIFESTS", raising=False)


@pytest.fixture
def puppet(monkeypatch):
    """The example's entry object, imported from its project; its modules forgotten afterwards."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    try:
        yield importlib.import_module("puppet.release").pipeline
    finally:
        _forget_puppet()


def _forget_puppet() -> None:
    for name in [m for m in sys.modules if m == "puppet" or m.startswith("puppet.")]:
        del sys.modules[name]


@pytest.mark.extra("compile")  # its signature imports the model (torch)
def test_the_example_pipeline_satisfies_the_contract(puppet):
    p = check_pipeline(puppet, "examples/own-pipeline")
    assert isinstance(p, Pipeline) and p.stages == ("motion", "decode") and set(p.configs) == {"tiny", "small"}
    assert set(p.levers) == {"matmul_k_split"} and p.levers["matmul_k_split"].effect == "reassociation"
    assert p.band_variants == ({"matmul_k_split": "2"}, {"matmul_k_split": "4"})
    config = p.config("tiny")
    assert dataclasses.is_dataclass(config) and (config.height, config.width) == (32, 64)
    program = p.chunk_program(config)
    assert isinstance(program, ChunkProgramSpec) and program.carry == {"pose": "last_pose"}
    sigs = signature_of(p, config, 8, "puppet")
    ins = {t.name: t for s in sigs.values() for t in s.inputs}
    outs = {t.name: t for s in sigs.values() for t in s.outputs}
    assert ins["image"].shape == (32, 64, 3) and ins["image"].dtype == "uint8"
    assert ins["audio"].shape == (8 * program.samples_per_frame,) and ins["noise"].dtype == "float32"
    assert ins["pose"].shape == outs["last_pose"].shape  # the carried state feeds itself
    assert outs[program.deliver].shape == (8, 32, 64, 3) and outs[program.deliver].dtype == "uint8"


def test_the_example_spec_entry_loads_from_its_project(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the project's root is put first while importing
    monkeypatch.setenv(PROJECT_ENV, str(EXAMPLE))
    try:
        spec = load_pipeline("puppet-tiny")
        p = load_entry(spec, find_project())
    finally:
        _forget_puppet()
    assert spec.entry == "puppet.release:pipeline" and spec.config == "tiny"
    assert p.name == "puppet" and p.source_packages == ("puppet",)


@pytest.mark.extra("compile")
def test_the_example_weights_are_seeded_named_by_stage_and_checked_on_load(puppet, tmp_path):
    import torch
    from safetensors.torch import save_file

    config = puppet.config("tiny")
    with torch.device("meta"):
        tree = puppet.create(config)
    assert all(t.is_meta for t in tree.state_dict().values())
    a, b, c = puppet.init_weights(config, 0), puppet.init_weights(config, 0), puppet.init_weights(config, 1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and not all(torch.equal(sa[k], sc[k]) for k in sa)
    for stage in puppet.stages:
        module = puppet.stage(a, stage)
        assert isinstance(module, torch.nn.Module)
        assert all(f"{stage}.{k}" in sa for k in module.state_dict())
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in sa.items()}, str(path))
    loaded = puppet.load_weights(config, str(path)).state_dict()
    assert all(torch.equal(loaded[k], sa[k]) for k in sa)
    save_file({k: v.contiguous() for k, v in sa.items() if k != "decode.fc2.bias"}, str(path))
    with pytest.raises(ValueError, match="decode.fc2.bias"):
        puppet.load_weights(config, str(path))
    small = puppet.config("small")
    save_file({k: v.contiguous() for k, v in sa.items()}, str(path))
    with pytest.raises(ValueError, match="expected"):
        puppet.load_weights(small, str(path))


def _complete(puppet) -> dict:
    return {m: getattr(puppet, m) for m in MEMBERS}


@pytest.mark.parametrize("member", MEMBERS)
def test_an_object_missing_a_member_is_refused_naming_it(puppet, member):
    members = _complete(puppet)
    del members[member]
    with pytest.raises(ContractError) as e:
        check_pipeline(SimpleNamespace(**members), "entry x")
    assert f"member {member!r}" in str(e.value) and "missing" in str(e.value) and CONTRACT_PAGE in str(e.value)


@pytest.mark.parametrize(
    "member, value",
    [
        ("name", ""),
        ("stages", "motion"),  # a string is not a tuple of stage names
        ("stages", ("motion", "motion")),
        ("configs", {"tiny": "not callable"}),
        ("chunk_program", None),
        ("levers", {"matmul_k_split": "reassociation"}),  # not a Lever
        ("band_variants", ({"matmul_k_split": 2},)),  # values are override strings
        ("gate_requests", ((0, 1), (0, 1))),
        ("source_packages", ("",)),
    ],
)
def test_an_object_with_a_wrong_member_is_refused_naming_it(puppet, member, value):
    members = {**_complete(puppet), "levers": dict(puppet.levers), member: value}
    with pytest.raises(ContractError) as e:
        check_pipeline(SimpleNamespace(**members), "entry x")
    assert f"member {member!r}" in str(e.value) and CONTRACT_PAGE in str(e.value)


def test_an_entry_that_names_some_other_function_is_refused():
    with pytest.raises(ContractError) as e:
        check_pipeline(json.loads, "pipeline spec bad: entry 'json:loads'")
    assert "json:loads" in str(e.value) and CONTRACT_PAGE in str(e.value)


def test_compile_refuses_a_spec_whose_entry_is_not_a_pipeline_with_exit_2(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    shutil.copytree(EXAMPLE / "manifests", project / "manifests")
    spec = (EXAMPLE / "manifests" / "pipelines" / "puppet-tiny.toml").read_text()
    bad = spec.replace('name = "puppet-tiny"', 'name = "bad"').replace('"puppet.release:pipeline"', '"json:loads"')
    assert 'entry = "json:loads"' in bad
    (project / "manifests" / "pipelines" / "bad.toml").write_text(bad)
    monkeypatch.setenv(PROJECT_ENV, str(project))  # restored after the test (--project sets it too)
    res = CliRunner().invoke(
        cli, ["compile", "--pipeline", "bad", "--project", str(project), "--registry", str(tmp_path / "reg"), "--json"]
    )
    assert res.exit_code == 2, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"] == "ContractError"
    assert "json:loads" in doc["message"] and CONTRACT_PAGE in doc["message"]
    assert not (tmp_path / "reg").exists() or not any((tmp_path / "reg").rglob("*.json"))


def test_the_toolchain_never_names_the_example():
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "avatar_release").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "puppet" in line.lower() or "own-pipeline" in line
    ]
    assert hits == []
