"""What a promotion statement binds: the store-independent manifest digest (statement version 2),
and version-1 statements, which bound the digest of the store they were signed in, still verify.

The stored examples ``tests/data/statement-envelope.v1.json`` and ``timestamp-envelope.v1.json``
were written by the code of 2026-12-01 before version 2, as a promotion in an OCI registry signed
them: over that registry's OCI manifest digest of the build of ``build-manifest.v1.json``
(``statement-envelope.v1.pub`` is the key). The OCI side is played here by the digest the
statement names; ``tests/integration/test_copy.py`` does it against a real registry.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from avatar_release.errors import SchemaVersionError, TrustError
from avatar_release.records import STATEMENT_SCHEMA_VERSION, Manifest
from avatar_release.registry import MemoryRegistry
from avatar_release.trust.keys import generate_keypair, load_private_key, load_public_key
from avatar_release.trust.statements import (
    AcceptedState,
    PromotionStatement,
    read_statement,
    read_timestamp,
    sign,
    verify,
    verify_fresh,
)

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def stored_v1():
    """(registry holding the stored v1 statement and timestamp for prod, its key, the build's manifest)."""
    reg = MemoryRegistry("v1-statements")
    reg.put_record("statements", "prod", (DATA / "statement-envelope.v1.json").read_bytes())
    reg.put_record("timestamps", "prod", (DATA / "timestamp-envelope.v1.json").read_bytes())
    # The build they name, as stored then: a manifest version the support window no longer reads
    # (parse_record refuses it); only its id and content digest are used here.
    manifest = Manifest.model_validate(json.loads((DATA / "build-manifest.v1.json").read_bytes()))
    return reg, load_public_key(DATA / "statement-envelope.v1.pub"), manifest


def _issued(p) -> datetime:
    return datetime.strptime(p.issued_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def test_a_stored_version_1_statement_signed_in_an_oci_store_still_verifies_there(stored_v1, tmp_path):
    reg, pub, m = stored_v1
    st = read_statement(reg, "prod")
    assert isinstance(st, PromotionStatement) and st.payload.schema_version == 1
    oci_digest = st.payload.build_digest  # the OCI manifest digest of the store it was signed in
    assert oci_digest != m.content_digest() and st.payload.build_id == m.build_id
    state = AcceptedState(tmp_path / "pod.json")
    p = verify(
        st,
        pub,
        channel="prod",
        digest=oci_digest,
        content_digest=m.content_digest(),
        state=state,
        now=_issued(st.payload),
    )
    verify_fresh(read_timestamp(reg, "prod"), pub, statement=p, now=_issued(st.payload))
    state.accept(p)
    # In a directory copy the channel's digest is the content digest, which this statement never named.
    with pytest.raises(TrustError, match="version-1 statement, it was signed in another store.*keys sign prod"):
        verify(
            st,
            pub,
            channel="prod",
            digest=m.content_digest(),
            content_digest=m.content_digest(),
            now=_issued(st.payload),
        )


def test_a_pod_that_accepted_a_version_1_statement_accepts_the_same_move_signed_again_as_version_2(stored_v1, tmp_path):
    """Re-signing a channel after the upgrade (``keys sign prod``) binds the content digest at the
    same sequence: the same move of the same build, not a replay."""
    from avatar_release.trust.attest import attest

    _, _, m = stored_v1
    priv, pub, _ = generate_keypair(tmp_path / "k")
    key, pub = load_private_key(priv), load_public_key(pub)
    oci_digest = "sha256:" + "0c1" * 21 + "0"
    v2 = sign(key, build_id=m.build_id, build_digest=m.content_digest(), channel="prod", sequence=7, who="ci")
    assert v2.payload.schema_version == STATEMENT_SCHEMA_VERSION == 2
    # the same move as version 1 signed it in the OCI store: over that store's digest
    v1_payload = dict(v2.payload.model_dump(mode="json"), schema_version=1, build_digest=oci_digest)
    registry = MemoryRegistry("resigned")
    registry.put_record(
        "statements",
        "prod",
        attest(key, kind="promotion", build_id=m.build_id, subject_digest=oci_digest, predicate=v1_payload),
    )
    state = AcceptedState(tmp_path / "pod.json")
    state.accept(
        verify(
            read_statement(registry, "prod"), pub, channel="prod", digest=oci_digest, content_digest=m.content_digest()
        )
    )
    p = verify(v2, pub, channel="prod", digest=oci_digest, content_digest=m.content_digest(), state=state)
    assert (p.sequence, p.build_digest) == (7, m.content_digest())
    other = sign(key, build_id="other", build_digest="sha256:" + "9" * 64, channel="prod", sequence=7, who="ci")
    with pytest.raises(TrustError, match="replayed statement"):
        verify(other, pub, channel="prod", digest="sha256:" + "9" * 64, state=state)


def test_a_statement_from_a_newer_tool_is_a_version_error_not_a_trust_error(tmp_path):
    priv, _, _ = generate_keypair(tmp_path)
    st = sign(
        load_private_key(priv), build_id="b1", build_digest="sha256:" + "1" * 64, channel="prod", sequence=1, who="ci"
    )
    from avatar_release.trust.attest import attest

    newer = dict(st.payload.model_dump(mode="json"), schema_version=STATEMENT_SCHEMA_VERSION + 1)
    env = attest(
        load_private_key(priv), kind="promotion", build_id="b1", subject_digest=newer["build_digest"], predicate=newer
    )
    reg = MemoryRegistry("newer")
    reg.put_record("statements", "prod", env)
    with pytest.raises(
        SchemaVersionError,
        match=f"schema_version {STATEMENT_SCHEMA_VERSION + 1}, this avatar-release "
        f"reads 1..{STATEMENT_SCHEMA_VERSION}.*upgrade avatar-release",
    ):
        read_statement(reg, "prod")
    assert json.loads(reg.get_record("statements", "prod"))  # left as it was
