"""The load's revocation check on a thread of its own (runtime/_beside.py): its verdict is what the
load raises, before any failure of the work beside it, and it tells that work to stop."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from avatar_release.errors import IntegrityError, Revoked
from avatar_release.registry import MemoryRegistry
from avatar_release.runtime._beside import RevocationBeside
from avatar_release.trust.revocation import revoke

BUILD, SUBJECT = "tiny-cpu-8-000000000000", "sha256:" + "ab" * 32


def _registry(revoked: bool) -> MemoryRegistry:
    reg = MemoryRegistry("beside")
    if revoked:
        revoke(reg, BUILD, SUBJECT, Ed25519PrivateKey.generate(), reason="mouth shimmers at 4 s", by="qa")
    return reg


def test_a_build_nobody_revoked_loads_and_the_work_beside_is_never_told_to_stop():
    with RevocationBeside(_registry(False), BUILD, SUBJECT, None, what="load dev") as beside:
        pass
    assert not beside.stop.is_set() and beside.seconds > 0 and beside.wait >= 0


def test_a_revoked_build_is_refused_by_name_and_the_work_beside_is_told_to_stop():
    with pytest.raises(Revoked, match=f"load dev: {BUILD} is revoked by qa .*mouth shimmers at 4 s"):
        with RevocationBeside(_registry(True), BUILD, SUBJECT, None, what="load dev") as beside:
            assert beside.stop.wait(60), "the check never said stop"
    assert beside.stop.is_set()


def test_the_revocation_is_named_before_a_failure_of_the_work_beside_it():
    with pytest.raises(Revoked, match="mouth shimmers"):
        with RevocationBeside(_registry(True), BUILD, SUBJECT, None, what="load dev"):
            raise IntegrityError("weights chunk 0: content hashes to something else")


def test_without_a_revocation_the_work_beside_fails_with_its_own_error():
    with pytest.raises(IntegrityError, match="weights chunk 0"):
        with RevocationBeside(_registry(False), BUILD, SUBJECT, None, what="load dev"):
            raise IntegrityError("weights chunk 0: content hashes to something else")
