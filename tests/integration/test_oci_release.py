"""A whole release on a real OCI registry server: gate in fresh processes that pull from it,
signed promotions through the policy, a pod that verifies the signature, skopeo's view."""

from __future__ import annotations

import json
import subprocess

import pytest

from avatar_release.errors import Refusal, TrustError
from avatar_release.gates import run_gate
from avatar_release.promote import promote
from avatar_release.registry import LocalRegistry, open_registry, read_manifest
from avatar_release.runtime import TrustConfig, load
from avatar_release.trust import AcceptedState, generate_keypair, load_private_key, load_public_key
from avatar_release.trust.state_pod import PinnedRoot
from tests.helpers import with_release_state
from tests.tools import binary


def _skopeo_tags(uri: str) -> set[str]:
    exe = binary("skopeo")
    ref = "docker://" + uri.removeprefix("oci://")
    out = subprocess.run([exe, "list-tags", "--tls-verify=false", ref], capture_output=True, check=True)
    return set(json.loads(out.stdout)["Tags"])


def test_compile_gate_promote_and_serve_through_an_oci_registry(built_registry, oci_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AVATAR_RELEASE_LOCK_DIR", str(tmp_path / "locks"))
    root, built = built_registry
    local = LocalRegistry(root, create=False)
    uri = oci_server.uri("release/tiny")
    reg = open_registry(uri)
    resolved, manifest = read_manifest(local, built.build_id)
    for blob in manifest.blobs():  # publish the compiled build to the server
        reg.put_blob(local.get_blob(blob.digest, blob.size))
    digest, _ = reg.put_build(manifest.build_id, local.get_manifest_bytes(resolved.digest))
    with_release_state(reg)  # `avatar-release registry init`: the signed state lives on the server too
    promote(reg, digest, "dev")

    with pytest.raises(Refusal, match="never been gated"):
        promote(reg, manifest.build_id, "staging")
    outcome = run_gate(manifest.build_id, reg, baseline="none")  # the workers pull from the server
    assert outcome.result.status == "passed" and outcome.result.build_digest == digest
    # The gate result and its frames are layers of the record's artifact: server GC keeps them.
    raw = subprocess.run(
        [
            binary("skopeo"),
            "inspect",
            "--raw",
            "--tls-verify=false",
            "docker://" + uri.removeprefix("oci://") + f":_avr.r.gate-results.N.{manifest.build_id}",
        ],
        capture_output=True,
        check=True,
    ).stdout
    layers = {layer["digest"] for layer in json.loads(raw)["layers"]}
    assert {outcome.digest, outcome.result.frames_blob.digest} <= layers

    priv, pub, _ = generate_keypair(tmp_path / "keys")
    key = load_private_key(priv)
    promote(reg, manifest.build_id, "staging", signing_key=key)
    r = promote(reg, "staging", "prod", signing_key=key)
    assert r.changed and r.entry.gate_result_digest == outcome.digest
    assert {"dev", "staging", "prod"} <= _skopeo_tags(uri)

    state = AcceptedState(tmp_path / "pod.json")
    build = load("prod", reg, trust=TrustConfig(load_public_key(pub), state))
    assert build.digest == digest and build.guard.count == 0
    assert state.highest("prod")["sequence"] == r.statement.payload.sequence
    # A pod pinning the registry's root reads the signed state from the server (TUF's client workflow
    # over the OCI backend), with prod's gate evidence and release approval fetched by digest.
    pinned = PinnedRoot(reg.get_record("release-state", "1.root.json"), "root.json")
    build = load("prod", reg, trust=TrustConfig(root=pinned))
    assert build.digest == digest and build.guard.count == 0

    # A new reader sees the history; the staging statement never passes for prod.
    fresh = open_registry(uri)
    history = [(e.channel, e.action) for e in fresh.history()]
    assert history[-2:] == [("staging", "promote"), ("prod", "promote")]
    with pytest.raises(TrustError, match="signed for channel 'staging'"):
        from avatar_release.trust.statements import read_statement, verify

        verify(read_statement(fresh, "staging"), load_public_key(pub), channel="prod", digest=digest)
