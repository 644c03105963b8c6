"""The session's build cache (tests/build_cache.py): a build asked for again is not compiled again,
every test's registry holds a whole build of its own, and a change to what makes the build is a
different entry."""

from __future__ import annotations

from avatar_release.registry import LocalRegistry
from tests.helpers import cli, local_blob_path


def test_a_build_asked_for_again_is_not_compiled_again_and_each_registry_holds_its_own(
    built_registry, build_cache, tmp_path
):
    _, first = built_registry  # the session's tiny cpu-8 build, through the cache
    compiled = build_cache.compiles
    a = build_cache.compile("tiny", "cpu-8", registry=LocalRegistry(tmp_path / "a"))
    b = build_cache.compile("tiny", "cpu-8", registry=LocalRegistry(tmp_path / "b"), move_dev=False)
    assert build_cache.compiles == compiled
    assert a.build_id == b.build_id == first.build_id and a.digest == b.digest == first.digest
    assert a.created and b.created and a.registry != b.registry

    # dev moved where asked, and signed as compile signs it
    assert cli("verify", "dev", "--registry", tmp_path / "a").exit_code == 0
    assert cli("verify", "dev", "--registry", tmp_path / "b").exit_code != 0  # b's dev was left alone
    assert cli("verify", b.build_id, "--registry", tmp_path / "b").exit_code == 0

    # a copy, not a view: damage to a's blobs leaves b whole
    ref = a.manifest.executables[0].blob
    local_blob_path(tmp_path / "a", ref.digest).write_bytes(b"damaged")
    assert cli("verify", a.build_id, "--registry", tmp_path / "a").exit_code != 0
    assert cli("verify", b.build_id, "--registry", tmp_path / "b").exit_code == 0


def test_what_changes_the_build_changes_the_entry(build_cache):
    base = build_cache.identity("tiny", "cpu-8")
    assert build_cache.identity("tiny", "cpu-8", overrides={}) == base
    assert build_cache.identity("tiny", "cpu-8", overrides={"matmul_k_split": "2"}) != base
    assert build_cache.identity("tiny", "cpu-8", executable_format="jax-export") != base
