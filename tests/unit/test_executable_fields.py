"""The executable entry's fields have one source: ``records.CompileEvidence`` (what the compile
step finds) plus the slot the packager adds. A tiny jitted program goes through the real
lower -> compile -> package steps; a field added on one side and not carried by the other fails here."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from avatar_release.compile._package import _executable_entry
from avatar_release.compile._stage import CompiledStage, StagePlan, compile_stage, lower_stage
from avatar_release.records import ArraySpec, CompileEvidence, ExecutableEntry


@pytest.fixture(scope="module")
def compiled() -> CompiledStage:
    def stage(params, args):
        (x,) = args
        return jnp.tanh(x @ params["w"])

    plan = StagePlan(
        stage="toy",
        bucket="f1",
        jax_func=stage,
        params=[ArraySpec(name="toy.w", shape=[4, 4], dtype="float32", sharding=[None, None])],
        param_keys=["w"],
        inputs=[ArraySpec(name="x", shape=[2, 4], dtype="float32", sharding=[None, None])],
        outputs=[ArraySpec(name="y", shape=[2, 4], dtype="float32", sharding=[None, None])],
    )
    mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    return compile_stage(lower_stage(plan, mesh), {})


def test_the_entry_takes_every_field_of_the_compile_evidence_and_nothing_else_is_a_parallel_list():
    evidence, entry = set(CompileEvidence.model_fields), set(ExecutableEntry.model_fields)
    assert evidence < entry
    # CompiledStage carries the evidence as one record, never its own copy of the entry's fields.
    assert not {f.name for f in dataclasses.fields(CompiledStage)} & entry


def test_compile_stage_sets_every_evidence_field(compiled):
    # A field with a default that compile_stage forgets would be recorded as the default, silently.
    unset = set(CompileEvidence.model_fields) - compiled.evidence.model_fields_set
    assert not unset, f"compile_stage leaves {sorted(unset)} at their defaults: set them in compile/_stage.py"
    assert compiled.evidence.hlo_digest.startswith("sha256:") and compiled.evidence.in_tree


def test_the_packaged_entry_sets_every_field_and_carries_the_evidence_unchanged(compiled):
    entry = _executable_entry(compiled, b"zstd bytes", "xla-executable")
    # A field added to the entry's slot with a default, that the packager does not set, fails here.
    unset = set(ExecutableEntry.model_fields) - entry.model_fields_set
    assert not unset, f"the packager leaves {sorted(unset)} at their defaults: set them in compile/_package.py"
    assert {k: getattr(entry, k) for k in CompileEvidence.model_fields} == dict(compiled.evidence)
    assert (entry.key, entry.raw_size) == ("toy/f1", len(compiled.payload))
