"""Promotion policy on an in-memory registry with stored gate results: every refusal and its reason."""

from __future__ import annotations

import threading

import pytest

from avatar_release.errors import ConflictError, InputError, Refusal
from avatar_release.gates.review import decide, new_review, record_answer
from avatar_release.gates.store import save_review
from avatar_release.promote import promote, rollback
from avatar_release.registry import MemoryRegistry
from tests.helpers import with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


@pytest.fixture
def reg():
    return with_release_state(MemoryRegistry("policy"))


def test_staging_needs_a_passing_gate_result_for_this_build(reg):
    a, da, m = publish_stand_in(reg, "a")
    with pytest.raises(Refusal, match="never been gated"):
        promote(reg, a, "staging")
    signed_gate_result(reg, a, da, m, status="failed")
    with pytest.raises(Refusal, match="'failed'"):
        promote(reg, a, "staging")
    signed_gate_result(reg, a, "sha256:" + "f" * 64, m)  # a passing result signed for another digest does not count
    with pytest.raises(Refusal, match="latest signed gate result .* is 'failed'"):
        promote(reg, a, "staging")
    signed_gate_result(reg, a, da, m, device_kind="TPU v6 lite", backend="tpu", cpu_features=None)
    with pytest.raises(Refusal, match="device_kind: build cpu, gated on TPU v6 lite"):
        promote(reg, a, "staging")
    gate = signed_gate_result(reg, a, da, m)
    r = promote(reg, a, "staging", reason="release 1", who="ci")
    assert r.changed and r.entry.gate_result_digest == gate and r.entry.who == "ci"
    assert reg.get_channel("staging").build_id == a


def test_prod_takes_only_the_build_in_staging_and_repeats_are_no_ops(reg):
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    signed_gate_result(reg, b, db, m)
    with pytest.raises(Refusal, match="only the build in staging may go to prod .staging is empty"):
        promote(reg, a, "prod")
    promote(reg, a, "staging")
    with pytest.raises(Refusal, match=f"staging is {a}"):
        promote(reg, b, "prod")
    assert promote(reg, a, "prod").changed
    n = len(reg.history())
    again = promote(reg, a, "prod")
    assert not again.changed and len(reg.history()) == n


def test_review_outcomes_decide_promotion(reg):
    a, da, m = publish_stand_in(reg, "a")
    digest = signed_gate_result(reg, a, da, m, status="needs-review")
    with pytest.raises(Refusal, match="blind review"):
        promote(reg, a, "staging")
    from avatar_release.gates.store import latest_result

    result, _ = latest_result(reg, a)
    rv = new_review(result, digest, [0], seed=1)
    save_review(reg, rv)
    record_answer(reg, a, 0, "same")
    decide(reg, a, approve=True, reviewer="ana", note="")
    assert promote(reg, a, "staging").decision.gate_status == "approved"

    b, db, _ = publish_stand_in(reg, "b")
    digest = signed_gate_result(reg, b, db, m, status="needs-review")
    result, _ = latest_result(reg, b)
    save_review(reg, new_review(result, digest, [0], seed=1))
    decide(reg, b, approve=False, reviewer="ana", note="no")
    with pytest.raises(Refusal, match="never promoted"):
        promote(reg, b, "staging")
    with pytest.raises(Refusal, match="rejected in blind review"):
        promote(reg, b, "dev")
    signed_gate_result(reg, b, db, m, status="passed")  # a later pass does not undo a rejection
    with pytest.raises(Refusal, match="rejected"):
        promote(reg, b, "staging")


def test_dev_takes_any_compiled_build_and_unknown_channels_are_bad_input(reg):
    a, _, _ = publish_stand_in(reg, "a")
    assert promote(reg, a, "dev").decision.gate_status == "ungated"
    with pytest.raises(InputError, match="unknown channel 'qa'"):
        promote(reg, a, "qa")


def test_rollback_returns_to_an_earlier_gated_build(reg):
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    c, dc, _ = publish_stand_in(reg, "c")
    for bid, d in ((a, da), (b, db), (c, dc)):
        signed_gate_result(reg, bid, d, m)
    with pytest.raises(Refusal, match="channel is empty"):
        rollback(reg, "prod")
    promote(reg, a, "staging")
    promote(reg, a, "prod")
    signed_gate_result(reg, b, db, m, against=(a, da))  # b against the prod it replaces
    promote(reg, b, "staging")
    promote(reg, b, "prod")
    r = rollback(reg, "prod", reason="b shimmers")
    assert r.decision.build_id == a and r.previous == b and r.entry.action == "rollback"
    with pytest.raises(Refusal, match="never in prod"):
        rollback(reg, "prod", to=c)
    signed_gate_result(reg, b, db, m, status="failed")  # b was re-gated and failed: no going back to it
    with pytest.raises(Refusal, match="'failed'"):
        rollback(reg, "prod", to=b)
    assert [e.action for e in reg.history("prod")] == ["promote", "promote", "rollback"]


