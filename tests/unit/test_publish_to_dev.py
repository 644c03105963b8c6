"""promote.publish_to_dev: the one way a freshly compiled build enters dev (compile and the CLI use it),
as a signed move; the first publish to a new registry initialises its signed release state."""

from __future__ import annotations

import pytest

from avatar_release.promote import publish_to_dev
from avatar_release.promote.signed import SignedChannels
from avatar_release.registry import MemoryRegistry
from avatar_release.trust.policy import load_policy
from avatar_release.trust.state_read import StateMissing, load_state, state_exists
from tests.helpers import cpu_manifest, put_stand_in_build, signed_holder


def _publish(reg, build_id: str):
    m = cpu_manifest().model_copy(update={"build_id": build_id})
    return reg.resolve(put_stand_in_build(reg, m)), m


def test_publish_to_dev_moves_dev_with_a_publish_entry_and_repeats_as_a_no_op(monkeypatch):
    monkeypatch.setenv("AVATAR_RELEASE_ACTOR", "ci-bot")
    reg = MemoryRegistry()
    (a, ma), (b, mb) = _publish(reg, "tiny-cpu-8-aaaa"), _publish(reg, "tiny-cpu-8-bbbb")
    assert not state_exists(reg)
    first = publish_to_dev(reg, a, reason="compile tiny for cpu-8")
    assert state_exists(reg)  # a new registry: its first publish signed its first state
    second = publish_to_dev(reg, b, reason="again")
    assert (first.action, first.who, first.from_digest, first.to_digest) == (
        "publish",
        "ci-bot",
        None,
        ma.content_digest(),
    )
    assert (second.from_digest, second.to_digest, second.reason) == (ma.content_digest(), mb.content_digest(), "again")
    assert publish_to_dev(reg, b, reason="same build") is None  # already there: no move
    assert signed_holder(reg, "dev") == b.build_id and signed_holder(reg, "staging") is None
    signed = SignedChannels(reg, load_state(reg, load_policy()))
    assert [(e.action, e.to_build, e.sequence) for e in signed.history("dev")] == [
        ("publish", a.build_id, first.sequence),
        ("publish", b.build_id, second.sequence),
    ]
    # the plain pointer and history mirror it
    assert reg.get_channel("dev").digest == b.digest and len(reg.history("dev")) == 2
    assert reg.history("staging") == [] and reg.get_channel("staging") is None


def test_a_registry_with_channels_but_no_signed_state_is_not_initialised_by_a_publish():
    reg = MemoryRegistry()
    (a, _), (b, _) = _publish(reg, "tiny-cpu-8-aaaa"), _publish(reg, "tiny-cpu-8-bbbb")
    reg.move_channel("dev", a, expected_digest=None, action="publish", who="old", reason="before signed state")
    with pytest.raises(StateMissing, match="has channels but no signed release state.*registry upgrade"):
        publish_to_dev(reg, b, reason="compile")
    assert not state_exists(reg) and reg.get_channel("dev").build_id == a.build_id
