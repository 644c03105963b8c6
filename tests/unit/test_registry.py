"""What only the directory store does (crash repair of its history, temp files) and how a registry URI
is opened. What every store does is the conformance suite's: tests/integration/test_registry_conformance.py,
over memory, directory, anonymous OCI, OCI with htpasswd over TLS and OCI with token auth."""

from __future__ import annotations

import json
import os

import pytest

from avatar_release.errors import InputError
from avatar_release.registry import LocalRegistry, open_registry


def _publish(reg, build_id: str, payload: bytes = b"exe"):
    d = reg.put_blob(payload)
    manifest = json.dumps({"build_id": build_id, "blob": d}).encode()
    digest, created = reg.put_build(build_id, manifest)
    return digest, created


def test_history_is_repaired_after_a_crash_between_channel_and_history(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    _publish(reg, "b-1", b"1")
    _publish(reg, "b-2", b"2")
    reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="a", reason="1")
    reg.move_channel(
        "dev", reg.resolve("b-2"), expected_digest=reg.resolve("b-1").digest, action="publish", who="a", reason="2"
    )
    # Simulate kill -9 after the channel file was replaced but before the append finished:
    # drop the last history line, leaving a torn half line.
    path = tmp_path / "reg" / "history.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])
    assert [h.sequence for h in reg.history("dev")] == [1, 2]  # still visible through the channel
    _publish(reg, "b-3", b"3")
    reg.move_channel(
        "dev", reg.resolve("b-3"), expected_digest=reg.resolve("b-2").digest, action="publish", who="a", reason="3"
    )
    assert [h.sequence for h in reg.history()] == [1, 2, 3]


def test_unknown_scheme_is_an_input_error():
    with pytest.raises(InputError, match="unsupported scheme 'ftp'"):
        open_registry("ftp://example/repo")


def test_missing_local_registry_is_reported_as_not_found_with_the_fix(tmp_path):
    from avatar_release.errors import NotFoundError

    with pytest.raises(NotFoundError, match="not found") as err:
        open_registry(str(tmp_path / "absent"), create=False)
    assert err.value.exit_code == 3 and "avatar-release compile" in str(err.value)


def test_local_writes_leave_no_temp_files(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    _publish(reg, "b-1")
    assert os.listdir(tmp_path / "reg" / "tmp") == []


def test_the_directory_store_follows_no_symlink_out_of_itself(tmp_path):
    """A symlinked tmp/ or .lock would have writes and locks land outside the registry: refused (exit 4)."""
    from avatar_release.errors import IntegrityError
    from avatar_release.registry import LocalRegistry

    outside = tmp_path / "outside"
    outside.mkdir()
    reg = LocalRegistry(tmp_path / "reg")
    (reg.root / "tmp").rmdir()
    (reg.root / "tmp").symlink_to(outside)
    with pytest.raises(IntegrityError, match=r"tmp is a symlink .*rm .*mkdir"):
        reg.put_blob(b"data")
    assert list(outside.iterdir()) == [] and LocalRegistry(tmp_path / "reg").sweep() == []
    (reg.root / "tmp").unlink()
    (reg.root / "tmp").mkdir()
    (reg.root / ".lock").unlink(missing_ok=True)
    (reg.root / ".lock").symlink_to(outside / "lock")
    with pytest.raises(IntegrityError, match=r"\.lock is a symlink"):
        reg.update_record("r", "x", lambda old: b"new")
    assert not (outside / "lock").exists()
