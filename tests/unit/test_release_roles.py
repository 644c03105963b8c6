"""Issue 26's rules that one key, or one writer, cannot cross, decided from signed evidence alone:
prod needs a second role, review rules live in the policy, revocations hold, a failing verdict
against prod stands, and evidence vouches only for the target spec it names."""

from __future__ import annotations

import os

import pytest

from avatar_release.errors import InputError, NeedsApproval, Refusal, Revoked
from avatar_release.gates.review import decide, new_review, record_answer
from avatar_release.gates.store import latest_result, load_review, save_review
from avatar_release.promote import promote, rollback
from avatar_release.promote.actions import approve, revoke_build
from avatar_release.promote.status import release_status
from avatar_release.registry import MemoryRegistry, read_manifest
from avatar_release.trust import generate_keypair, key_id, load_private_key
from avatar_release.trust.evidence import sign_and_store
from avatar_release.trust.policy import load_policy, local_identity
from avatar_release.trust.revocation import revocations
from avatar_release.trust.state_roles import STATE_KEYS_ENV
from tests.helpers import with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


@pytest.fixture
def reg():
    return with_release_state(MemoryRegistry("roles"))


@pytest.fixture
def bare():
    """A registry to initialise after a test writes its own trust policy (the root keys come from it)."""
    return MemoryRegistry("roles")


@pytest.fixture
def rm(tmp_path):
    """A release manager's key: the second role."""
    priv, pub, kid = generate_keypair(tmp_path / "rm", "rm")
    return load_private_key(priv), pub, kid


def _policy(
    tmp_path, monkeypatch, *, approvers: str, roles: int = 2, extra_keys: str = "", state_keys: tuple = ()
) -> None:
    """Write and use a trust policy; ``state_keys``: private keys it names that this process holds."""
    me = local_identity()
    text = (
        f'schema_version = 1\n[keys]\ngate = "{me.gate_key_path.with_suffix(".pub")}"\n'
        f'ana = "{me.reviewer_key_path.with_suffix(".pub")}"\n{extra_keys}'
        '[gate]\n"*" = ["gate"]\n[review]\nreviewers = ["ana"]\n'
        f"[release]\napprovers = [{approvers}]\nroles = {roles}\n"
    )
    path = tmp_path / "trust.toml"
    path.write_text(text)
    monkeypatch.setenv("AVATAR_RELEASE_TRUST_POLICY", str(path))
    if state_keys:
        monkeypatch.setenv(STATE_KEYS_ENV, os.pathsep.join(str(k) for k in state_keys))


def _in_staging(reg, suffix="a"):
    a, da, m = publish_stand_in(reg, suffix)
    signed_gate_result(reg, a, da, m)
    promote(reg, a, "staging")
    return a, da, m


def test_the_gate_key_alone_never_reaches_prod_and_a_second_key_does(bare, rm, tmp_path, monkeypatch):
    key, pub, kid = rm
    # rm is the policy's only approver, so the release state's root: the test holds it to initialise
    _policy(
        tmp_path, monkeypatch, approvers='"rm"', extra_keys=f'rm = "{pub}"\n', state_keys=(pub.with_suffix(".key"),)
    )
    reg = with_release_state(bare)
    a, da, m = _in_staging(reg)
    with pytest.raises(NeedsApproval, match=rf"prod needs a release approval .* \(rm\).*avatar-release approve {a}"):
        promote(reg, a, "prod")
    assert reg.get_channel("prod") is None
    with pytest.raises(Refusal, match="is not a release approver's"):
        approve(reg, a, private_key=local_identity().gate_key())  # what a leaked CI gate key can do: nothing
    first = approve(reg, a, private_key=key, note="looked at the report")
    signed_gate_result(reg, a, da, m)  # a re-gate: the approval was of the old gate result
    with pytest.raises(NeedsApproval, match="of another gate result"):
        promote(reg, a, "prod")
    second = approve(reg, a, private_key=key)
    assert second.gate_result_digest != first.gate_result_digest
    r = promote(reg, a, "prod")
    assert r.changed and r.decision.approvals == (f"rm ({second.digest})",) and r.approved_here is None


def test_a_policy_that_makes_the_gate_key_its_approver_still_needs_two_keys(bare, tmp_path, monkeypatch):
    _policy(tmp_path, monkeypatch, approvers='"gate"')
    reg = with_release_state(bare)
    a, da, m = _in_staging(reg)
    gate_key = local_identity().gate_key()
    with pytest.raises(Refusal, match="signed the gate result .* must come from another key"):
        approve(reg, a, private_key=gate_key)
    # signed by hand, around the command: the policy itself refuses it
    verdict_digest = latest_result(reg, a)[1]
    sign_and_store(
        reg,
        gate_key,
        kind="release-approval",
        build_id=a,
        subject_digest=m.content_digest(),
        predicate={"build_id": a, "gate_result_digest": verdict_digest, "approver": "gate", "at": "x"},
    )
    with pytest.raises(NeedsApproval, match="one key cannot hold both roles"):
        promote(reg, a, "prod")


