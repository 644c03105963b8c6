"""Records: schema versions, stored artifacts of released schemas, exported JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avatar_release.errors import IntegrityError, SchemaVersionError
from avatar_release.records import STORED_KINDS, Manifest, parse_record, readable_versions
from avatar_release.records.schema import render_schemas
from avatar_release.specs import manifests_dir

DATA = Path(__file__).resolve().parents[1] / "data"


def test_stored_v1_manifest_still_loads():
    """A manifest written by the first release must stay readable."""
    m = parse_record(Manifest, (DATA / "build-manifest.v1.json").read_bytes(), where="stored v1")
    assert m.schema_version == 1 and m.build_id.startswith("tiny-cpu-8-")
    assert {e.stage for e in m.executables} == {"dit", "sr", "vae"}


def test_manifests_written_with_later_fields_under_v1_still_load():
    """Builds published before the version moved to 2 carry version-2 fields labelled 1."""
    m = parse_record(Manifest, (DATA / "build-manifest.v1-later-fields.json").read_bytes(), where="stored")
    assert m.schema_version == 1 and m.seal and m.executables[0].kernels is not None


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
    with pytest.raises(IntegrityError, match="expected a avatar-release/build record, found kind 'avatar-release/band'"):
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


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("executables"), "executables: Field required"),
        (lambda d: d.update(extra_field=1), "extra_field: Extra inputs are not permitted"),
        (lambda d: d["weights"]["blob"].update(digest="md5:abc"), "weights.blob.digest"),
        (lambda d: d.update(schema_version="1"), "non-integer schema_version"),
    ],
)
def test_invalid_manifests_are_integrity_errors(mutate, message):
    doc = json.loads((DATA / "build-manifest.v1.json").read_bytes())
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
            "write_schemas(Path(\"manifests/schema\"))'`"
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
    good = {"schema_version": 1, "kind": "avatar-release/channel", "channel": "dev", "build_id": "tiny-cpu-8-x",
            "digest": "sha256:" + "0" * 64, "sequence": 1, "updated_at": "2026-12-01T00:00:00Z"}
    (tmp_path / "reg" / "channels").mkdir(parents=True, exist_ok=True)
    (tmp_path / "reg" / "channels" / "dev.json").write_text(json.dumps({"state": {**good, "digest": "sha256:xyz"}}))
    for args in (["inspect", "dev"], ["verify", "dev"]):
        out = CliRunner().invoke(cli, [*args, "--registry", str(tmp_path / "reg")])
        assert out.exit_code == 4, out.output
        assert "channels/dev.json" in out.output and "'sha256:xyz'" in out.output
