"""``promote --dry-run`` and ``rollback --dry-run``: the real decision and its evidence, nothing written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import Refusal
from avatar_release.promote import promote
from avatar_release.promote.dry_run import plan_promotion, plan_rollback
from avatar_release.registry import LocalRegistry
from avatar_release.trust.evidence import attestation_refs
from tests.helpers import signed_holder, with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


def _state(reg, *builds):
    """What a move would change: the signed release state's files (and where it puts each channel),
    the plain pointers and history it mirrors to, and each build's evidence."""
    return (
        sorted(reg.list_records("release-state")),
        [signed_holder(reg, c) for c in ("dev", "staging", "prod")],
        [c.model_dump() for c in reg.list_channels()],
        len(reg.history()),
        [len(attestation_refs(reg, b)) for b in builds],
    )


@pytest.fixture
def reg(tmp_path):
    return with_release_state(LocalRegistry(tmp_path / "reg"))


def test_a_dry_run_decides_as_the_real_move_and_writes_nothing(reg):
    a, da, m = publish_stand_in(reg, "a")
    with pytest.raises(Refusal, match="never been gated"):  # the real refusal, word for word
        plan_promotion(reg, a, "staging")
    signed_gate_result(reg, a, da, m)
    before = _state(reg, a)
    plan = plan_promotion(reg, a, "staging")
    assert plan.changes and plan.decision.gate_status == "passed" and plan.from_build is None
    assert _state(reg, a) == before
    promote(reg, a, "staging")
    before = _state(reg, a)
    plan = plan_promotion(reg, a, "prod")  # the laptop's release key would sign the approval; it does not yet
    assert plan.signs_approval and plan.to_json()["would_sign_approval"] is True
    assert _state(reg, a) == before
    assert "would sign the release approval" in plan.text() and "nothing was written" in plan.text()


def test_a_rollback_dry_run_names_the_move_it_undoes(reg):
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    promote(reg, a, "staging")
    promote(reg, a, "prod")
    signed_gate_result(reg, b, db, m, against=(a, da))
    promote(reg, b, "staging")
    moved = promote(reg, b, "prod").entry
    before = _state(reg, a, b)
    plan = plan_rollback(reg, "prod")
    assert plan.decision.build_id == a and plan.from_build == b and plan.undoes.sequence == moved.sequence
    assert f"undoes #{moved.sequence} (promote" in plan.text()
    assert _state(reg, a, b) == before


def test_the_cli_dry_runs_print_json_and_move_nothing(reg):
    a, da, m = publish_stand_in(reg, "a")
    signed_gate_result(reg, a, da, m)
    r = CliRunner().invoke(cli, ["promote", a, "--to", "staging", "--dry-run", "--registry", str(reg.root), "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["dry_run"] and doc["would_change"] and doc["to"] == a and doc["from"] is None
    assert signed_holder(reg, "staging") is None and reg.get_channel("staging") is None
    r = CliRunner().invoke(cli, ["rollback", "prod", "--dry-run", "--registry", str(reg.root), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["error"] == "Refusal"  # prod is empty: the real refusal


def test_a_second_rollback_goes_further_back_never_to_the_build_just_rolled_back(reg):
    from avatar_release.promote import rollback

    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    c, dc, _ = publish_stand_in(reg, "c")
    signed_gate_result(reg, a, da, m)
    promote(reg, a, "staging")
    promote(reg, a, "prod")
    for new, digest, against in ((b, db, (a, da)), (c, dc, (b, db))):
        signed_gate_result(reg, new, digest, m, against=against)
        promote(reg, new, "staging")
        promote(reg, new, "prod")
    assert rollback(reg, "prod").decision.build_id == b  # undoes b -> c
    plan = plan_rollback(reg, "prod")  # the next undoes a -> b, not the rollback (that would bring c back)
    assert plan.decision.build_id == a and plan.undoes.to_build == b and plan.undoes.action == "promote"
    assert rollback(reg, "prod").decision.build_id == a
    with pytest.raises(Refusal) as err:  # a was the first: nothing earlier, and c, b only by name
        rollback(reg, "prod")
    assert "no earlier build" in str(err.value) and f"{c}, {b}" in str(err.value) and "--to BUILD" in str(err.value)
    assert str(err.value).count("--to BUILD") == 1, str(err.value)  # the hint once, not twice
    r = CliRunner().invoke(cli, ["rollback", "prod", "--registry", str(reg.root)])
    assert r.exit_code == 1 and r.output.count("--to BUILD") == 1, r.output
    assert signed_holder(reg, "prod") == a
    assert rollback(reg, "prod", to=c).decision.build_id == c  # named, it may come back
    assert signed_holder(reg, "prod") == c
