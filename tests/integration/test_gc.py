"""Garbage collection never deletes what a channel (or a rollback) can reach."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import NotFoundError
from avatar_release.ops import collect_garbage
from avatar_release.promote import promote
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import load
from tests.release_records import signed_gate_result


def _blobs(root):
    return {p.name for p in (root / "blobs" / "sha256").iterdir()}


def test_gc_keeps_channels_and_rollback_targets_and_drops_the_rest(registry_copy, build_cache):
    root, a = registry_copy
    reg = LocalRegistry(root)
    _, ma = read_manifest(reg, a.build_id)
    signed_gate_result(reg, a.build_id, reg.resolve(a.build_id).digest, ma)
    promote(reg, a.build_id, "staging")
    promote(reg, a.build_id, "prod")
    c = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"dit.steps": "2"})  # dev -> c
    d = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"dit.steps": "3"})  # dev -> d
    orphan = reg.put_blob(b"left over by an interrupted publish")

    young = collect_garbage(reg)  # default grace period: the fresh orphan is too young
    assert young.deleted_blobs == 0 and young.young_blobs >= 1 and young.pruned_builds == []

    res = CliRunner().invoke(
        cli, ["gc", "--prune-builds", "--min-age", "0", "--dry-run", "--json", "--registry", str(root)]
    )
    dry = json.loads(res.stdout)
    before = _blobs(root)
    assert res.exit_code == 0 and dry["pruned_builds"] == [c.build_id] and dry["deleted_blobs"] >= 2
    assert _blobs(root) == before  # a dry run deletes nothing

    report = collect_garbage(reg, prune_builds=True, min_age_s=0)
    assert report.pruned_builds == [c.build_id] and sorted(report.kept_builds) == sorted([a.build_id, d.build_id])
    assert orphan.split(":")[1] not in _blobs(root)
    # c's executables are gone; the weights it shared with a and d are not
    assert all(ch.blob.digest.split(":")[1] in _blobs(root) for ch in c.manifest.weights.chunks)
    for e in c.manifest.executables:
        assert e.blob.digest.split(":")[1] not in _blobs(root)
    with pytest.raises(NotFoundError):
        reg.resolve(c.build_id)
    # everything a channel reaches still loads, and a's gate evidence is still there for promotion
    assert load("prod", reg).build_id == a.build_id
    assert load("dev", reg).build_id == d.build_id
    assert promote(reg, a.build_id, "prod").changed is False
