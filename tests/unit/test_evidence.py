"""Evidence you cannot forge (issue 14): someone who can write to the registry but holds none of
the keys the trust policy names cannot make a build promote. Every refusal names what it saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avatar_release.errors import Refusal, TrustError
from avatar_release.gates.review import decide, new_review, record_answer
from avatar_release.gates.store import latest_result, save_result, save_review
from avatar_release.promote import promote
from avatar_release.records import ReviewDecision, utcnow
from avatar_release.registry import MemoryRegistry
from avatar_release.trust import generate_keypair, key_id, load_private_key
from avatar_release.trust.attest import attest, verify_envelope
from avatar_release.trust.policy import load_policy, local_identity
from tests.helpers import manifest_of, with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


@pytest.fixture
def reg():
    return with_release_state(MemoryRegistry("evidence"))


@pytest.fixture
def stranger(tmp_path):
    """A key nobody's policy names: what an attacker could sign with."""
    priv, _, kid = generate_keypair(tmp_path / "k", "stranger")
    return load_private_key(priv), kid


def _store_unsigned(reg, result):
    """What an attacker with write access can do: put a result blob and list it, no envelope."""
    from avatar_release.gates import store

    data = result.to_json_bytes()
    ref = store.BlobRef(digest=reg.put_blob(data), size=len(data), media_type=store.RESULT_MEDIA_TYPE)
    reg.put_record(
        "gate-results",
        result.build_id,
        json.dumps({"results": [ref.model_dump()], "frames": [result.frames_blob.model_dump()]}).encode(),
    )


def test_a_copied_passing_result_for_another_build_does_not_promote(reg):
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)  # a real, signed pass for a
    result, _ = latest_result(reg, a)
    forged = result.model_copy(update={"build_id": b, "build_digest": db})
    _store_unsigned(reg, forged)
    with pytest.raises(Refusal, match="none signed by a key the trust policy .* accepts for target cpu-8"):
        promote(reg, b, "staging")
    assert reg.get_channel("staging") is None


def test_evidence_signed_by_an_untrusted_key_never_promotes_and_the_key_is_named(reg, stranger):
    key, kid = stranger
    a, da, m = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, da, m)
    result, _ = latest_result(reg, a)
    b, db, _ = publish_stand_in(reg, "b")
    save_result(reg, result.model_copy(update={"build_id": b, "build_digest": db}), signer=key)
    with pytest.raises(Refusal, match=f"signed by {kid}"):
        promote(reg, b, "staging")


def test_a_signed_result_for_another_digest_does_not_count(reg):
    a, da, m = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, "sha256:" + "f" * 64, m)  # signed by the trusted key, about another manifest
    with pytest.raises(Refusal, match=r"expected sha256:"):
        promote(reg, a, "staging")


def test_unsigned_legacy_results_are_listed_but_never_promote(reg):
    from avatar_release.gates import effective_status

    a, da, m = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, da, m)
    result, _ = latest_result(reg, a)
    reg2 = with_release_state(MemoryRegistry("legacy"))
    a2, _, _ = publish_stand_in(reg2, "a")
    _store_unsigned(reg2, result)  # what a gate before signed evidence stored
    assert effective_status(reg2, a2)[0] == "passed"
    with pytest.raises(Refusal, match="no attestation was stored with it"):
        promote(reg2, a2, "staging")


def _needs_review(reg):
    a, da, m = publish_stand_in(reg, "a")
    digest = signed_gate_result(reg, a, da, m, status="needs-review")
    result, _ = latest_result(reg, a)
    save_review(reg, new_review(result, digest, [0], seed=1))
    record_answer(reg, a, 0, "same")
    return a


def test_a_forged_review_approval_does_not_promote(reg):
    a = _needs_review(reg)
    from avatar_release.gates.store import load_review

    rv = load_review(reg, a)
    forged = rv.model_copy(
        update={"decision": ReviewDecision(decision="approved", reviewer="anyone", note="", at=utcnow())}
    )
    save_review(reg, forged)  # the record says approved; no reviewer signed it
    with pytest.raises(Refusal, match="'needs-review'"):
        promote(reg, a, "staging")


def test_only_reviewers_the_policy_names_decide_and_only_with_their_key(reg, stranger):
    a = _needs_review(reg)
    with pytest.raises(Refusal, match="reviewer 'mallory' is not named by the trust policy"):
        decide(reg, a, approve=True, reviewer="mallory", note="")
    key, kid = stranger
    with pytest.raises(Refusal, match=f"would be signed with {kid}"):
        decide(reg, a, approve=True, reviewer=local_identity().reviewer, note="", signer=key)
    decide(reg, a, approve=True, reviewer=local_identity().reviewer, note="ok")
    assert promote(reg, a, "staging").decision.gate_status == "approved"


