"""``copy`` through a real OCI registry: local -> OCI -> local and OCI -> local -> OCI, signatures valid
in every copy (they bind the store-independent manifest digest), a trusting pod loads from a copy."""

from __future__ import annotations

import uuid

import pytest

from avatar_release.errors import TrustError
from avatar_release.ops import copy_build
from avatar_release.registry import LocalRegistry, OciRegistry
from avatar_release.registry.oci import RetryPolicy
from avatar_release.trust.policy import load_policy
from avatar_release.trust.state_read import load_state
from avatar_release.trust.statements import verify_channel
from tests.helpers import with_release_state
from tests.release_records import gate_with_frames, publish_with_blobs, records_of

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_local_to_oci_to_local_keeps_bytes_ids_and_signatures(oci_server, tmp_path, capsys):
    from avatar_release.promote import promote
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key

    src = with_release_state(LocalRegistry(tmp_path / "src"))
    build_id, digest, m = publish_with_blobs(src)
    gate_with_frames(src, build_id, digest, m)
    priv, pub, _ = generate_keypair(tmp_path / "keys")
    promote(src, build_id, "staging", signing_key=load_private_key(priv))
    oci = OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")

    there = copy_build(src, oci, "staging", channel="staging")
    requests_there = oci.transport.requests
    assert there.build_created and there.statement_copied and not there.statement_binds_store_digest
    assert oci.resolve(build_id).build_id == build_id and oci.resolve("staging").digest == there.destination_digest
    # The OCI digest differs from the directory store's; the statement binds the manifest content, which
    # the OCI manifest names as its config: a trusting pod accepts it there.
    assert there.destination_digest != digest
    p = verify_channel(
        oci, "staging", load_public_key(pub), digest=there.destination_digest, content_digest=m.content_digest()
    )
    assert p.build_id == build_id
    back = LocalRegistry(tmp_path / "back")
    home = copy_build(oci, back, "staging", channel="staging")
    assert home.destination_digest == digest  # the same digest as where it started
    assert records_of(back, build_id) == records_of(oci, build_id) == records_of(src, build_id)
    verify_channel(back, "staging", load_public_key(pub), digest=digest)
    # each copy's channel is a signed move there, carrying the evidence the source's move carried
    held = [load_state(reg, load_policy()).holder("staging") for reg in (src, oci, back)]
    assert {(h.build_id, h.manifest_digest) for h in held} == {(build_id, m.content_digest())}
    assert held[0].evidence and held[0].evidence == held[1].evidence == held[2].evidence
    assert all(back.has_blob(e.digest) and oci.has_blob(e.digest) for e in held[0].evidence)
    requests_home = oci.transport.requests - requests_there
    before = oci.transport.requests
    again = copy_build(src, oci, "staging", channel="staging")
    assert (again.blobs_copied, again.records_copied, again.build_created) == (0, [], False)
    with capsys.disabled():
        print(
            f"\n[measure] copy local->OCI of a {there.blobs_copied}-blob build with "
            f"{len(there.records_copied)} records: {requests_there} requests, {there.seconds:.2f}s; "
            f"no-op re-copy: {oci.transport.requests - before} requests, {again.seconds:.2f}s; "
            f"OCI->local: {requests_home} requests, {home.seconds:.2f}s"
        )


def test_a_trusting_pod_loads_a_real_build_from_an_oci_copy(registry_copy, oci_server, tmp_path):
    from avatar_release.promote import promote
    from avatar_release.registry import read_manifest
    from avatar_release.runtime import TrustConfig, load
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
    from avatar_release.trust.statements import AcceptedState

    root, result = registry_copy
    src = LocalRegistry(root)
    priv, pub, _ = generate_keypair(tmp_path / "k")
    _, m = read_manifest(src, result.build_id)
    gate_with_frames(src, result.build_id, src.resolve(result.build_id).digest, m)  # a stored passing gate result
    promote(src, result.build_id, "staging", signing_key=load_private_key(priv))
    oci = OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")
    r = copy_build(src, oci, "staging", channel="staging")
    assert r.statement_copied and not r.statement_binds_store_digest
    state = AcceptedState(tmp_path / "pod" / "accepted.json")
    build = load("staging", oci, trust=TrustConfig(load_public_key(pub), state))
    assert build.build_id == result.build_id and build.digest == r.destination_digest
    assert state.highest("staging")["build_id"] == result.build_id


