"""The one atomic writer: readers see old or new bytes, a failed write leaves nothing behind,
secrets are never readable by others, and leftovers of a killed writer are swept."""

from __future__ import annotations

import os
import time

import pytest

from avatar_release import _atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "sub" / "out.json"
    _atomic.write_json(target, {"a": 1})
    _atomic.write_json(target, {"a": 2})
    assert target.read_text() == '{\n "a": 2\n}\n'
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with _atomic.atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_a_secret_is_created_private(tmp_path):
    target = tmp_path / "release.key"
    _atomic.write_bytes(target, b"secret", mode=0o600)
    assert target.stat().st_mode & 0o777 == 0o600


def test_temporaries_can_live_in_a_staging_folder(tmp_path):
    staging = tmp_path / "tmp"
    seen = []
    with _atomic.atomic_path(tmp_path / "data" / "blob", tmp_dir=staging) as tmp:
        seen.append(tmp.parent)
        tmp.write_bytes(b"x")
    assert seen == [staging] and (tmp_path / "data" / "blob").read_bytes() == b"x"


def test_sweep_removes_only_old_leftovers(tmp_path):
    old = tmp_path / f"{_atomic.TMP_PREFIX}a.123"
    young = tmp_path / f"{_atomic.TMP_PREFIX}b.456"
    keep = tmp_path / "finished.json"
    for p in (old, young, keep):
        p.write_bytes(b"x")
    past = time.time() - 7200
    os.utime(old, (past, past))
    os.utime(keep, (past, past))
    assert _atomic.sweep(tmp_path, older_than=3600) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, keep.name])


def test_the_local_store_sweeps_its_staging_folder_on_open(tmp_path):
    from avatar_release.registry import LocalRegistry

    LocalRegistry(tmp_path / "reg")
    left = tmp_path / "reg" / "tmp" / f"{_atomic.TMP_PREFIX}blob.1"
    left.write_bytes(b"torn")
    past = time.time() - 7200
    os.utime(left, (past, past))
    LocalRegistry(tmp_path / "reg")
    assert not left.exists()