def test_roles_1_lets_gate_evidence_alone_reach_prod_and_no_approver_is_a_clear_refusal(bare, tmp_path, monkeypatch):
    _policy(tmp_path, monkeypatch, approvers="", roles=1)
    reg = with_release_state(bare)  # no approvers: the gate key is the root (and stays it below)
    a, _, _ = _in_staging(reg)
    assert promote(reg, a, "prod").changed
    _policy(tmp_path, monkeypatch, approvers="", roles=2)
    b, db, m = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, against=(a, reg.get_channel("prod").digest))
    promote(reg, b, "staging")
    with pytest.raises(Refusal, match=r"names no approver. Add `\[release\] approvers"):
        promote(reg, b, "prod")


def test_the_first_use_identity_holds_both_roles_with_two_keys(reg):
    a, _, _ = _in_staging(reg)
    r = promote(reg, a, "prod")
    me = local_identity()
    assert r.changed and r.approved_here is not None and r.approved_here.approver == "local-release"
    assert r.approved_here.key_ids == (key_id(me.release_key().public_key()),)
    assert key_id(me.gate_key().public_key()) not in r.approved_here.key_ids


def test_a_first_use_policy_from_before_roles_gets_the_release_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AVATAR_RELEASE_CONFIG_DIR", str(tmp_path / "cfg"))
    me = local_identity()
    path = tmp_path / "cfg" / "trust.toml"
    old = path.read_text().replace('local-release = "keys/release.pub"\n', "").split("[release]")[0]
    path.write_text(old)  # what an earlier avatar-release wrote
    assert load_policy(path).approvers == []
    local_identity()
    assert load_policy().approvers == ["local-release"]
    assert key_id(me.release_key().public_key()) in load_policy().approver_keys()
    mine = tmp_path / "cfg" / "mine.toml"  # a policy someone wrote is never touched
    mine.write_text(old.replace("# Made by avatar-release on first use", "# ours"))
    assert load_policy(mine).approvers == []


# ---- the review rules, in the policy ---------------------------------------------------------------


def _needs_review(reg, below=(0, 1)):
    a, da, m = publish_stand_in(reg, "r")
    digest = signed_gate_result(reg, a, da, m, status="needs-review", below=below)
    result, _ = latest_result(reg, a)
    save_review(reg, new_review(result, digest, list(below), seed=1))
    return a, m, digest


def _forged_decision(reg, a, m, digest, **predicate):
    """A reviewer's key signing a decision around `review --approve` (no answers, say)."""
    rv = load_review(reg, a)
    p = {
        "build_id": a,
        "gate_result_digest": digest,
        "decision": "approved",
        "reviewer": "ana",
        "note": "",
        "at": "2026-12-01T00:00:00Z",
        "answers": [],
        "order_commitment": rv.order_commitment,
        **predicate,
    }
    sign_and_store(
        reg,
        local_identity().reviewer_key(),
        kind="review-decision",
        build_id=a,
        subject_digest=m.content_digest(),
        predicate=p,
    )


def test_a_signed_approval_with_no_answers_counts_for_nothing(reg):
    a, m, digest = _needs_review(reg)
    _forged_decision(reg, a, m, digest)
    with pytest.raises(Refusal, match="'needs-review'.*2 of 2 pairs carry no signed answer"):
        promote(reg, a, "staging")


def test_a_review_with_pairs_dropped_or_another_commitment_counts_for_nothing(reg):
    a, m, digest = _needs_review(reg)
    rv = load_review(reg, a)
    save_review(reg, rv.model_copy(update={"frames": [0]}))  # the writer drops the pair that looks bad
    record_answer(reg, a, 0, "same")
    answers = [x.evidence for x in load_review(reg, a).answers]
    _forged_decision(reg, a, m, digest, answers=answers)
    with pytest.raises(Refusal, match="not the frames the signed gate result put below the band"):
        promote(reg, a, "staging")
    save_review(reg, rv)
    _forged_decision(reg, a, m, digest, order_commitment="sha256:" + "e" * 64)
    with pytest.raises(Refusal, match="names another review"):
        promote(reg, a, "staging")


def test_an_approval_over_every_signed_pair_promotes(reg):
    a, m, digest = _needs_review(reg)
    record_answer(reg, a, 0, "same")
    record_answer(reg, a, 1, "left")
    decide(reg, a, approve=True, reviewer="ana", note="fine")
    assert promote(reg, a, "staging").decision.gate_status == "approved"