@pytest.mark.slow  # a real build loaded by a pod
def test_a_trusting_pod_loads_from_a_directory_copy_of_a_build_signed_in_oci(registry_copy, oci_server, tmp_path):
    """The reverse of the test above: published, gated and signed in an OCI registry; copied into a
    directory store; a pod trusting the key loads it from there."""
    from avatar_release.promote import promote
    from avatar_release.registry import read_manifest
    from avatar_release.runtime import TrustConfig, load
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
    from avatar_release.trust.statements import AcceptedState

    root, result = registry_copy
    oci = with_release_state(
        OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")
    )
    published = copy_build(LocalRegistry(root), oci, result.build_id)  # the build only: nothing signed yet
    _, m = read_manifest(oci, result.build_id)
    gate_with_frames(oci, result.build_id, published.destination_digest, m)
    priv, pub, _ = generate_keypair(tmp_path / "k")
    promote(oci, result.build_id, "staging", signing_key=load_private_key(priv))
    local = LocalRegistry(tmp_path / "copy")
    r = copy_build(oci, local, "staging", channel="staging")
    assert r.statement_copied and not r.statement_binds_store_digest and r.destination_digest != r.source_digest
    state = AcceptedState(tmp_path / "pod" / "accepted.json")
    build = load("staging", local, trust=TrustConfig(load_public_key(pub), state))
    assert build.build_id == result.build_id and build.digest == r.destination_digest == m.content_digest()
    assert state.highest("staging")["build_id"] == result.build_id
    # the copy is checked, not waved through: a pod trusting another key refuses it
    _, other, _ = generate_keypair(tmp_path / "k", name="other")
    with pytest.raises(TrustError, match="signed by key"):
        load("staging", local, trust=TrustConfig(load_public_key(other), AcceptedState(tmp_path / "pod2.json")))


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_oci_to_oci_keeps_the_digest_so_oci_signed_statements_verify(oci_server, tmp_path):
    from avatar_release.promote import promote
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key

    def oci():
        return OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")

    a = with_release_state(oci())
    build_id, digest, m = publish_with_blobs(a)
    gate_with_frames(a, build_id, digest, m)
    priv, pub, _ = generate_keypair(tmp_path / "keys")
    promote(a, build_id, "staging", signing_key=load_private_key(priv))  # signs a's OCI digest
    b = oci()
    r = copy_build(a, b, "staging", channel="staging", stream_above=500)  # the larger blobs through files
    assert r.blobs_streamed and r.blobs_streamed < r.blobs_copied
    assert r.destination_digest == digest and b.build_artifact(digest) == a.build_artifact(digest)
    assert not r.statement_binds_store_digest
    verify_channel(b, "staging", load_public_key(pub), digest=digest)


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_a_statement_signed_in_oci_verifies_in_a_directory_copy_and_in_another_registry(oci_server, tmp_path):
    """Signed while working against an OCI store, the statement binds the manifest's content digest,
    not the OCI manifest digest: byte for byte the same statement verifies in every copy."""
    from avatar_release.promote import promote
    from avatar_release.records.stored import STATEMENTS, TIMESTAMPS
    from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key

    oci = with_release_state(
        OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")
    )
    build_id, oci_digest, m = publish_with_blobs(oci)
    gate_with_frames(oci, build_id, oci_digest, m)
    priv, pub, _ = generate_keypair(tmp_path / "keys")
    pub = load_public_key(pub)
    signed = promote(oci, build_id, "staging", signing_key=load_private_key(priv)).statement.payload
    assert oci_digest != m.content_digest() and signed.build_digest == m.content_digest()
    assert signed.schema_version == 2
    verify_channel(oci, "staging", pub, digest=oci_digest)

    local = LocalRegistry(tmp_path / "local")
    r = copy_build(oci, local, "staging", channel="staging")
    assert r.statement_copied and not r.statement_binds_store_digest
    assert r.destination_digest == local.resolve("staging").digest == m.content_digest()
    assert verify_channel(local, "staging", pub, digest=r.destination_digest).sequence == signed.sequence
    again = OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "locks")
    back = copy_build(local, again, "staging", channel="staging")  # a directory store to a new OCI digest
    assert back.destination_digest not in (oci_digest, m.content_digest()) and not back.statement_binds_store_digest
    verify_channel(again, "staging", pub, digest=back.destination_digest)
    for ns in (STATEMENTS.name, TIMESTAMPS.name):
        assert oci.get_record(ns, "staging") == local.get_record(ns, "staging") == again.get_record(ns, "staging")