def test_prod_needs_as_many_distinct_approvals_as_the_policy_says(reg, tmp_path):
    a = _needs_review(reg)
    me = local_identity()
    policy_file = tmp_path / "trust.toml"
    policy_file.write_text(
        'schema_version = 1\n[keys]\ngate = "{}"\n{} = "{}"\n[gate]\n"*" = ["gate"]\n'
        '[review]\nreviewers = ["{}"]\nprod_approvals = 2\n'.format(
            me.gate_key_path.with_suffix(".pub"), me.reviewer, me.reviewer_key_path.with_suffix(".pub"), me.reviewer
        )
    )
    policy = load_policy(policy_file)
    decide(reg, a, approve=True, reviewer=me.reviewer, note="", policy=policy)
    from avatar_release.promote.policy import check_promotion
    from avatar_release.promote.signed import SignedChannels
    from avatar_release.trust.state_read import load_state

    channels = SignedChannels(reg, load_state(reg, load_policy()))  # the state the first-use policy signed
    staging = check_promotion(reg, reg.resolve(a), manifest_of(reg, a), "staging", channels=channels)
    assert staging.gate_status == "approved"
    from avatar_release.promote.policy import check_gate_evidence

    with pytest.raises(Refusal, match="'needs-review'"):
        check_gate_evidence(
            reg, reg.resolve(a), manifest_of(reg, a), what="prod", channel="prod", policy=policy, channels=channels
        )


def test_an_envelope_with_a_changed_predicate_fails_verification(stranger):
    key, kid = stranger
    env = json.loads(
        attest(
            key, kind="gate-result", build_id="b", subject_digest="sha256:" + "1" * 64, predicate={"status": "failed"}
        )
    )
    import base64

    payload = json.loads(base64.b64decode(env["payload"]))
    payload["predicate"]["status"] = "passed"
    env["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    with pytest.raises(TrustError, match="no valid signature by a trusted key"):
        verify_envelope(json.dumps(env).encode(), "x", trusted={kid: key.public_key()}, kind="gate-result")


def test_first_use_makes_private_keys_and_a_policy_trusting_only_them():
    me = local_identity()
    assert me.gate_key_path.stat().st_mode & 0o777 == 0o600
    policy = load_policy()
    assert list(policy.gate_keys("cpu-8")) == [key_id(me.gate_key().public_key())]
    assert policy.reviewers == [me.reviewer]
    assert Path(policy.path).parent == me.gate_key_path.parent.parent


def test_the_example_pipeline_policy_loads_and_keeps_targets_apart():
    root = Path(__file__).resolve().parents[2]
    policy = load_policy(root / "examples" / "trust.toml")
    cpu, tpu = policy.gate_keys("cpu-8"), policy.gate_keys("tpu-v6e-8")
    assert len(cpu) == len(tpu) == 1 and set(cpu).isdisjoint(tpu)  # a CPU runner's key never vouches for a TPU build
    assert policy.reviewers == ["ana", "bo"] and policy.prod_approvals == 2
    workflow = (root / "examples" / "release.github-actions.yml").read_text()
    assert "AVATAR_RELEASE_TRUST_POLICY: examples/trust.toml" in workflow and "keys refresh" in workflow


def test_a_policy_naming_an_undefined_key_is_refused(tmp_path):
    from avatar_release.errors import InputError

    p = tmp_path / "trust.toml"
    p.write_text('schema_version = 1\n[keys]\n[gate]\n"*" = ["ghost"]\n')
    with pytest.raises(InputError, match=r"gate\.\* names \['ghost'\], which \[keys\] does not define"):
        load_policy(p)


def test_our_ed25519_verifier_agrees_with_securesystemslibs_on_every_case(stranger, tmp_path):
    """Pods verify DSSE with cryptography directly (fast import); it must accept and refuse exactly
    what securesystemslib's Envelope.verify does."""
    import base64

    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    key, kid = stranger
    other_priv, _, other_kid = generate_keypair(tmp_path / "o", "other")
    other = load_private_key(other_priv)
    good = attest(
        key, kind="gate-result", build_id="b", subject_digest="sha256:" + "1" * 64, predicate={"status": "passed"}
    )
    doc = json.loads(good)
    tampered = dict(
        doc, payload=base64.b64encode(base64.b64decode(doc["payload"]).replace(b"passed", b"failed")).decode()
    )
    foreign = json.loads(
        attest(
            other, kind="gate-result", build_id="b", subject_digest="sha256:" + "1" * 64, predicate={"status": "passed"}
        )
    )
    unsigned = dict(doc, signatures=[])
    cases = {"good": doc, "tampered": tampered, "foreign": foreign, "unsigned": unsigned}
    sslib_key = SSlibKey.from_crypto(key.public_key(), keyid=kid)
    for name, env in cases.items():
        try:
            Envelope.from_dict(json.loads(json.dumps(env))).verify([sslib_key], 1)  # from_dict consumes its input
            theirs = True
        except Exception:  # noqa: BLE001 - any refusal
            theirs = False
        try:
            verify_envelope(json.dumps(env).encode(), name, trusted={kid: key.public_key()}, kind="gate-result")
            ours = True
        except TrustError:
            ours = False
        assert ours == theirs == (name == "good"), name
