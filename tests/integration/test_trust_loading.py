"""Safe loading on a real build: signatures before unpickling, and the restricted unpickler."""

from __future__ import annotations

import os
import pickle

import pytest
import zstandard

from avatar_release._digest import sha256_digest
from avatar_release.errors import IntegrityError, TrustError
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import TrustConfig, load
from avatar_release.runtime._unpickle import ALLOWED, allowed_classes, classes_in
from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
from avatar_release.trust.statements import AcceptedState


class _Payload:
    """A pickle that runs a shell command when unpickled: what a registry writer could plant."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(reg: LocalRegistry, root, build_id: str, marker) -> str:
    """Replace ``build_id`` with a copy whose dit executable is the malicious pickle, every digest,
    size, identity and seal in its manifest made to match (a writer who knows the format), and
    point dev at it."""
    from avatar_release.records import manifest_seal

    resolved, m = read_manifest(reg, build_id)
    evil = pickle.dumps(_Payload(marker))
    z = zstandard.ZstdCompressor().compress(evil)
    blob = reg.put_blob(z)
    entries = [
        e.model_copy(
            update={
                "blob": e.blob.model_copy(update={"digest": blob, "size": len(z)}),
                "raw_size": len(evil),
                "raw_digest": sha256_digest(evil),
            }
        )
        if e.stage == "dit"
        else e
        for e in m.executables
    ]
    bad = m.model_copy(update={"executables": entries})
    bad = bad.model_copy(update={"seal": manifest_seal(bad)})
    (root / "builds" / build_id).unlink()
    digest, _ = reg.put_build(bad.build_id, bad.to_json_bytes())
    current = reg.get_channel("dev")
    reg.move_channel(
        "dev",
        reg.resolve(digest),
        expected_digest=current.digest if current else None,
        action="publish",
        who="attacker",
        reason="",
    )
    return bad.build_id


def test_the_allow_list_is_exactly_what_an_executable_needs(built_registry):
    """Recorded on a real build: if a jax upgrade changes the classes, this fails loudly."""
    import jax

    root, result = built_registry
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, result.build_id)
    seen = set()
    for e in m.executables:
        raw = zstandard.ZstdDecompressor().decompress(
            reg.get_blob(e.blob.digest, e.blob.size), max_output_size=e.raw_size
        )
        seen |= classes_in(raw, backend=jax.devices()[0].client, execution_devices=jax.devices())
    want = allowed_classes()  # the installed jax's list (CI: the pinned 0.10.2, whose list is ALLOWED)
    assert seen == want, f"new: {sorted(seen - want)}, gone: {sorted(want - seen)}"
    assert jax.__version__ != "0.10.2" or want == ALLOWED


def test_a_planted_pickle_with_matching_digests_never_runs(registry_copy, tmp_path):
    root, result = registry_copy
    reg = LocalRegistry(root)
    marker = tmp_path / "pwned"
    _plant(reg, root, result.build_id, marker)
    # No key configured: digests match, so the restricted unpickler is what stops it.
    with pytest.raises(IntegrityError, match="posix.system|os.system"):
        load("dev", reg)
    assert not marker.exists()
    # A key configured: the channel has no statement for this digest; refused before any unpickling.
    _, pub, _ = generate_keypair(tmp_path / "k")
    with pytest.raises(TrustError, match="unsigned"):
        load("dev", reg, trust=TrustConfig(load_public_key(pub), None))
    assert not marker.exists()


def test_a_pod_with_a_key_serves_only_signed_channels(registry_copy, tmp_path, monkeypatch):
    from avatar_release.promote import promote
    from tests.release_records import signed_gate_result

    root, result = registry_copy
    reg = LocalRegistry(root)
    priv, pub, _ = generate_keypair(tmp_path / "k")
    _, other_pub, _ = generate_keypair(tmp_path / "k", name="other")
    signing, trusted = load_private_key(priv), load_public_key(pub)
    # A stored passing gate result for this build (the gates themselves are tested elsewhere).
    _, m = read_manifest(reg, result.build_id)
    signed_gate_result(reg, result.build_id, reg.resolve(result.build_id).digest, m)
    promote(reg, result.build_id, "staging", signing_key=signing)

    state = AcceptedState(tmp_path / "pod" / "accepted.json")
    calls = []
    import avatar_release.runtime._load as loader

    real = loader.deserialize_and_load
    monkeypatch.setattr(loader, "deserialize_and_load", lambda *a, **k: calls.append(1) or real(*a, **k))

    build = load("staging", reg, trust=TrustConfig(trusted, state))
    assert build.build_id == result.build_id and build.timings.signature > 0
    assert state.highest("staging")["digest"] == build.digest
    n = len(calls)
    with pytest.raises(TrustError, match="this pod trusts"):
        load("staging", reg, trust=TrustConfig(load_public_key(other_pub), state))
    with pytest.raises(TrustError, match="is a build-id"):
        load(result.build_id, reg, trust=TrustConfig(trusted, state))
    assert len(calls) == n  # refused before anything was unpickled


def test_a_manifest_mixing_in_another_builds_executable_is_refused(registry_copy, build_cache):
    """Build B has the same shapes as A (a reassociation variant): its dit executable would run,
    silently computing B's numbers with A's weights. The seal refuses the mix."""
    root, a = registry_copy
    reg = LocalRegistry(root)
    b = build_cache.compile("tiny", "cpu-8", registry=reg, overrides={"matmul_k_split": "2"}, move_dev=False)
    _, ma = read_manifest(reg, a.build_id)
    _, mb = read_manifest(reg, b.build_id)
    from_b = mb.executable("dit", "f8")
    entries = [from_b if e.key == "dit/f8" else e for e in ma.executables]
    mixed = ma.model_copy(
        update={
            "executables": [
                e.model_copy(
                    update={
                        "hlo_digest": ma.executable("dit", "f8").hlo_digest,
                        "fingerprint": ma.executable("dit", "f8").fingerprint,
                    }
                )
                if e.key == "dit/f8"
                else e
                for e in entries
            ]
        }
    )
    (root / "builds" / a.build_id).unlink()
    reg.put_build(a.build_id, mixed.to_json_bytes())
    with pytest.raises(IntegrityError, match="not the ones it was sealed with"):
        load(a.build_id, reg)
