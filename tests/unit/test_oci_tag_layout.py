"""The OCI tag layout is one generation: a repository written before 2026-12-01 (``_b.``, ``_r.``,
``_history``, ``_pending``) is refused naming ``avatar-release registry migrate``, and the migration
puts the same manifests under today's ``_avr.`` names, so every digest (and signature) holds."""

from __future__ import annotations

import pytest

from avatar_release.errors import SchemaVersionError
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import LAYOUT_1, RetryPolicy, TagLayout
from tests.helpers import cli
from tests.oci_memory import MemoryDistribution

FAST = RetryPolicy(attempts=1, base_delay=0.001, max_delay=0.001)
URI = "oci+http://registry.test/team/app"


def _registry(tmp_path, server: MemoryDistribution, layout: TagLayout | None = None) -> OciRegistry:
    return OciRegistry(URI, session=server, retry=FAST, lock_dir=tmp_path / "locks", layout=layout or TagLayout())


def _old_repository(tmp_path, server: MemoryDistribution) -> str:
    """A repository as a client of before 2026-12-01 left it: one build on dev, one record."""
    old = _registry(tmp_path, server, TagLayout((LAYOUT_1,), retired=()))
    digest, _ = old.put_build("b-1", b'{"build_id": "b-1"}')
    old.move_channel("dev", old.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r1")
    old.put_record("reviews", "b-1", b"old review")
    return digest


def test_todays_client_refuses_the_retired_layout_naming_the_migration(tmp_path):
    server = MemoryDistribution()
    _old_repository(tmp_path, server)
    reg = _registry(tmp_path, server)
    with pytest.raises(SchemaVersionError) as info:
        reg.history()
    message = str(info.value)
    assert f"`avatar-release registry migrate --registry {URI}`" in message and "_avr.* tags only" in message
    assert info.value.exit_code == 11
    assert reg.get_record("reviews", "b-1") is None  # the retired layout is not read
    assert reg.list_builds() == []


def test_the_migration_moves_every_tag_byte_for_byte_and_deletes_nothing(tmp_path):
    server = MemoryDistribution()
    d1 = _old_repository(tmp_path, server)
    reg = _registry(tmp_path, server)
    done = reg.migrate_tags()
    assert sorted(new for _, new in done.moved) == [
        "_avr.b.b-1",
        "_avr.history",
        "_avr.pending",
        "_avr.r.reviews.N.b-1",
    ]
    for old, new in done.moved:  # the same manifest under both names: the same digest
        assert reg.manifests.head(old, "t") == reg.manifests.head(new, "t") is not None
    assert reg.migrate_tags().moved == () and set(reg.migrate_tags().present) == {n for _, n in done.moved}
    assert [e.reason for e in reg.history()] == ["r1"] and reg.resolve("b-1").digest == d1
    assert reg.get_record("reviews", "b-1") == b"old review" and [b.build_id for b in reg.list_builds()] == ["b-1"]
    reg.move_channel("staging", reg.resolve("b-1"), expected_digest=None, action="promote", who="t", reason="r2")
    assert [e.reason for e in reg.history()] == ["r1", "r2"]


def test_a_build_id_too_long_for_todays_tag_is_named_not_moved(tmp_path):
    server = MemoryDistribution()
    old = _registry(tmp_path, server, TagLayout((LAYOUT_1,), retired=()))
    long_id = "b" * (128 - len("_b."))  # fits "_b.<id>", not "_avr.b.<id>"
    old.put_build(long_id, b"{}")
    done = _registry(tmp_path, server).migrate_tags()
    assert done.too_long == (f"_b.{long_id}",) and done.moved == ()


def test_the_migrate_command_on_a_directory_registry_has_nothing_to_do(tmp_path):
    (tmp_path / "reg" / "builds").mkdir(parents=True)
    res = cli("registry", "migrate", "--registry", tmp_path / "reg")
    assert res.exit_code == 0, res.output
    assert "nothing to migrate" in res.output
