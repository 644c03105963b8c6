"""`avatar-release compile`: a real tiny build, its manifest, and bad input."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.registry import LocalRegistry
from tests.helpers import cli, manifest_of

# Slow: the tests that compile (those using built_registry are marked by tests/conftest.py); the
# refusals before any tracing stay in the fast lane.


def test_build_manifest_records_what_a_release_needs(built_registry):
    root, result = built_registry
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    assert m.build_id == result.build_id and m.build_id.startswith("tiny-cpu-8-")
    assert {e.key for e in m.executables} == {"dit/f8", "sr/f8", "vae/f8"}
    assert m.platform.backend == "cpu" and m.platform.device_count == 8 and m.platform.mesh_shape == [8]
    assert m.platform.cpu_features  # XLA:CPU code depends on them
    assert m.toolchain.jax == "0.10.2" and m.toolchain.torchax.startswith("0.0.14")
    assert m.flags.name == "cpu-default" and m.flags.compiler_options["xla_cpu_enable_fast_math"] is False
    for e in m.executables:
        assert e.blob.size < e.raw_size  # zstd did something
        assert e.hlo_digest.startswith("sha256:") and e.fingerprint
        assert e.cost.get("flops", 0) > 0
        assert e.in_tree.startswith("PyTreeDef(")
    # FSDP: weights whose leading dim divides the mesh are sharded over it.
    sharded = [p for e in m.executables for p in e.params if p.sharding and p.sharding[0] == "fsdp"]
    assert sharded and all(p.shape[0] % 8 == 0 for p in sharded)
    # The dev channel and history say who put the build there.
    (entry,) = reg.history("dev")
    assert entry.action == "publish" and entry.to_build == m.build_id


def test_every_blob_is_stored_once_by_digest(built_registry):
    """Every blob the manifest names (each weight chunk, each executable) is in the store under
    its digest, exactly once, and reads back as the bytes that digest names."""
    root, _ = built_registry
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    named = {b.digest: b for b in m.blobs()}
    assert m.weights.chunks and len(m.executables) == 3
    assert set(named) == {c.blob.digest for c in m.weights.chunks} | {e.blob.digest for e in m.executables}
    listed = Counter(reg.list_blob_digests())
    assert {d: listed[d] for d in named} == {d: 1 for d in named}
    for digest, ref in named.items():
        data = reg.get_blob(digest, ref.size)  # the store checks size and digest; checked again here
        assert len(data) == ref.size and sha256_digest(data) == digest


def test_cli_rebuild_reports_a_reproducible_build(built_registry):
    root, first = built_registry
    res = cli("rebuild", "dev", "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["identical"] is True and out["rebuilt_id"] == first.build_id and out["differences"] == []


def test_an_override_changes_the_build_and_is_recorded(tmp_path, build_cache):
    reg = LocalRegistry(tmp_path / "reg")
    r = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"dit.steps": "2"})
    m = manifest_of(reg, r.build_id)
    assert m.overrides == {"dit.steps": 2} and m.config["dit"]["steps"] == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pipeline", "nope"], "unknown pipeline 'nope'"),
        (["--target", "tpu-v9"], "unknown target 'tpu-v9'"),
        (["--set", "dit.nope=1"], "--set dit.nope: unknown key"),
        (["--set", "dit.steps=many"], "--set dit.steps=many: expected an integer"),
        (["--set", "residual_dtype=float8"], "residual_dtype must be one of ('float32', 'bfloat16'), got 'float8'"),
        (["--set", "novalue"], "expected KEY=VALUE"),
        (["--weights", "/nonexistent/w.safetensors"], "no such file"),
    ],
)
def test_bad_input_is_refused_with_exit_2_and_registry_unchanged(tmp_path, args, message):
    root = tmp_path / "reg"
    res = cli("compile", "--registry", root, *args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    builds = list((root / "builds").iterdir()) if (root / "builds").exists() else []
    assert builds == []


@pytest.mark.slow  # traces the pipeline before XLA refuses the option
def test_unknown_xla_option_is_a_clear_compile_error(tmp_path, monkeypatch):
    man = tmp_path / "manifests"
    import shutil

    from avatar_release.specs import manifests_dir

    shutil.copytree(manifests_dir(), man)
    prof = man / "flags" / "cpu-default.toml"
    prof.write_text(prof.read_text() + "\nxla_cpu_no_such_option = true\n")
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(man))
    res = cli("compile", "--registry", tmp_path / "reg", "--json")
    assert res.exit_code == 6, res.output
    out = json.loads(res.stdout)
    assert out["error"] == "CompileError" and "xla_cpu_no_such_option" in out["message"]
    assert list((tmp_path / "reg" / "builds").iterdir()) == []


def test_tpu_target_without_libtpu_fails_clearly_never_falls_back(tmp_path, monkeypatch):
    """Whether or not libtpu is installed here: a topology the plugin cannot describe is an error."""
    from jax.experimental import topologies

    def absent(*args, **kwargs):
        raise RuntimeError("Unknown backend: 'tpu' requested, but no platforms that are instances of tpu are present")

    monkeypatch.setattr(topologies, "get_topology_desc", absent)
    res = cli("compile", "--target", "tpu-v6e-8", "--registry", tmp_path / "reg")
    assert res.exit_code == 6, res.output
    assert "never falls back" in res.output
