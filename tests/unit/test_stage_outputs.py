"""A stage returns its outputs in whatever container its library gives (issue 40 item 4): a bare
array, a tuple, a dict, a dataclass, or an output class as diffusers and transformers return
(``UNet2DOutput``: an ``OrderedDict`` subclass that is also a dataclass); compile matches them to the
declared outputs and the traced program returns them in declared order (compile/_outputs.py).

``ModelOutput`` below is written here the way transformers' is built (a dataclass subclassing
``OrderedDict`` whose set fields are its items), so the test needs neither diffusers nor transformers.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from avatar_release.compile._outputs import match_outputs, unpack
from avatar_release.compile._stage import StagePlan, compile_stage, lower_stage
from avatar_release.errors import ContractError
from avatar_release.records import ArraySpec


class ModelOutput(OrderedDict):
    """A dataclass whose fields that are not None are also its dict items, in field order."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@dataclass
class UNetOutput(ModelOutput):  # the shape of diffusers' UNet2DOutput: one field, "sample"
    sample: Any = None


@dataclass
class EncoderOutput(ModelOutput):  # several fields, one of them left unset
    pooled: Any = None
    hidden: Any = None
    attentions: Any = None


@dataclass
class Plain:  # a dataclass that is no mapping
    last: Any
    poses: Any


A, B = np.zeros((2, 4), np.float32), np.ones(3, np.float32)
WHERE, PAGE = "pipeline spec toy: signature: stage s, bucket f2", "Fix it."


def test_an_output_class_is_a_dict_of_its_set_fields():
    assert unpack(EncoderOutput(pooled=B, hidden=A)).names == ("pooled", "hidden")  # attentions unset: absent
    assert unpack(UNetOutput(sample=A)).kind == "UNetOutput"


@pytest.mark.parametrize(
    "returned",
    [A, (A,), [A], {"anything": A}, UNetOutput(sample=A), Plain(last=A, poses=None)],
    ids=["bare", "tuple", "list", "dict", "output-class", "dataclass"],
)
def test_one_declared_output_takes_one_array_in_any_container_under_any_name(returned):
    (out,) = match_outputs(returned, ["latents"], WHERE, PAGE)
    assert out is A


@pytest.mark.parametrize(
    "returned",
    [{"last": B, "poses": A}, EncoderOutput(hidden=A, pooled=B), Plain(last=B, poses=A)],
    ids=["dict", "output-class", "dataclass"],
)
def test_several_declared_outputs_are_matched_by_name_in_declared_order(returned):
    names = ["hidden", "pooled"] if isinstance(returned, EncoderOutput) else ["poses", "last"]
    first, second = match_outputs(returned, names, WHERE, PAGE)
    assert first is A and second is B


def test_a_tuple_is_matched_by_position():
    assert match_outputs((B, A), ["x", "y"], WHERE, PAGE) == (B, A)


def test_a_missing_or_undeclared_name_is_refused_naming_both_sides():
    with pytest.raises(ContractError) as info:
        match_outputs(EncoderOutput(pooled=B, hidden=A), ["hidden", "mask"], WHERE, PAGE)
    assert str(info.value) == (
        "pipeline spec toy: signature: stage s, bucket f2: declares outputs (hidden, mask), the stage returned "
        "EncoderOutput {pooled: (3,) float32, hidden: (2, 4) float32}: missing 'mask'; not declared 'pooled' "
        "(a mapping's or dataclass's entries are matched to the declared outputs by name). Fix it."
    )
    assert info.value.exit_code == 2
    with pytest.raises(
        ContractError,
        match=re.escape(
            "declares outputs (y), the stage returned dict {a: (2, 4) "
            "float32, b: (3,) float32}: missing 'y'; not declared 'a', 'b' "
            "(one declared output takes a container of exactly one array"
        ),
    ):
        match_outputs({"a": A, "b": B}, ["y"], WHERE, PAGE)


