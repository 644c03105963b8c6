"""Weight chunks raw by default, zstd by choice (build manifest v8): what `compile` stores, what
the manifest records, and that a build stored either way loads, renders and verifies."""

from __future__ import annotations

import os

from avatar_release._digest import blake3_digest, sha256_digest
from avatar_release.registry import LocalRegistry
from tests.helpers import cli_json, manifest_of

# Slow: every test here compiles (built_registry, or a compile of its own).


def test_a_default_build_stores_each_chunk_as_its_raw_bytes_with_their_blake3(built_registry):
    root, _ = built_registry
    reg = LocalRegistry(root, create=False)
    m = manifest_of(reg)
    assert m.schema_version >= 8 and m.weights.compression == "none"
    for c in m.weights.chunks:
        stored = reg.get_blob(c.blob.digest, c.blob.size)
        assert c.blob.size == c.raw_size and c.blob.digest == c.raw_digest == sha256_digest(stored)
        assert c.raw_blake3 == blake3_digest(stored) and not c.blob.media_type.endswith("+zstd")


def test_a_zstd_build_is_another_build_and_loads_renders_and_verifies_as_the_raw_one(built_registry, tmp_path):
    root, raw_build = built_registry
    reg_dir = tmp_path / "reg"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    project = os.getcwd()
    made = cli_json(project, "compile", "--weight-compression", "zstd", "--registry", reg_dir, env=env)
    assert made["build_id"] != raw_build.build_id  # how the weights are stored is part of the identity
    m = manifest_of(LocalRegistry(reg_dir, create=False), made["build_id"])
    assert m.weights.compression == "zstd"
    assert all(c.blob.media_type.endswith("+zstd") and c.raw_blake3 for c in m.weights.chunks)
    assert sum(c.blob.size for c in m.weights.chunks) < sum(c.raw_size for c in m.weights.chunks)
    rendered = cli_json(
        project,
        "render",
        "--registry",
        reg_dir,
        "--build",
        made["build_id"],
        "--seconds",
        "0.3",
        "--out",
        tmp_path / "out.mp4",
        env=env,
    )
    assert rendered["compiles"] == 0 and (tmp_path / "out.mp4").stat().st_size > 0
    checked = cli_json(project, "verify", made["build_id"], "--registry", reg_dir, "--no-programs", env=env)
    assert checked["ok"] and [r["what"] for r in checked["blobs"]][:2] == ["manifest", "weights chunk 0"]
