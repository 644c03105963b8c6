"""Records: schema versions, stored artifacts of released schemas, exported JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avatar_release.errors import IntegrityError, SchemaVersionError
from avatar_release.records import BUILD_SCHEMA_VERSION, STORED_KINDS, Manifest, parse_record, readable_versions
from avatar_release.records.schema import render_schemas
from avatar_release.records.window import UPGRADE, oldest_supported, support_windows
from avatar_release.specs import manifests_dir
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parents[1] / "data"


def test_the_window_is_the_current_version_and_the_one_before_for_every_kind():
    assert readable_versions(Manifest) == ("avatar-release/build", BUILD_SCHEMA_VERSION - 1, BUILD_SCHEMA_VERSION)
    assert oldest_supported(BUILD_SCHEMA_VERSION) == BUILD_SCHEMA_VERSION - 1
    for w in support_windows():
        assert (w.oldest, w.current) == (max(1, w.current - 1), readable_versions(STORED_KINDS[w.stem])[2])
        assert w.oldest == 1 or w.upgrade, f"{w.kind}: a version outside the window needs its upgrade advice"


def _older_than_the_window() -> list[tuple[str, type, int]]:
    """Every stored example of a version the window has left (none of a kind that never moved)."""
    out = []
    for stem, cls in sorted(STORED_KINDS.items()):
        _, oldest, _ = readable_versions(cls)
        out += [(stem, cls, v) for v in range(1, oldest) if (DATA / f"{stem}.v{v}.json").is_file()]
    return out


@pytest.mark.parametrize("stem, cls, version", _older_than_the_window())
def test_a_record_older_than_the_window_is_refused_naming_kind_version_window_and_the_fix(stem, cls, version):
    kind, oldest, newest = readable_versions(cls)
    with pytest.raises(SchemaVersionError) as info:
        parse_record(cls, (DATA / f"{stem}.v{version}.json").read_bytes(), where=f"{stem}.v{version}.json")
    message = str(info.value)
    assert (
        f"{stem}.v{version}.json: {kind} schema_version {version}, this avatar-release reads {oldest}..{newest}"
        in message
    )
    assert "older than the support window" in message and UPGRADE[kind] in message and "Record formats" in message
    assert info.value.exit_code == 11 and (info.value.found, info.value.supported) == (version, (oldest, newest))


def test_build_manifests_before_the_window_are_there_to_be_refused():
    """The stored build manifests of versions the window has left are kept as refusal examples."""
    assert [v for s, _, v in _older_than_the_window() if s == "build-manifest"] == list(
        range(1, oldest_supported(BUILD_SCHEMA_VERSION))
    )


@pytest.mark.parametrize("stem, cls", sorted(STORED_KINDS.items()))
def test_every_version_of_every_record_kind_has_a_stored_example_that_loads(stem, cls):
    kind, oldest, newest = readable_versions(cls)
    for version in range(oldest, newest + 1):
        path = DATA / f"{stem}.v{version}.json"
        assert path.is_file(), f"no stored example of {kind} v{version}: add {path.name} written by that version"
        record = parse_record(cls, path.read_bytes(), where=path.name)
        assert record.schema_version == version and record.kind == kind


@pytest.mark.parametrize("stem, cls", sorted(STORED_KINDS.items()))
def test_a_newer_version_is_a_version_error_naming_both_versions_not_an_integrity_error(stem, cls):
    kind, oldest, newest = readable_versions(cls)
    doc = json.loads((DATA / f"{stem}.v{newest}.json").read_bytes())
    doc["schema_version"] = newest + 1
    with pytest.raises(SchemaVersionError) as info:
        parse_record(cls, json.dumps(doc).encode(), where="x")
    message = str(info.value)
    assert f"schema_version {newest + 1}, this avatar-release reads {oldest}..{newest}" in message
    assert "upgrade avatar-release" in message
    assert not isinstance(info.value, IntegrityError) and info.value.exit_code == 11
    assert (info.value.found, info.value.supported) == (newest + 1, (oldest, newest))


def test_a_record_of_another_kind_is_refused():
    with pytest.raises(
        IntegrityError, match="expected a avatar-release/build record, found kind 'avatar-release/band'"
    ):
        parse_record(Manifest, (DATA / "band.v1.json").read_bytes(), where="x")


def test_cli_exits_11_on_a_manifest_from_a_newer_tool(tmp_path):
    from click.testing import CliRunner

    from avatar_release.cli import cli
    from avatar_release.registry import LocalRegistry

    _, oldest, newest = readable_versions(Manifest)
    reg = LocalRegistry(tmp_path / "reg")
    stored = (DATA / f"build-manifest.v{newest}.json").read_bytes()
    doc = json.loads(stored)
    doc["schema_version"] = newest + 1
    for ref in parse_record(Manifest, stored, where="x").blobs():
        reg._write_atomic(reg._blob_key(ref.digest), b"stand-in")
    reg.put_build(doc["build_id"], json.dumps(doc).encode())
    res = CliRunner().invoke(cli, ["inspect", doc["build_id"], "--registry", str(tmp_path / "reg")])
    assert res.exit_code == 11, res.output
    assert f"schema_version {newest + 1}, this avatar-release reads {oldest}..{newest}" in res.output
    assert "upgrade" in res.output


def test_cli_exits_11_on_a_build_older_than_the_window_naming_the_recompile(tmp_path):
    from click.testing import CliRunner

    from avatar_release.cli import cli
    from avatar_release.registry import LocalRegistry

    old = oldest_supported(BUILD_SCHEMA_VERSION) - 1
    reg = LocalRegistry(tmp_path / "reg")
    doc = json.loads((DATA / f"build-manifest.v{old}.json").read_bytes())
    reg.put_build(doc["build_id"], json.dumps(doc).encode())
    res = CliRunner().invoke(cli, ["inspect", doc["build_id"], "--registry", str(tmp_path / "reg")])
    assert res.exit_code == 11, res.output
    assert f"avatar-release/build schema_version {old}, this avatar-release reads {old + 1}..{old + 2}" in res.output
    assert "avatar-release compile --pipeline PIPELINE --target TARGET" in " ".join(res.output.split())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("executables"), "executables: Field required"),
        (lambda d: d.update(extra_field=1), "extra_field: Extra inputs are not permitted"),
        (lambda d: d["weights"]["chunks"][0]["blob"].update(digest="md5:abc"), "weights.chunks.0.blob.digest"),
        (lambda d: d.update(schema_version="1"), "non-integer schema_version"),
    ],
)
def test_invalid_manifests_are_integrity_errors(mutate, message):
    doc = json.loads(cpu_manifest().to_json_bytes())
    mutate(doc)
    with pytest.raises(IntegrityError, match=message):
        parse_record(Manifest, json.dumps(doc).encode(), where="x")


def test_not_json_is_an_integrity_error():
    with pytest.raises(IntegrityError, match="not valid JSON"):
        parse_record(Manifest, b"\x80garbage", where="blob")


def test_checked_in_json_schemas_are_current():
    folder = manifests_dir() / "schema"
    assert f"build-manifest.v{readable_versions(Manifest)[2]}.json" in render_schemas()
    for name, text in render_schemas().items():
        assert (folder / name).read_text() == text, (
            f"manifests/schema/{name} is stale: run "
            "`python -c 'from pathlib import Path; from avatar_release.records.schema import write_schemas; "
            'write_schemas(Path("manifests/schema"))\'`'
        )


def _structure(schema):
    """A JSON Schema without its prose: what changes only when the format does."""
    if isinstance(schema, dict):
        return {k: _structure(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_structure(v) for v in schema]
    return schema


def test_a_format_change_moves_the_version():
    """The checked-in schema of the version this tool writes has the same structure as the
    record classes: a changed field means a new version (and changelog line), not an edit."""
    folder = manifests_dir() / "schema"
    for name, text in render_schemas().items():
        stored = folder / name
        assert stored.is_file(), (
            f"manifests/schema/{name} is missing: the version this tool writes has no checked-in schema. A new "
            "version: add its dated changelog line and a stored example under tests/data/, then export the schemas "
            "(see test_checked_in_json_schemas_are_current)"
        )
        assert _structure(json.loads(stored.read_text())) == _structure(json.loads(text)), (
            f"the format of {name} changed but its schema_version did not: bump the kind's version, add a dated "
            "changelog line in its module under avatar_release/records/, a stored example under tests/data/, "
            "and export the schemas"
        )


@pytest.mark.parametrize("stem, cls", sorted(STORED_KINDS.items()))
def test_every_released_version_keeps_its_stored_schema(stem, cls):
    """Files of released versions stay as they were: none may go missing when a version moves on
    (the version this tool writes: test_a_format_change_moves_the_version)."""
    _, _, newest = readable_versions(cls)
    folder = manifests_dir() / "schema"
    missing = [f"{stem}.v{v}.json" for v in range(1, newest) if not (folder / f"{stem}.v{v}.json").is_file()]
    assert not missing, f"manifests/schema/ lacks {missing}: restore them from the release that wrote them"


def test_a_malformed_digest_in_a_channel_file_is_an_integrity_refusal_naming_the_file(tmp_path):
    """Not a crash (exit 70) where the digest is first used: exit 4, the file named, before any read."""
    from click.testing import CliRunner

    from avatar_release.cli import cli
    from avatar_release.registry import LocalRegistry

    LocalRegistry(tmp_path / "reg")  # a real store's folders
    good = {
        "schema_version": 1,
        "kind": "avatar-release/channel",
        "channel": "dev",
        "build_id": "tiny-cpu-8-x",
        "digest": "sha256:" + "0" * 64,
        "sequence": 1,
        "updated_at": "2026-12-01T00:00:00Z",
    }
    (tmp_path / "reg" / "channels").mkdir(parents=True, exist_ok=True)
    (tmp_path / "reg" / "channels" / "dev.json").write_text(json.dumps({"state": {**good, "digest": "sha256:xyz"}}))
    for args in (["inspect", "dev"], ["verify", "dev"]):
        out = CliRunner().invoke(cli, [*args, "--registry", str(tmp_path / "reg")])
        assert out.exit_code == 4, out.output
        assert "channels/dev.json" in out.output and "'sha256:xyz'" in out.output
