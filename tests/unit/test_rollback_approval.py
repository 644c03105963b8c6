"""A rollback is a promotion: to prod it needs the release approval a promotion needs, of the very
verdict that lets the build back, read from the signed release state only."""

from __future__ import annotations

import pytest

from avatar_release.errors import NeedsApproval
from avatar_release.promote import promote, rollback
from avatar_release.promote.actions import approve
from avatar_release.registry import MemoryRegistry
from avatar_release.trust import generate_keypair, load_private_key
from avatar_release.trust.policy import load_policy, local_identity
from avatar_release.trust.state_read import load_state
from avatar_release.trust.state_roles import STATE_KEYS_ENV
from tests.helpers import with_release_state
from tests.release_records import publish_stand_in, signed_gate_result


def _signed(reg, channel):
    holder = load_state(reg, load_policy()).holder(channel)
    return holder.build_id if holder else None


def test_a_rollback_to_prod_needs_a_release_approval_by_the_approver(tmp_path, monkeypatch):
    priv, pub, _ = generate_keypair(tmp_path / "rm", "rm")
    rm = load_private_key(priv)
    me = local_identity()
    policy = tmp_path / "trust.toml"
    policy.write_text(
        f'schema_version = 1\n[keys]\ngate = "{me.gate_key_path.with_suffix(".pub")}"\nrm = "{pub}"\n'
        '[gate]\n"*" = ["gate"]\n[review]\nreviewers = ["rm"]\n[release]\napprovers = ["rm"]\n'
    )
    monkeypatch.setenv("AVATAR_RELEASE_TRUST_POLICY", str(policy))
    monkeypatch.setenv(STATE_KEYS_ENV, str(priv))  # the release manager initialises the state (the root)...
    reg = with_release_state(MemoryRegistry("rollback-approval"))
    monkeypatch.delenv(STATE_KEYS_ENV)  # ...and from here on the promoter holds the gate key only
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    promote(reg, a, "staging")
    approve(reg, a, private_key=rm)
    promote(reg, a, "prod")
    signed_gate_result(reg, b, db, m, against=(a, da))
    promote(reg, b, "staging")
    approve(reg, b, private_key=rm)
    promote(reg, b, "prod")
    signed_gate_result(reg, a, da, m, against=(b, db))  # a re-gated against the prod it would replace: passed

    # The routine rollback undoes b's promotion, but a's deciding verdict (against b) is not approved.
    with pytest.raises(NeedsApproval, match=rf"release approval .* \(rm\).*avatar-release approve {a}"):
        rollback(reg, "prod", reason="b drifts")
    assert _signed(reg, "prod") == b
    approve(reg, a, private_key=rm, note="roll back to a")
    done = rollback(reg, "prod", reason="b drifts")
    assert done.decision.build_id == a and _signed(reg, "prod") == a and done.move.action == "rollback"
    # the signed move names the gate result and the approval that let a back in
    assert len(done.move.evidence) == 2 and done.decision.approvals[0].startswith("rm (")
