"""One machine description and one diff, as the loader, gates and promotion policy use it."""

from __future__ import annotations

from pathlib import Path

import pytest

from avatar_release.machine import ALL_FIELDS, RUN_FIELDS, Machine, diff_machines
from avatar_release.records import EnvironmentRecord, Manifest
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parents[1] / "data"


def _build() -> Manifest:
    return cpu_manifest()


def _env(m: Manifest, **changes) -> EnvironmentRecord:
    p = m.platform
    fields = dict(
        fingerprint="sha256:" + "1" * 64,
        backend=p.backend,
        platform_version=p.platform_version,
        device_kind=p.device_kind,
        device_count=p.device_count,
        jax=m.toolchain.jax,
        jaxlib=m.toolchain.jaxlib,
        cpu_features=p.cpu_features,
    )
    return EnvironmentRecord(**{**fields, **changes})


def test_the_same_machine_has_no_differences():
    m = _build()
    assert not diff_machines(Machine.of_build(m), Machine.of_environment(_env(m)))


def test_every_differing_field_is_named_with_expected_and_actual():
    m = _build()
    diff = diff_machines(Machine.of_build(m), Machine.of_environment(_env(m, device_count=4, jaxlib="0.9.0")))
    assert diff.differences == {"device_count": (8, 4), "jaxlib": (m.toolchain.jaxlib, "0.9.0")}
    assert "device_count: expected 8, actual 4" in diff.lines()
    assert diff.inline("build", "gated on").startswith("device_count: build 8, gated on 4")


def test_cpu_features_a_build_needs_must_be_present_but_more_is_fine():
    m = _build()
    need = list(m.platform.cpu_features)
    assert need, "the stored build records its CPU features"
    more = _env(m, cpu_features=need + ["amx_tile"])
    assert not diff_machines(Machine.of_build(m), Machine.of_environment(more), fields=RUN_FIELDS)
    fewer = _env(m, cpu_features=need[1:])
    diff = diff_machines(Machine.of_build(m), Machine.of_environment(fewer), fields=RUN_FIELDS)
    assert list(diff.differences) == ["cpu_features"] and f"missing ['{need[0]}']" in str(diff.differences)
    # two gate machines whose frames are compared bit for bit: the sets must be equal
    assert diff_machines(Machine.of_environment(_env(m)), Machine.of_environment(more), cpu_features="equal")


def test_fields_are_chosen_by_the_caller_and_unknown_ones_refused():
    m = _build()
    other = Machine.of_environment(_env(m, platform_version="other", jax="0.0.1"))
    assert not diff_machines(Machine.of_build(m), other, fields=("backend", "device_count"))
    assert set(diff_machines(Machine.of_build(m), other, fields=ALL_FIELDS).differences) == {"platform_version", "jax"}
    with pytest.raises(ValueError, match="unknown machine field"):
        diff_machines(Machine.of_build(m), other, fields=("colour",))