def test_two_concurrent_promotions_exactly_one_wins(reg, monkeypatch):
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    signed_gate_result(reg, b, db, m)
    import avatar_release.promote.actions as actions

    barrier = threading.Barrier(2)
    original = actions.check_promotion

    def decided_together(*args, **kwargs):  # both have read the channel and passed the policy
        d = original(*args, **kwargs)
        barrier.wait(timeout=10)
        return d

    monkeypatch.setattr(actions, "check_promotion", decided_together)
    outcomes = {}

    def go(ref):
        try:
            outcomes[ref] = promote(reg, ref, "staging")
        except ConflictError as e:
            outcomes[ref] = e

    threads = [threading.Thread(target=go, args=(x,)) for x in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o for o in outcomes.values() if isinstance(o, ConflictError)]
    wins = [o for o in outcomes.values() if not isinstance(o, ConflictError)]
    assert len(errors) == 1 and len(wins) == 1 and "another promoter" in str(errors[0])
    assert reg.get_channel("staging").build_id == wins[0].decision.build_id
    assert len(reg.history("staging")) == 1


def _first_release(reg, m_name="a"):
    a, da, m = publish_stand_in(reg, m_name)
    signed_gate_result(reg, a, da, m)  # prod is empty: a comparison with nothing is the first release's
    promote(reg, a, "staging")
    promote(reg, a, "prod")
    return a, da, m


def test_a_comparison_with_nothing_never_promotes_past_a_prod_that_exists(reg):
    a, da, m = _first_release(reg)
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, status="failed", against=(a, da))  # failed bit-exact against prod...
    signed_gate_result(reg, b, db, m)  # ... then re-gated with --baseline none: passed, but compared with nothing
    with pytest.raises(Refusal, match=rf"latest signed gate result of {b} is 'failed' \(.*, compared with {a}\)"):
        promote(reg, b, "staging")
    c, dc, _ = publish_stand_in(reg, "c")
    signed_gate_result(reg, c, dc, m)
    with pytest.raises(Refusal, match=r"no signed gate result of .* compares with it .*compared with nothing"):
        promote(reg, c, "staging")
    signed_gate_result(reg, c, dc, m, against=(a, da))
    assert promote(reg, c, "staging").decision.channel == "staging"


def test_prod_moved_since_the_gate_asks_for_a_regate(reg):
    a, da, m = _first_release(reg)
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, against=(a, da))
    promote(reg, b, "staging")
    promote(reg, b, "prod")
    c, dc, _ = publish_stand_in(reg, "c")
    signed_gate_result(reg, c, dc, m, against=(a, da))  # gated when a was in prod; prod has moved to b since
    with pytest.raises(Refusal, match=rf"prod holds {b} now.*compared with {a}.*avatar-release gate {c}"):
        promote(reg, c, "staging")


def test_the_newest_verdict_is_the_newest_signed_time_not_the_last_in_the_index(reg):
    a, da, m = _first_release(reg)
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, b, db, m, status="failed", against=(a, da), created_at="2026-12-02T00:00:00Z")
    signed_gate_result(reg, b, db, m, against=(a, da), created_at="2026-12-01T23:00:00Z")  # stored last, signed earlier
    with pytest.raises(Refusal, match="'failed'"):
        promote(reg, b, "staging")  # a failing verdict against prod blocks until a newer signed pass
    signed_gate_result(reg, b, db, m, against=(a, da), created_at="2026-12-02T01:00:00Z")
    assert promote(reg, b, "staging").decision.build_id == b


def test_a_program_relabelled_for_another_target_gets_no_keys_trust(reg):
    """Keys are chosen by the manifest's target name; the policy first checks the program is one."""
    a, da, m = publish_stand_in(reg, "a")
    relabelled = m.model_copy(update={"build_id": "tpu-v6e-8-" + "r" * 12, "target": "tpu-v6e-8"})
    digest, _ = reg.put_build(relabelled.build_id, relabelled.to_json_bytes())
    signed_gate_result(reg, relabelled.build_id, digest, relabelled)
    with pytest.raises(
        Refusal,
        match=r"says target tpu-v6e-8, but the program is not one: backend cpu \(target "
        r"tpu-v6e-8 declares tpu\).*topology None \(declared v6e:2x4\)",
    ):
        promote(reg, relabelled.build_id, "staging")
