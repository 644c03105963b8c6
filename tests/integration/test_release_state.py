"""The release guarantee against an attacker with registry write (and, case by case, one key):
every decision reads the signed release state, so plain registry files change nothing.

Through the real CLI and a real pod (the session's tiny build, a stand-in build beside it for
what is never loaded); each attack is refused with its exit code and nothing moves or loads.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from avatar_release.errors import TrustError
from avatar_release.records import HistoryEntry
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.runtime import TrustConfig
from avatar_release.serving import start_pod
from avatar_release.serving._probes import readiness
from avatar_release.trust.policy import load_policy, local_identity
from avatar_release.trust.state_files import NAMESPACE, to_bytes, tuf_signer
from avatar_release.trust.state_pod import load_pinned_root, verify_channel_state
from avatar_release.trust.state_read import load_state
from avatar_release.trust.state_write import record_move
from tests.helpers import cli
from tests.release_records import signed_gate_result

pytestmark = pytest.mark.slow


def _stand_in(reg: LocalRegistry, like: str, suffix: str) -> tuple[str, str]:
    """A second build beside the real one (the same blobs under another id): promoted, never loaded."""
    _, m = read_manifest(reg, like)
    m = m.model_copy(update={"build_id": f"{m.build_id[:-12]}{suffix * 12}"})
    return m.build_id, reg.put_build(m.build_id, m.to_json_bytes())[0]


def _released(root: Path, result) -> tuple[LocalRegistry, str, str, list[str]]:
    """prod = the real build a; b (a stand-in gated against a) in staging only."""
    reg, a, r = LocalRegistry(root), result.build_id, ["--registry", str(root)]
    _, m = read_manifest(reg, a)
    signed_gate_result(reg, a, reg.resolve(a).digest, m)
    for ch in ("staging", "prod"):
        assert cli("promote", a, "--to", ch, *r).exit_code == 0
    b, db = _stand_in(reg, a, "b")
    signed_gate_result(reg, b, db, read_manifest(reg, b)[1], against=(a, reg.resolve(a).digest))
    assert cli("promote", b, "--to", "staging", *r).exit_code == 0
    return reg, a, b, r


def _signed(reg: LocalRegistry, channel: str) -> str | None:
    h = load_state(reg, load_policy()).holder(channel)
    return h.build_id if h else None


def _append_history(root: Path, reg: LocalRegistry, *moves: tuple[str, str, str]) -> None:
    """Lines an attacker appends to the plain history (channel, from, to), with fresh sequences."""
    seq = max(e.sequence for e in reg.history()) + 1
    with (root / "history.jsonl").open("ab") as f:
        for i, (channel, frm, to) in enumerate(moves):
            e = HistoryEntry(
                sequence=seq + i,
                channel=channel,
                action="promote",
                from_build=frm,
                from_digest=reg.resolve(frm).digest,
                to_build=to,
                to_digest=reg.resolve(to).digest,
                who="mallory",
                when="2026-12-05T00:00:00Z",
                reason="",
            )
            f.write(e.to_json_bytes() + b"\n")


def test_rollback_follows_only_the_signed_history(registry_copy):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    # Two appended lines make the plain history say prod held b before a: a routine rollback would
    # send prod to b, a build that was only ever in staging.
    _append_history(root, reg, ("prod", a, b), ("prod", b, a))
    out = cli("rollback", "prod", *r, "--json")
    assert out.exit_code == 1 and "no earlier build in its signed history" in out.output
    assert _signed(reg, "prod") == a
    shown = json.loads(cli("history", "prod", *r, "--json").stdout)["entries"]
    assert [e["to_build"] for e in shown] == [a] and all(e["who"] != "mallory" for e in shown)
    # --to b: b was never in prod by the signed history, so it would be a promotion: refused.
    out = cli("rollback", "prod", "--to", b, *r)
    assert out.exit_code == 1 and "was never in prod" in out.output and _signed(reg, "prod") == a


def test_a_revocation_hidden_from_the_index_still_holds_and_a_deleted_pointer_is_not_an_empty_channel(registry_copy):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    assert cli("promote", b, "--to", "prod", *r).exit_code == 0  # prod: a -> b
    assert cli("revoke", a, "--reason", "audio drifts", *r).exit_code == 0
    # The attacker removes the revocation from the attestation index: rollback would choose a.
    index = root / "records" / "attestations" / a
    doc = json.loads(index.read_text())
    doc["envelopes"] = doc["envelopes"][:-1]
    index.write_text(json.dumps(doc))
    out = cli("rollback", "prod", *r, "--json")
    assert out.exit_code == 1 and json.loads(out.stdout)["error"] == "Revoked" and "audio drifts" in out.output
    assert _signed(reg, "prod") == b
    # Deleting the plain prod pointer does not make the next promotion a first release: a stand-in
    # c gated against nothing is still refused, since the signed prod holds b.
    (root / "channels" / "prod.json").unlink()
    c, dc = _stand_in(reg, a, "c")
    signed_gate_result(reg, c, dc, read_manifest(reg, c)[1])
    out = cli("promote", c, "--to", "staging", *r)
    assert out.exit_code == 1 and f"prod holds {b} now" in out.output and _signed(reg, "staging") == b


def test_missing_or_mixed_signed_state_is_exit_4_and_decides_nothing(registry_copy, tmp_path, monkeypatch):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    state = root / "records" / NAMESPACE
    # Mixed: a copy of this registry moves prod to c; this one moves prod to b. Both files are the
    # same role at the same version, signed by the same keys; the snapshot signs each file's hash,
    # so the copy's file put here is refused, by the promoter and by a pod.
    shutil.copytree(root, tmp_path / "other")
    other = LocalRegistry(tmp_path / "other")
    c, _ = _stand_in(other, a, "c")
    with monkeypatch.context() as m:  # on another machine (this one would call the copy's newer state a rollback)
        m.setenv("AVATAR_RELEASE_STATE_DIR", str(tmp_path / "elsewhere"))
        _, moved = record_move(
            other,
            load_policy(),
            load_state(other, load_policy()),
            "prod",
            action="promote",
            build_id=c,
            manifest_digest=read_manifest(other, c)[1].content_digest(),
            manifest_size=1,
            who="x",
            reason="",
            gate_result_digest=None,
            evidence=(),
        )
    assert cli("promote", b, "--to", "prod", *r).exit_code == 0
    name = f"{moved.version}.prod.json"
    good = (state / name).read_bytes()
    (state / name).write_bytes((tmp_path / "other" / "records" / NAMESPACE / name).read_bytes())
    out = cli("rollback", "prod", *r, "--json")
    assert out.exit_code == 4 and "another copy or registry" in json.loads(out.stdout)["message"]
    pinned = tmp_path / "root.json"
    pinned.write_bytes(reg.get_record(NAMESPACE, "1.root.json"))
    with pytest.raises(TrustError, match="(?i)hash"):
        verify_channel_state(reg, "prod", load_pinned_root(pinned))
    (state / name).write_bytes(good)
    # Gone altogether: exit 4 naming the one command that signs what the registry holds.
    shutil.rmtree(state)
    out = cli("rollback", "prod", *r, "--json")
    assert out.exit_code == 4 and "registry upgrade" in json.loads(out.stdout)["message"]
    assert (
        cli("promote", a, "--to", "staging", *r).exit_code == 4 and cli("revoke", a, "--reason", "x", *r).exit_code == 4
    )
    assert reg.get_channel("prod").build_id == b  # nothing moved, even in the plain mirror


def _expire_timestamp(reg: LocalRegistry) -> None:
    """What a registry nobody refreshes looks like an hour on: a timestamp whose expiry has passed
    (signed here with the online key, as a frozen registry's last timestamp would be)."""
    from tuf.api.metadata import Metadata

    md = Metadata.from_bytes(reg.get_record(NAMESPACE, "timestamp.json"))
    md.signed.version += 1
    md.signed.expires = (datetime.now(UTC) - timedelta(minutes=1)).replace(microsecond=0)
    md.signatures.clear()
    md.sign(tuf_signer(local_identity().release_key()))
    reg.put_record(NAMESPACE, "timestamp.json", to_bytes(md))


def test_a_pod_from_a_pinned_root_refuses_rollback_turns_unready_when_frozen_and_needs_both_roles_for_prod(
    registry_copy, tmp_path
):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    pinned = tmp_path / "root.json"
    assert cli("registry", "root", "--out", pinned, *r).exit_code == 0
    trust = TrustConfig(root=load_pinned_root(pinned))
    pod = start_pod(reg, "prod", trust=trust)
    assert pod.build.build_id == a and pod.check_channel() == "unchanged" and pod.ready
    assert pod.health()["follow"]["signed"]["evidence"][0].startswith("gate-result by")

    # Frozen: no one re-signs the timestamp. The pod turns not-ready, says why, and refuses requests.
    old_ts = reg.get_record(NAMESPACE, "timestamp.json")
    _expire_timestamp(reg)
    assert pod.check_channel() == "stale" and not pod.ready and pod.refuses_stale
    status, body = readiness(pod)
    assert status == 503 and body["error"] == "trust_expired" and "expired" in pod.health()["follow"]["stale"]
    assert "avatar_serve_trust_fresh 0.0" in pod.metrics.exposition().decode()
    refreshed = cli("registry", "refresh", *r, "--json")
    assert refreshed.exit_code == 0, refreshed.output
    assert pod.check_channel() == "unchanged" and pod.ready and readiness(pod)[0] == 200

    # Rolled back: an older timestamp written back is refused (the pod keeps what it trusted).
    reg.put_record(NAMESPACE, "timestamp.json", old_ts)
    with pytest.raises(TrustError, match="rolled back"):
        pod.check_channel()
    assert pod.build.build_id == a
    assert cli("registry", "refresh", *r).exit_code == 4  # the promoter refuses the rolled-back state too


def test_no_single_key_makes_a_pod_run_an_ungated_build(registry_copy, tmp_path):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    pinned = tmp_path / "root.json"
    assert cli("registry", "root", "--out", pinned, *r).exit_code == 0
    policy = load_policy()
    ident = local_identity()
    c, dc = _stand_in(reg, a, "c")  # never gated
    mc = read_manifest(reg, c)[1]
    state = load_state(reg, policy)
    # A key that may sign channel metadata, snapshot and timestamp (the release key here) moves prod
    # to c with no gate evidence. The metadata verifies; a pod refuses it for want of evidence that
    # only the gate role can sign, through the real render command.
    release_only = [ident.release_key()]
    state, _ = record_move(
        reg,
        policy,
        state,
        "prod",
        action="promote",
        build_id=c,
        manifest_digest=mc.content_digest(),
        manifest_size=1,
        who="mallory",
        reason="",
        gate_result_digest=None,
        evidence=(),
        given=release_only,
    )
    out = cli("render", "--channel", "prod", "--trust-root", pinned, "--out", tmp_path / "o.mp4", *r, "--json")
    assert out.exit_code == 4 and "no gate evidence" in out.output and not (tmp_path / "o.mp4").exists()
    # The gate key: it signs a gate envelope for c and may move prod, but a pod also needs a release
    # approval of that gate result by another key: refused too.
    from avatar_release.trust.evidence import attestation_refs

    signed_gate_result(reg, c, dc, mc)
    gate_env = attestation_refs(reg, c)[-1]
    state = load_state(reg, policy)  # storing the gate result listed it in the state's evidence role
    state, _ = record_move(
        reg,
        policy,
        state,
        "prod",
        action="promote",
        build_id=c,
        manifest_digest=mc.content_digest(),
        manifest_size=1,
        who="mallory",
        reason="",
        gate_result_digest=None,
        evidence=(gate_env,),
        given=[ident.gate_key()],
    )
    with pytest.raises(TrustError, match="no release approval"):
        verify_channel_state(reg, "prod", load_pinned_root(pinned))


def test_an_unsigned_registry_is_upgraded_once_and_root_keys_rotate_without_re_pinning_pods(
    registry_copy, tmp_path, monkeypatch
):
    from avatar_release._paths import config_dir

    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    shutil.rmtree(root / "records" / NAMESPACE)  # a registry from before the signed state
    assert cli("promote", b, "--to", "prod", *r).exit_code == 4
    up = cli("registry", "upgrade", *r, "--json")
    assert up.exit_code == 0, up.output
    doc = json.loads(up.stdout)
    assert doc["channels"]["prod"]["build_id"] == a and doc["channels"]["staging"]["build_id"] == b
    assert [e["to_build"] for e in json.loads(cli("history", "prod", *r, "--json").stdout)["entries"]] == [a]
    assert cli("registry", "upgrade", *r).exit_code == 1  # once
    pinned = tmp_path / "root.json"
    assert cli("registry", "root", "--out", pinned, *r).exit_code == 0

    # New root keys: the policy names them; the registry's root still names the old ones.
    assert cli("keys", "generate", "--out", tmp_path / "k", "--name", "root2").exit_code == 0
    text = (config_dir() / "trust.toml").read_text().replace('"keys/', f'"{config_dir()}/keys/')
    text = (
        text.replace("[keys]\n", f'[keys]\nroot2 = "{tmp_path / "k" / "root2.pub"}"\n', 1)
        + '\n[state]\nroot = ["root2"]\n'
    )
    policy = tmp_path / "trust.toml"
    policy.write_text(text)
    policy.chmod(0o600)
    monkeypatch.setenv("AVATAR_RELEASE_TRUST_POLICY", str(policy))
    refused = cli("registry", "status", *r, "--json")
    assert refused.exit_code == 4 and "registry rotate" in json.loads(refused.stdout)["message"]
    assert cli("registry", "rotate", *r).exit_code == 2  # the old root keys must vouch: --old-root-key
    rotated = cli(
        "registry",
        "rotate",
        "--old-root-key",
        local_identity().release_key_path,
        "--sign-key",
        tmp_path / "k" / "root2.key",
        *r,
        "--json",
    )
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.stdout)["root_version"] == 2
    assert cli("registry", "status", *r).exit_code == 0
    assert cli("promote", b, "--to", "prod", *r).exit_code == 0  # moves need no root key
    # A pod pinned to root v1 follows the chain of roots to v2 and sees the move.
    assert verify_channel_state(reg, "prod", load_pinned_root(pinned)).build_id == b
    monkeypatch.delenv("AVATAR_RELEASE_TRUST_POLICY")  # the old policy no longer names this registry's root
    assert cli("registry", "status", *r).exit_code == 4


def test_a_failed_re_gate_hidden_from_the_index_still_blocks_the_rollback(registry_copy):
    root, result = registry_copy
    reg, a, b, r = _released(root, result)
    assert cli("promote", b, "--to", "prod", *r).exit_code == 0  # prod: a -> b
    signed_gate_result(
        reg, a, reg.resolve(a).digest, read_manifest(reg, a)[1], status="failed", against=(b, reg.resolve(b).digest)
    )  # a re-gated against the prod it would replace: failed
    index = root / "records" / "attestations" / a
    doc = json.loads(index.read_text())
    doc["envelopes"] = doc["envelopes"][:-1]  # the attacker hides the failing verdict
    index.write_text(json.dumps(doc))
    out = cli("rollback", "prod", *r)
    assert out.exit_code == 1 and f"latest signed gate result of {a} is 'failed'" in out.output
    assert _signed(reg, "prod") == b