# ---- revocation -----------------------------------------------------------------------------------


def test_a_revoked_build_never_moves_again_and_says_who_and_why(reg, rm):
    a, da, m = _in_staging(reg)
    promote(reg, a, "prod")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, against=(a, da))
    with pytest.raises(InputError, match="--reason TEXT is required"):
        revoke_build(reg, a, reason="  ")
    stranger, _, kid = rm  # a key the local policy does not name
    with pytest.raises(Refusal, match=f"key {kid} is not named by the trust policy"):
        revoke_build(reg, a, reason="x", private_key=stranger)
    r = revoke_build(reg, a, reason="mouth shimmers at 4 s")
    for move in (lambda: promote(reg, a, "dev"), lambda: promote(reg, a, "staging")):
        with pytest.raises(Revoked, match=f"{a} is revoked by .*: mouth shimmers at 4 s"):
            move()
    promote(reg, b, "staging")
    promote(reg, b, "prod")
    with pytest.raises(Revoked, match="never moves or loads again"):
        rollback(reg, "prod")
    assert reg.get_channel("prod").build_id == b
    row = next(x for x in release_status(reg).builds if x.build_id == a)
    assert row.revoked.endswith("mouth shimmers at 4 s") and r.reason == "mouth shimmers at 4 s"


def test_a_revocation_by_a_key_nobody_trusts_holds_nothing_back_for_the_policy(reg, rm):
    a, da, m = _in_staging(reg)
    stranger, pub, _ = rm
    sign_and_store(
        reg,
        stranger,
        kind="revocation",
        build_id=a,
        subject_digest=m.content_digest(),
        predicate={"build_id": a, "reason": "spite", "revoked_by": "mallory", "at": "x"},
    )
    assert promote(reg, a, "prod").changed
    assert revocations(reg, a, m.content_digest(), load_policy().revoker_keys()) == []
    from avatar_release.trust import load_public_key

    pod_key = load_public_key(pub)  # a pod whose trust key signed it counts it
    assert [x.reason for x in revocations(reg, a, m.content_digest(), {key_id(pod_key): pod_key})] == ["spite"]


# ---- order: a failing verdict against prod stands; evidence names its target spec ---------------


def test_a_failing_verdict_against_prod_blocks_rollback_until_a_newer_pass_against_it(reg):
    a, da, m = _in_staging(reg)
    promote(reg, a, "prod")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, against=(a, da))
    promote(reg, b, "staging")
    promote(reg, b, "prod")
    signed_gate_result(reg, a, da, m, status="failed", against=(b, db))  # a, compared with the prod it would replace
    signed_gate_result(reg, a, da, m)  # a newer pass against nothing does not lift it
    with pytest.raises(Refusal, match=f"'failed' .*compared with {b}"):
        rollback(reg, "prod")
    signed_gate_result(reg, a, da, m, against=(b, db))
    assert rollback(reg, "prod").decision.build_id == a


def test_evidence_that_names_another_target_spec_does_not_vouch(reg):
    from avatar_release.specs import load_target

    a, da, m = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, da, m, target_spec_digest="sha256:" + "9" * 64)
    with pytest.raises(Refusal, match="the target was redefined since"):
        promote(reg, a, "staging")
    signed_gate_result(reg, a, da, m, target_spec_digest=load_target("cpu-8").digest())
    assert promote(reg, a, "staging").changed
    assert read_manifest(reg, a)[1].target == "cpu-8"


@pytest.mark.slow  # seconds long (tests/conftest.py: FAST_LANE_LIMIT_S)
def test_concurrent_first_uses_end_with_every_key_matching_its_public_half(tmp_path):
    """Gate twins and CLI steps may make the first-use identity at the same moment: one private key
    wins per role, and every .pub is that key's (a mismatch would make this machine's own evidence
    unverifiable)."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "AVATAR_RELEASE_CONFIG_DIR": str(tmp_path / "cfg")}
    start = time.time() + 3.0  # every process imported (and cryptography loaded) first, then all at once
    code = (
        "import time; from avatar_release.trust.policy import load_policy; from avatar_release.trust.keys import "
        "load_private_key; import cryptography.hazmat.primitives.asymmetric.ed25519; "
        f"time.sleep(max(0.0, {start} - time.time())); load_policy()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE) for _ in range(8)]
    errors = [p.communicate()[1].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    from avatar_release.trust import load_public_key

    keys = tmp_path / "cfg" / "keys"
    for name in ("gate", "reviewer", "release"):
        assert key_id(load_private_key(keys / f"{name}.key").public_key()) == key_id(
            load_public_key(keys / f"{name}.pub")
        )
    assert not [p for p in keys.iterdir() if p.name.startswith(".")]  # no temporary file left behind
