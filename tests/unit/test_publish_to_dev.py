"""promote.publish_to_dev: the one way a freshly compiled build enters dev (compile and the CLI use it)."""

from __future__ import annotations

import json

from avatar_release.promote import publish_to_dev
from avatar_release.registry import MemoryRegistry


def _publish(reg, build_id: str):
    blob = reg.put_blob(build_id.encode())
    digest, _ = reg.put_build(build_id, json.dumps({"build_id": build_id, "blob": blob}).encode())
    return reg.resolve(digest)


def test_publish_to_dev_moves_dev_with_a_publish_entry_and_repeats_as_a_no_op(monkeypatch):
    monkeypatch.setenv("AVATAR_RELEASE_ACTOR", "ci-bot")
    reg = MemoryRegistry()
    a, b = _publish(reg, "tiny-cpu-8-aaaa"), _publish(reg, "tiny-cpu-8-bbbb")
    first = publish_to_dev(reg, a, reason="compile tiny for cpu-8")
    second = publish_to_dev(reg, b, reason="again")
    assert (first.action, first.who, first.from_digest, first.to_digest) == ("publish", "ci-bot", None, a.digest)
    assert (second.from_digest, second.to_digest, second.reason) == (a.digest, b.digest, "again")
    assert publish_to_dev(reg, b, reason="same build") is None  # already there: no history entry
    assert reg.get_channel("dev").digest == b.digest and len(reg.history("dev")) == 2
    assert reg.history("staging") == [] and reg.get_channel("staging") is None
