"""Records: schema versions, stored artifacts of released schemas, exported JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avatar_release.errors import IntegrityError, SchemaVersionError
from avatar_release.records import Manifest, parse_record
from avatar_release.schema import render_schemas
from avatar_release.specs import manifests_dir

DATA = Path(__file__).resolve().parents[1] / "data"


def test_stored_v1_manifest_still_loads():
    """A manifest written by the first release must stay readable."""
    m = parse_record(Manifest, (DATA / "build-manifest.v1.json").read_bytes(), where="stored v1")
    assert m.schema_version == 1 and m.build_id.startswith("tiny-cpu-8-")
    assert {e.stage for e in m.executables} == {"dit", "sr", "vae"}


def test_newer_schema_version_is_refused_with_both_versions_and_the_fix():
    doc = json.loads((DATA / "build-manifest.v1.json").read_bytes())
    doc["schema_version"] = 7
    with pytest.raises(SchemaVersionError, match=r"schema_version 7, this avatar-release reads 1\.\.1; upgrade"):
        parse_record(Manifest, json.dumps(doc).encode(), where="x")


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
    for name, text in render_schemas().items():
        assert (folder / name).read_text() == text, (
            f"manifests/schema/{name} is stale: run "
            "`python -c 'from pathlib import Path; from avatar_release.schema import write_schemas; "
            "write_schemas(Path(\"manifests/schema\"))'`"
        )
