"""Standard OCI tools read a build: ``oras pull`` (oras-py) writes it as files, ``skopeo inspect --raw``
shows its artifact type and annotations."""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid

import pytest

from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.release_records import publish_with_blobs
from tests.tools import binary, module

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)


@pytest.fixture
def published(oci_server, tmp_path):
    reg = OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")
    build_id, digest, m = publish_with_blobs(reg)
    reg.move_channel("dev", reg.resolve(build_id), expected_digest=None, action="publish", who="t", reason="r")
    return reg, build_id, digest, m


def test_oras_pull_materializes_a_build_as_named_files_each_weight_chunk_named_by_what_it_holds(published, tmp_path):
    oras = module("oras.client")
    reg, build_id, digest, m = published
    client = oras.OrasClient(hostname=reg.location.host, insecure=True)
    out = tmp_path / "pulled"
    client.pull(target=f"{reg.location.host}/{reg.location.repo}:dev", outdir=str(out))
    (chunk,) = m.weights.chunks
    title = f"weights-{chunk.tensors[0].name}-and-{len(chunk.tensors) - 1}-more.tensors.zst"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["avatar-release-manifest.json", "dit-f8.xla.zst", "sr-f8.xla.zst", "vae-f8.xla.zst", title]
    )
    assert (out / "avatar-release-manifest.json").read_bytes() == reg.get_manifest_bytes(digest)
    assert (out / title).read_bytes() == reg.get_blob(chunk.blob.digest, chunk.blob.size)


def test_skopeo_inspect_raw_shows_artifact_type_annotations_and_titles(published):
    binary("skopeo")
    reg, build_id, digest, m = published
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{reg.location.host}/{reg.location.repo}:dev"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    doc = json.loads(raw)
    assert doc["artifactType"] == "application/vnd.avatar-release.build.v1"
    assert doc["annotations"]["io.avatar-release.build-id"] == build_id
    assert doc["annotations"]["org.opencontainers.image.created"] == m.created_at
    titles = [layer["annotations"]["org.opencontainers.image.title"] for layer in doc["layers"]]
    assert titles[0] == "avatar-release-manifest.json" and len(set(titles)) == len(titles)
