"""A build's identity covers what a pod applies: editing the flag profile a manifest carries (the
XLA_FLAGS a serving process sets, the compiler options) changes the build id or is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from avatar_release.errors import IntegrityError
from avatar_release.records import (
    BUILD_SCHEMA_VERSION,
    Manifest,
    build_id_for,
    check_identity,
    manifest_identity,
    parse_record,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _current() -> Manifest:
    return parse_record(Manifest, (DATA / f"build-manifest.v{BUILD_SCHEMA_VERSION}.json").read_bytes(), where="x")


def test_the_stored_current_manifest_hashes_to_its_own_identity():
    m = _current()
    check_identity(m)
    assert build_id_for(m.pipeline, m.target, manifest_identity(m)) == m.build_id


@pytest.mark.parametrize(
    "field, value",
    [
        ("env_flags", ["--xla_cpu_enable_fast_math=true"]),
        ("compiler_options", {"xla_cpu_enable_fast_min_max": True}),
        ("kernel_flags", {"XLA_TPU_FORCE_LP_LLO_SCHEDULER": False}),
    ],
)
def test_an_edited_flag_profile_is_refused_or_renames_the_build(field, value):
    m = _current()
    edited = m.model_copy(update={"flags": m.flags.model_copy(update={field: value})})
    with pytest.raises(IntegrityError, match="hash to identity"):
        check_identity(edited)
    assert build_id_for(m.pipeline, m.target, manifest_identity(edited)) != m.build_id


def test_flags_from_an_edited_manifest_are_never_applied(monkeypatch):
    from avatar_release.machine import configure_for_manifest

    m = _current()
    edited = m.model_copy(update={"flags": m.flags.model_copy(update={"env_flags": ["--xla_dump_to=/tmp/x"]})})
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(IntegrityError):
        configure_for_manifest(edited)
    import os

    assert "--xla_dump_to" not in os.environ.get("XLA_FLAGS", "")
