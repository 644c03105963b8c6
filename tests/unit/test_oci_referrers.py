"""Referrers over the wire, without a server: the OCI 1.1 referrers API (which the Debian
distribution 2.8 in the integration tests lacks) and the fallback tag, against the package's
in-memory distribution server (``MemoryDistribution``), with the API and without it. What each record attaches, and to which
build, is declared in records.stored."""

from __future__ import annotations

import base64
import json
import re

import pytest

from avatar_release._digest import canonical_json, sha256_digest
from avatar_release.errors import InputError, IntegrityError, NotFoundError
from avatar_release.records import BlobRef
from avatar_release.records.stored import STORED_NAMESPACES, render_shard_record, shard_record_name
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from avatar_release.trust.evidence import attestation_refs, sign_and_store
from avatar_release.trust.policy import local_identity
from tests.oci_memory import MemoryDistribution
from tests.release_records import gate_with_frames, publish_with_blobs

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002, connect_timeout=1.0, read_timeout=5.0)
DSSE = "application/vnd.dsse.envelope.v1+json"
PROMOTION = "application/vnd.avatar-release.promotion-statement.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
HOST = "registry.test"


def attested(tmp_path, api: bool):
    server = MemoryDistribution(referrers_api=api)
    reg = OciRegistry(f"oci+https://{HOST}/r", session=server, retry=FAST, lock_dir=tmp_path / "locks")
    build_id, digest, m = publish_with_blobs(reg)
    gate_with_frames(reg, build_id, digest, m)
    return server, reg, build_id, digest, m


def test_a_registry_with_the_referrers_api_lists_the_evidence_itself(tmp_path):
    server, reg, build_id, digest, m = attested(tmp_path, api=True)
    assert not any(t.startswith("sha256-") for t in server.repos["r"].tags)  # OCI-Subject came back: no fallback tag
    (ref,) = reg.referrers(build_id)
    assert ref.artifact_type == DSSE and ref.annotations["io.avatar-release.build-id"] == build_id
    manifest = json.loads(server.repos["r"].manifests[ref.digest][1])
    assert manifest["subject"]["digest"] == digest
    assert manifest["layers"][0]["digest"] == attestation_refs(reg, build_id)[0].digest
    # the filter goes to the server, which applies it
    sign_and_store(
        reg,
        local_identity().gate_key(),
        kind="compile-gate",
        build_id=build_id,
        subject_digest=m.content_digest(),
        predicate={"status": "passed"},
    )
    assert len(reg.referrers(build_id, artifact_type=DSSE)) == 2
    assert reg.referrers(build_id, artifact_type=PROMOTION) == []
    asked = [u for method, u, _ in server.sent if "/referrers/" in u]
    assert asked[-1].endswith(f"/referrers/{digest}?artifactType=" + PROMOTION.replace("/", "%2F").replace("+", "%2B"))


def test_without_the_api_the_spec_tag_holds_an_index_of_the_referrers(tmp_path):
    server, reg, build_id, digest, m = attested(tmp_path, api=False)
    tag = "sha256-" + digest.removeprefix("sha256:")
    media, body = server.repos["r"].manifests[server.repos["r"].tags[tag]]
    index = json.loads(body)
    assert media == INDEX and index["mediaType"] == INDEX
    (d,) = index["manifests"]
    referrer = json.loads(server.repos["r"].manifests[d["digest"]][1])
    assert referrer["subject"]["digest"] == digest and d["artifactType"] == referrer["artifactType"] == DSSE
    assert d["annotations"] == referrer["annotations"]
    assert [r.digest for r in reg.referrers(build_id)] == [d["digest"]]


def test_a_foreign_manifest_under_the_referrers_tag_is_reported_and_left_alone(tmp_path):
    server, reg, build_id, digest, m = attested(tmp_path, api=False)
    tag = "sha256-" + digest.removeprefix("sha256:")
    foreign = canonical_json(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {}, "layers": []}
    )
    server.repos["r"].manifests[sha256_digest(foreign)] = ("application/vnd.oci.image.manifest.v1+json", foreign)
    server.repos["r"].tags[tag] = sha256_digest(foreign)
    with pytest.raises(IntegrityError, match=f"referrers tag {tag} is a application/vnd.oci.image.manifest.v1"):
        sign_and_store(
            reg,
            local_identity().gate_key(),
            kind="compile-gate",
            build_id=build_id,
            subject_digest=m.content_digest(),
            predicate={"status": "passed"},
        )
    assert server.repos["r"].tags[tag] == sha256_digest(foreign)
    assert len(attestation_refs(reg, build_id)) == 1  # the record lists nothing it could not attach


def _envelope(build_id: str, predicate_type: str) -> bytes:
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "predicateType": predicate_type,
        "predicate": {},
        "subject": [{"name": build_id, "digest": {"sha256": "0" * 64}}],
    }
    return json.dumps(
        {
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [],
            "payload": base64.b64encode(json.dumps(statement).encode()).decode(),
        }
    ).encode()


def test_each_namespace_declares_what_it_attaches_and_to_which_build():
    envelope = _envelope("tiny-cpu-8-abc", "https://avatar-release.dev/attestations/promotion/v1")
    (a,) = STORED_NAMESPACES["statements"].attachments(envelope, "staging")
    assert (a.build_id, a.artifact_type, a.blob.digest) == ("tiny-cpu-8-abc", PROMOTION, sha256_digest(envelope))
    title, predicate = a.label(envelope)
    assert re.fullmatch(r"promotion-[0-9a-f]{12}\.dsse\.json", title) and predicate.endswith("/promotion/v1")
    ref = BlobRef(digest=sha256_digest(envelope), size=len(envelope), media_type=DSSE)
    shard = render_shard_record(ref, ref, [])
    (s,) = STORED_NAMESPACES["gate-shards"].attachments(shard, shard_record_name("tiny-cpu-8-abc", 0, 2, [0], "r1"))
    assert (s.build_id, s.blob, s.artifact_type) == ("tiny-cpu-8-abc", ref, DSSE)
    # records that do not parse attach nothing (they are refused where they are read); timestamps never attach
    for ns, raw in [
        ("statements", b"{}"),
        ("attestations", b"junk"),
        ("gate-shards", b"[]"),
        ("timestamps", envelope),
        ("reviews", envelope),
    ]:
        assert STORED_NAMESPACES[ns].attachments(raw, "x") == []
    assert a.label(b"not an envelope")[0].startswith("signed-")


def test_the_referrers_tag_is_never_a_channel(tmp_path):
    server, reg, build_id, digest, m = attested(tmp_path, api=False)
    tag = "sha256-" + digest.removeprefix("sha256:")
    assert tag in server.repos["r"].tags and reg.list_channels() == []
    with pytest.raises(InputError, match="referrers of a manifest"):
        reg.move_channel(tag, reg.resolve(build_id), expected_digest=None, action="promote", who="t", reason="r")
    with pytest.raises(NotFoundError):
        reg.resolve(tag)
    assert json.loads(server.repos["r"].manifests[server.repos["r"].tags[tag]][1])["mediaType"] == INDEX