# ---- through the real trace -> lower -> compile steps -------------------------------------------------


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("fsdp",))


def _plan(fn: Any, outputs: list[tuple[str, list[int]]]) -> StagePlan:
    return StagePlan(
        stage="toy",
        bucket="f2",
        jax_func=fn,
        params=[ArraySpec(name="toy.w", shape=[4, 4], dtype="float32", sharding=[None, None])],
        param_keys=["w"],
        inputs=[ArraySpec(name="x", shape=[2, 4], dtype="float32", sharding=[None, None])],
        outputs=[ArraySpec(name=n, shape=s, dtype="float32", sharding=[None] * len(s)) for n, s in outputs],
        where="pipeline spec toy-tiny",
        signature_at="toy/release.py:7",
    )


def _run(plan: StagePlan, mesh: Mesh) -> tuple[np.ndarray, ...]:
    cs = compile_stage(lower_stage(plan, mesh), {})
    w, x = np.eye(4, dtype=np.float32) * 2, np.arange(8, dtype=np.float32).reshape(2, 4)
    return tuple(np.asarray(o) for o in cs.compiled({"w": w}, x))


def test_a_jax_stage_returning_a_dict_compiles_to_its_declared_order(mesh):
    def stage(params, args):
        (x,) = args
        y = x @ params["w"]
        return {"total": y.sum(-1), "y": y}  # the dict's order is not the signature's

    y, total = _run(_plan(stage, [("y", [2, 4]), ("total", [2])]), mesh)
    x2 = np.arange(8, dtype=np.float32).reshape(2, 4) * 2
    np.testing.assert_array_equal(y, x2)
    np.testing.assert_array_equal(total, x2.sum(-1))


@pytest.mark.slow  # torch and torchax start here: seconds
@pytest.mark.extra("compile")
def test_a_torch_module_returning_an_output_class_needs_no_wrapper(mesh):
    import torch

    from avatar_release.compile._trace import stage_function

    class Net(torch.nn.Module):  # returns as diffusers' UNet2DModel does: UNet2DOutput(sample=...)
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(4) * 2)

        def forward(self, x):
            return UNetOutput(sample=x @ self.w)

    class Encoder(torch.nn.Module):  # several fields, by name, one unset
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(4) * 3)

        def forward(self, x):
            return EncoderOutput(hidden=x @ self.w, pooled=(x @ self.w).mean(-1))

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _, fn = stage_function(Net())
    (latents,) = _run(_plan(fn, [("latents", [2, 4])]), mesh)
    np.testing.assert_array_equal(latents, x @ (np.eye(4, dtype=np.float32) * 2))
    _, fn = stage_function(Encoder())
    pooled, hidden = _run(_plan(fn, [("pooled", [2]), ("hidden", [2, 4])]), mesh)
    np.testing.assert_allclose(hidden, x * 2)  # the plan's weights (2 I), not the module's: they are arguments
    np.testing.assert_allclose(pooled, (x * 2).mean(-1))


def test_a_mismatch_is_refused_while_tracing_naming_the_stage_and_bucket(mesh):
    def stage(params, args):
        (x,) = args
        return {"y": x, "extra": x}

    with pytest.raises(
        ContractError,
        match=re.escape(
            "pipeline spec toy-tiny: signature (toy/release.py:7): stage toy, bucket f2: declares outputs (y), the "
            "stage returned dict {y: (2, 4) float32, extra: (2, 4) float32}: not declared 'extra'"
        ),
    ):
        lower_stage(_plan(stage, [("y", [2, 4])]), mesh)


def test_a_non_array_entry_is_named_as_such(mesh):
    def stage(params, args):
        (x,) = args
        return {"y": x, "scale": 2.0}

    with pytest.raises(
        ContractError, match=re.escape("output 'scale' is declared (1,) float32, traced a float, not an array")
    ):
        lower_stage(_plan(stage, [("y", [2, 4]), ("scale", [1])]), mesh)
