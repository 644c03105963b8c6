"""Registry behaviour through the one protocol, on the local directory and the in-memory fake."""

from __future__ import annotations

import json
import os

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.errors import ConflictError, InputError, IntegrityError, NotFoundError
from avatar_release.registry import LocalRegistry, MemoryRegistry, open_registry


@pytest.fixture(params=["local", "memory"])
def reg(request, tmp_path):
    return LocalRegistry(tmp_path / "reg") if request.param == "local" else MemoryRegistry()


def _publish(reg, build_id: str, payload: bytes = b"exe"):
    d = reg.put_blob(payload)
    manifest = json.dumps({"build_id": build_id, "blob": d}).encode()
    digest, created = reg.put_build(build_id, manifest)
    return digest, created


def test_blob_round_trip_and_dedup(reg):
    d1 = reg.put_blob(b"hello")
    d2 = reg.put_blob(b"hello")
    assert d1 == d2 == sha256_digest(b"hello")
    assert reg.get_blob(d1, 5) == b"hello"
    assert reg.has_blob(d1)


def test_blob_with_lying_size_is_refused(reg):
    d = reg.put_blob(b"hello world")
    with pytest.raises(IntegrityError, match="size more than 5 bytes, manifest says 5"):
        reg.get_blob(d, 5)
    with pytest.raises(IntegrityError, match="size 11 bytes, manifest says 20"):
        reg.get_blob(d, 20)


def test_missing_blob_is_not_found(reg):
    with pytest.raises(NotFoundError):
        reg.get_blob(sha256_digest(b"nope"), 4)


def test_put_build_is_immutable(reg):
    digest, created = _publish(reg, "b-1")
    assert created
    again, created2 = reg.put_build("b-1", b'{"something": "else"}')
    assert (again, created2) == (digest, False)
    assert json.loads(reg.get_manifest_bytes(digest))["build_id"] == "b-1"


def test_resolve_channel_build_id_digest_and_prefix(reg):
    d1, _ = _publish(reg, "tiny-cpu-8-aaaa", b"1")
    d2, _ = _publish(reg, "tiny-cpu-8-bbbb", b"2")
    reg.move_channel("dev", reg.resolve("tiny-cpu-8-aaaa"), expected_digest=None, action="publish", who="t", reason="r")
    assert reg.resolve("dev").digest == d1
    assert reg.resolve("dev").via == "channel"
    assert reg.resolve("tiny-cpu-8-bbbb").digest == d2
    assert reg.resolve(d2).build_id == "tiny-cpu-8-bbbb"
    assert reg.resolve("tiny-cpu-8-b").digest == d2
    with pytest.raises(NotFoundError, match="ambiguous"):
        reg.resolve("tiny-cpu-8")
    with pytest.raises(NotFoundError, match="channel 'prod' is empty"):
        reg.resolve("prod")
    with pytest.raises(NotFoundError, match="unknown build or channel 'nope'"):
        reg.resolve("nope")


def test_move_channel_is_compare_and_swap(reg):
    _publish(reg, "b-1", b"1")
    _publish(reg, "b-2", b"2")
    r1, r2 = reg.resolve("b-1"), reg.resolve("b-2")
    e = reg.move_channel("staging", r1, expected_digest=None, action="promote", who="a", reason="first")
    assert e.sequence == 1 and e.from_build is None and e.to_build == "b-1"
    # A writer that decided while the channel was empty loses: the channel has moved.
    with pytest.raises(ConflictError, match="nothing was changed"):
        reg.move_channel("staging", r2, expected_digest=None, action="promote", who="b", reason="late")
    assert reg.get_channel("staging").build_id == "b-1"
    # Repeating a move is a no-op, not a new history entry.
    assert reg.move_channel("staging", r1, expected_digest=r1.digest, action="promote", who="a", reason="x") is None
    e2 = reg.move_channel("staging", r2, expected_digest=r1.digest, action="promote", who="a", reason="second")
    assert (e2.sequence, e2.from_build, e2.to_build) == (2, "b-1", "b-2")
    assert [h.to_build for h in reg.history("staging")] == ["b-1", "b-2"]


def test_history_is_repaired_after_a_crash_between_channel_and_history(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    _publish(reg, "b-1", b"1")
    _publish(reg, "b-2", b"2")
    reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="a", reason="1")
    reg.move_channel("dev", reg.resolve("b-2"), expected_digest=reg.resolve("b-1").digest,
                     action="publish", who="a", reason="2")
    # Simulate kill -9 after the channel file was replaced but before the append finished:
    # drop the last history line, leaving a torn half line.
    path = tmp_path / "reg" / "history.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])
    assert [h.sequence for h in reg.history("dev")] == [1, 2]  # still visible through the channel
    _publish(reg, "b-3", b"3")
    reg.move_channel("dev", reg.resolve("b-3"), expected_digest=reg.resolve("b-2").digest,
                     action="publish", who="a", reason="3")
    assert [h.sequence for h in reg.history()] == [1, 2, 3]


def test_names_that_escape_are_refused(reg):
    for bad in ("../x", "a/b", "", "UPPER", ".hidden", "a..b"):
        with pytest.raises(InputError):
            reg.put_build(bad, b"{}")


def test_unknown_scheme_is_an_input_error():
    with pytest.raises(InputError, match="unsupported scheme 'ftp'"):
        open_registry("ftp://example/repo")


def test_missing_local_registry_is_reported(tmp_path):
    from avatar_release.errors import RegistryError

    with pytest.raises(RegistryError, match="not found"):
        open_registry(str(tmp_path / "absent"), create=False)


_RACER = """
import os, sys, time
from avatar_release.errors import ConflictError
from avatar_release.registry import LocalRegistry
root, target, go = sys.argv[1:4]
reg = LocalRegistry(root)
resolved = reg.resolve(target)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    reg.move_channel("staging", resolved, expected_digest=None, action="promote", who=target, reason="race")
    print("won")
except ConflictError:
    print("conflict")
"""


def test_concurrent_promotions_across_processes_exactly_one_wins(tmp_path):
    import subprocess
    import sys

    root = str(tmp_path / "reg")
    reg = LocalRegistry(root)
    _publish(reg, "b-1", b"1")
    _publish(reg, "b-2", b"2")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, root, b, str(go)], stdout=subprocess.PIPE, text=True)
             for b in ("b-1", "b-2")]
    go.write_text("go")
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["conflict", "won"]
    assert len(reg.history("staging")) == 1


def test_local_writes_leave_no_temp_files(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    _publish(reg, "b-1")
    assert os.listdir(tmp_path / "reg" / "tmp") == []
