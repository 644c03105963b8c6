"""Signed evidence and promotion statements attached to their build as OCI referrers, as standard
tools find them, on the real distribution 2.8 server (no referrers API: the spec's fallback tag).
The referrers API itself is exercised in tests/unit/test_oci_referrers.py."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.ops import copy_build
from avatar_release.promote import promote
from avatar_release.registry import LocalRegistry, OciRegistry
from avatar_release.registry.oci import RetryPolicy
from avatar_release.trust.attest import verify_envelope
from avatar_release.trust.evidence import attestation_refs, read_attestations, sign_and_store, store_attestation
from avatar_release.trust.keys import generate_keypair, key_id, load_private_key
from avatar_release.trust.policy import local_identity
from tests.helpers import with_release_state
from tests.release_records import gate_with_frames, publish_with_blobs
from tests.tools import binary, module

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)
DSSE = "application/vnd.dsse.envelope.v1+json"
PROMOTION = "application/vnd.avatar-release.promotion-statement.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
PREDICATE = "io.avatar-release.predicate-type"


def skopeo_raw(reg: OciRegistry, ref: str) -> bytes:
    binary("skopeo")
    sep = "@" if ref.startswith("sha256:") else ":"
    return subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{reg.location.host}/{reg.location.repo}{sep}{ref}",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout


def oci(server, tmp_path) -> OciRegistry:
    return OciRegistry(server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")


@pytest.fixture
def attested(oci_server, tmp_path):
    """A build in an OCI repository with a signed gate result and a signed promotion to staging."""
    reg = with_release_state(oci(oci_server, tmp_path))
    build_id, digest, m = publish_with_blobs(reg)
    gate_with_frames(reg, build_id, digest, m)
    priv, _, _ = generate_keypair(tmp_path / "keys")
    promote(reg, build_id, "staging", signing_key=load_private_key(priv))
    return reg, build_id, digest, m


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_skopeo_sees_the_evidence_and_the_statement_listed_under_the_builds_referrers_tag(attested):
    reg, build_id, digest, m = attested
    index = json.loads(skopeo_raw(reg, "sha256-" + digest.removeprefix("sha256:")))
    assert index["mediaType"] == INDEX
    assert [d["artifactType"] for d in index["manifests"]] == [DSSE, PROMOTION]  # in the order written
    layers = {}
    for d in index["manifests"]:
        raw = skopeo_raw(reg, d["digest"])
        manifest = json.loads(raw)
        assert sha256_digest(raw) == d["digest"] and len(raw) == d["size"]
        assert manifest["subject"] == {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": len(reg.build_artifact(digest)),
        }
        assert manifest["artifactType"] == d["artifactType"] and manifest["annotations"] == d["annotations"]
        assert d["annotations"]["io.avatar-release.build-id"] == build_id
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == DSSE and layer["digest"] == d["annotations"]["io.avatar-release.envelope"]
        layers[d["artifactType"]] = (layer, d["annotations"][PREDICATE])
    (evidence,) = attestation_refs(reg, build_id)
    envelope, predicate = layers[DSSE]
    assert envelope["digest"] == evidence.digest and predicate.endswith("/gate-result/v1")
    assert envelope["annotations"]["org.opencontainers.image.title"] == f"gate-result-{evidence.digest[7:19]}.dsse.json"
    statement, predicate = layers[PROMOTION]
    assert statement["digest"] == sha256_digest(reg.get_record("statements", "staging"))
    assert predicate.endswith("/promotion/v1")


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_oras_pulls_an_attached_envelope_that_verifies_under_the_gate_key(attested, tmp_path):
    oras = module("oras.client")
    reg, build_id, digest, m = attested
    (ref,) = reg.referrers(build_id, artifact_type=DSSE)
    client = oras.OrasClient(hostname=reg.location.host, insecure=True)
    out = tmp_path / "pulled"
    client.pull(target=f"{reg.location.host}/{reg.location.repo}@{ref.digest}", outdir=str(out))
    (path,) = out.iterdir()
    assert path.name.startswith("gate-result-") and path.name.endswith(".dsse.json")
    public = local_identity().gate_key().public_key()
    att = verify_envelope(
        path.read_bytes(),
        path.name,
        trusted={key_id(public): public},
        kind="gate-result",
        subject_digest=m.content_digest(),
    )
    assert att.build_id == build_id and att.predicate["status"] == "passed"


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_referrers_reads_the_fallback_tag_filters_by_type_and_grows_without_duplicates(attested):
    reg, build_id, digest, m = attested
    assert [r.artifact_type for r in reg.referrers("staging")] == [DSSE, PROMOTION]
    assert reg.referrers(digest, artifact_type=PROMOTION) == reg.referrers(build_id, artifact_type=PROMOTION)
    tag = "sha256-" + digest.removeprefix("sha256:")
    before = skopeo_raw(reg, tag)
    ((_, envelope),) = read_attestations(reg, build_id)
    store_attestation(reg, build_id, envelope)  # the same envelope again: nothing new to attach
    assert skopeo_raw(reg, tag) == before
    # more evidence (a compile gate): one more referrer, the first one kept
    sign_and_store(
        reg,
        local_identity().gate_key(),
        kind="compile-gate",
        build_id=build_id,
        subject_digest=m.content_digest(),
        predicate={"status": "passed"},
    )
    after = reg.referrers(build_id, artifact_type=DSSE)
    assert len(after) == 2 and after[0] == reg.referrers(build_id)[0]
    assert after[1].annotations[PREDICATE].endswith("/compile-gate/v1")
    assert {r.annotations["io.avatar-release.envelope"] for r in after} == {
        e.digest for e in attestation_refs(reg, build_id)
    }
    # the spec's tag is in the tag list (that is where cosign and oras look), but it is not a channel
    assert tag in reg.manifests.list_tags() and [c.channel for c in reg.list_channels()] == ["staging"]


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_copy_attaches_the_evidence_in_each_registry_with_the_same_manifests(oci_server, tmp_path):
    src = with_release_state(LocalRegistry(tmp_path / "src"))
    build_id, digest, m = publish_with_blobs(src)
    gate_with_frames(src, build_id, digest, m)
    priv, _, _ = generate_keypair(tmp_path / "keys")
    promote(src, build_id, "staging", signing_key=load_private_key(priv))
    a, b = oci(oci_server, tmp_path), oci(oci_server, tmp_path)
    copy_build(src, a, "staging", channel="staging")
    in_a = a.referrers(build_id)
    assert [r.artifact_type for r in in_a] == [DSSE, PROMOTION]
    copy_build(a, b, "staging", channel="staging")
    # the OCI build manifest is copied byte for byte, so its referrers are the very same manifests
    assert b.referrers(build_id) == in_a
    assert skopeo_raw(b, in_a[0].digest) == skopeo_raw(a, in_a[0].digest)
