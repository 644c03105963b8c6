"""What a pipeline's own code raises is an input error naming its author's file and line, and the
traced program is held to the declared signature (pipeline/_author.py, compile/_stage.py).

Model files are written into a temporary project (and a helper into a site-packages folder beside
it), so the frames are real frames of real files: the message names the innermost one inside the
project, never the installed package's nor the toolchain's.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from avatar_release.compile._stage import StagePlan, check_outputs, lower_stage
from avatar_release.errors import CompileError, ContractError
from avatar_release.pipeline import StageSignature, author_frame, check_pipeline, defined_at, signature_of
from avatar_release.records import ArraySpec

MODEL = """
def broken(helper, x):
    return helper.call(lambda: int("not a number"))


def through_helper(helper):
    return helper.call(lambda: None)


def make_nothing():
    pass


def make_broken():
    raise ValueError("the author's entry broke")


def stage_raises(params, args):
    (x,) = args
    raise ValueError("the stage broke")


def stage_wide(params, args):
    (x,) = args
    import jax.numpy as jnp
    return jnp.concatenate([x @ params["w"], x], axis=-1)
"""
HELPER = """
def call(fn):
    return fn()
"""


def _module(name: str, path: Path, text: str) -> ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def files(tmp_path):
    """(project root, the model module under it, a helper module in an installed package's folder)."""
    project = tmp_path / "proj"
    model = _module("author_model", project / "puppet" / "model.py", MODEL)
    helper = _module("author_helper", tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "helper.py", HELPER)
    return project, model, helper


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_innermost_frame_inside_the_project_is_named_not_the_installed_one(files):
    project, model, helper = files
    with pytest.raises(ValueError) as info:
        model.broken(helper, 1)
    # The innermost frame is the lambda in the model (called from the installed helper).
    assert author_frame(info.value, project) == f"puppet/model.py:{_line(MODEL, 'not a number')} (in <lambda>)"
    assert author_frame(info.value, project.parent / "elsewhere") is None  # no frame of that project
    assert author_frame(info.value, None) is None


def test_an_entry_function_that_returns_nothing_is_told_it_forgot_return(files):
    project, model, _ = files
    with pytest.raises(ContractError, match=r"^spec x: factory make_nothing returned None; did it forget `return`\?"):
        check_pipeline(model.make_nothing, "spec x", project)


def test_an_entry_function_that_raises_names_its_file_and_line(files):
    project, model, _ = files
    with pytest.raises(ContractError) as info:
        check_pipeline(model.make_broken, "spec x", project)
    line = _line(MODEL, "the author's entry broke")
    assert str(info.value).startswith(
        "spec x: the entry function raised ValueError: the author's entry broke at "
        f"puppet/model.py:{line} (in make_broken)"
    )
    assert info.value.exit_code == 2


def test_an_entry_that_needs_arguments_is_still_refused_as_such():
    with pytest.raises(ContractError, match="cannot be called with no arguments"):
        check_pipeline(lambda config: None, "spec x")


def test_where_a_function_is_defined_is_named_relative_to_the_project(files):
    project, model, helper = files
    assert defined_at(model.stage_wide, project) == f"puppet/model.py:{_line(MODEL, 'def stage_wide')}"
    assert defined_at(helper.call, project) == "" and defined_at(len, project) == ""


def _plan(fn: object, out_shape: list[int], out_dtype: str = "float32") -> StagePlan:
    return StagePlan(
        stage="toy",
        bucket="f2",
        jax_func=fn,
        params=[ArraySpec(name="toy.w", shape=[4, 4], dtype="float32", sharding=[None, None])],
        param_keys=["w"],
        inputs=[ArraySpec(name="x", shape=[2, 4], dtype="float32", sharding=[None, None])],
        outputs=[ArraySpec(name="y", shape=out_shape, dtype=out_dtype, sharding=[None] * len(out_shape))],
        where="pipeline spec toy-tiny",
        signature_at="toy/release.py:7",
    )


def test_declared_outputs_are_checked_by_number_shape_and_dtype():
    plan = _plan(None, [2, 4])
    check_outputs(plan, (np.zeros((2, 4), np.float32),))
    where = re.escape("pipeline spec toy-tiny: signature (toy/release.py:7): stage toy, bucket f2: ")
    with pytest.raises(
        ContractError,
        match=where
        + re.escape("output 'y' is declared (2, 4) float32, traced (2, 8) float32. Fix the signature or the stage"),
    ):
        check_outputs(plan, (np.zeros((2, 8), np.float32),))
    with pytest.raises(ContractError, match=re.escape("'y' is declared (2, 4) float32, traced (2, 4) int32")):
        check_outputs(plan, (np.zeros((2, 4), np.int32),))
    with pytest.raises(
        ContractError,
        match=re.escape("declares 1 outputs (y), the traced program returns 2 ((2, 4) float32, (2,) float32)"),
    ):
        check_outputs(plan, (np.zeros((2, 4), np.float32), np.zeros(2, np.float32)))


@pytest.fixture
def mesh():
    return Mesh(np.array(jax.devices()[:1]), ("fsdp",))


def test_a_stage_traced_wider_than_declared_is_refused_before_lowering(files, mesh):
    project, model, _ = files
    with pytest.raises(
        ContractError,
        match=re.escape("stage toy, bucket f2: output 'y' is declared (2, 4) float32, traced (2, 8) float32"),
    ):
        lower_stage(_plan(model.stage_wide, [2, 4]), mesh, project_root=project)
    assert lower_stage(_plan(model.stage_wide, [2, 8]), mesh, project_root=project).lowered is not None


def test_a_stage_that_raises_while_traced_names_the_member_and_its_line(files, mesh):
    project, model, _ = files
    with pytest.raises(ContractError) as info:
        lower_stage(_plan(model.stage_raises, [2, 4]), mesh, project_root=project)
    line = _line(MODEL, "the stage broke")
    assert str(info.value).startswith(
        "pipeline spec toy-tiny: stage(tree, 'toy') (bucket f2), while traced, raised "
        f"ValueError: the stage broke at puppet/model.py:{line} (in stage_raises)"
    )


def test_a_trace_failure_outside_the_project_stays_a_compile_error(mesh, tmp_path):
    def outside(params, args):  # this test file: not under the project root
        raise ValueError("not the author's")

    with pytest.raises(CompileError, match="tracing or lowering failed: ValueError: not the author's"):
        lower_stage(_plan(outside, [2, 4]), mesh, project_root=tmp_path / "proj")


def test_a_signature_shape_that_is_not_ints_is_refused_naming_the_tensor():
    sig = StageSignature(inputs=(("x", (2, "four"), "float32"),), outputs=())
    pipe = SimpleNamespace(stages=("toy",), signature=lambda config, frames: {"toy": sig})
    with pytest.raises(
        ContractError,
        match=r"^spec x: stage toy: 'x''s shape must be a tuple of ints, "
        r"got \(2, 'four'\)",
    ):
        signature_of(pipe, None, 2, "spec x")
