"""A corrupted blob is repaired through the CLI (issue 42 item 5.4): verify names the fix, the fix
runs, verify passes; `compile` and `copy` never looked at the bytes of a build already published."""

from __future__ import annotations

import json

from avatar_release.registry import LocalRegistry, read_manifest
from tests.helpers import cli


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupted_blob_is_repaired_from_a_registry_holding_the_same_build(built_registry, registry_copy):
    good_root, _ = built_registry
    root, result = registry_copy
    _, m = read_manifest(LocalRegistry(root, create=False), result.build_id)
    damaged = [m.weights.chunks[0].blob.digest, m.executable("dit", "f8").blob.digest]
    for digest in damaged:
        _flip(root / "blobs" / "sha256" / digest.split(":")[1])

    res = cli("verify", result.build_id, "--no-programs", "--registry", root)
    assert res.exit_code == 4, res.output
    assert f"avatar-release repair {result.build_id} --from" in res.stderr and "republish" not in res.output

    res = cli("repair", result.build_id, "--from", good_root, "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert sorted(r["digest"] for r in report["repaired"]) == sorted(damaged)
    assert all("content hashes to" in r["was"] for r in report["repaired"]) and report["checked"] > len(damaged)

    res = cli("verify", result.build_id, "--no-programs", "--registry", root)
    assert res.exit_code == 0, res.output
    again = json.loads(cli("repair", result.build_id, "--from", good_root, "--registry", root, "--json").stdout)
    assert again["repaired"] == []  # nothing left to repair: nothing rewritten


def test_repair_refuses_a_source_whose_bytes_fail_too(registry_copy, tmp_path):
    import shutil

    root, result = registry_copy
    bad_source = tmp_path / "bad-source"
    _, m = read_manifest(LocalRegistry(root, create=False), result.build_id)
    digest = m.weights.chunks[0].blob.digest
    _flip(root / "blobs" / "sha256" / digest.split(":")[1])
    shutil.copytree(root, bad_source)  # the same damage on both sides
    res = cli("repair", result.build_id, "--from", bad_source, "--registry", root)
    assert res.exit_code == 4 and digest in res.stderr, res.output
    assert cli("verify", result.build_id, "--no-programs", "--registry", root).exit_code == 4  # left as it was
