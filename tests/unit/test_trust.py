"""Signed promotion statements: every way a pod refuses one, and how promotions produce them."""

from __future__ import annotations

import base64
import json
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from avatar_release.errors import InputError, TrustError
from avatar_release.trust.keys import generate_keypair, key_id, load_private_key, load_public_key
from avatar_release.trust.statements import (
    AcceptedState, PromotionStatement, SignedStatement, read_statement, sign, verify,
)

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    priv, pub, kid = generate_keypair(d)
    other_priv, other_pub, _ = generate_keypair(d, name="other")
    return load_private_key(priv), load_public_key(pub), kid, load_private_key(other_priv), d


def test_keys_are_written_private_and_never_overwritten(keys):
    priv, pub, kid, _, d = keys
    assert stat.S_IMODE(os.stat(d / "release.key").st_mode) == 0o600
    assert kid == key_id(pub) == key_id(priv.public_key()) and kid.startswith("ed25519:")
    with pytest.raises(InputError, match="never overwritten"):
        generate_keypair(d)
    with pytest.raises(InputError, match="not an unencrypted PEM private key"):
        load_private_key(d / "release.pub")


def _st(priv, **kw):
    args = dict(build_id="b1", build_digest=D1, channel="prod", sequence=5, who="ci")
    args.update(kw)
    return sign(priv, **args)


def test_a_valid_statement_verifies_and_is_remembered(keys, tmp_path):
    priv, pub, *_ = keys
    state = AcceptedState(tmp_path / "accepted.json")
    p = verify(_st(priv), pub, channel="prod", digest=D1, state=state)
    state.accept(p)
    assert json.loads((tmp_path / "accepted.json").read_text())["prod"]["sequence"] == 5
    verify(_st(priv), pub, channel="prod", digest=D1, state=state)  # the same statement again is fine


def test_unsigned_wrong_key_tampered_wrong_channel_expired_replayed_are_refused(keys, tmp_path):
    priv, pub, _, other, _ = keys
    with pytest.raises(TrustError, match="unsigned"):
        verify(None, pub, channel="prod", digest=D1)
    with pytest.raises(TrustError, match="signed by key .* this pod trusts"):
        verify(_st(other), pub, channel="prod", digest=D1)
    good = _st(priv)
    # the payload is edited (inside the envelope, and in the parsed view) but the signature is the old one
    env = json.loads(good.envelope)
    body = json.loads(base64.b64decode(env["payload"]))
    body["predicate"]["build_digest"] = D2
    env["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    forged = PromotionStatement(good.payload.model_copy(update={"build_digest": D2}), json.dumps(env).encode())
    with pytest.raises(TrustError, match="does not verify"):
        verify(forged, pub, channel="prod", digest=D2)
    # a version-1 statement (bare signature) with an edited payload fails the same way
    legacy = SignedStatement(payload=good.payload.model_copy(update={"build_digest": D2}), signature="AAAA")
    with pytest.raises(TrustError, match="does not verify"):
        verify(legacy, pub, channel="prod", digest=D2)
    with pytest.raises(TrustError, match="signed for channel 'dev', not 'prod'"):
        verify(_st(priv, channel="dev"), pub, channel="prod", digest=D1)
    with pytest.raises(TrustError, match="moved without a signed promotion"):
        verify(good, pub, channel="prod", digest=D2)
    past = datetime.now(timezone.utc) - timedelta(days=40)
    with pytest.raises(TrustError, match="expired"):
        verify(sign(priv, build_id="b1", build_digest=D1, channel="prod", sequence=5, who="ci", now=past),
               pub, channel="prod", digest=D1)
    state = AcceptedState(tmp_path / "a.json")
    state.accept(verify(_st(priv, sequence=9, build_digest=D2, build_id="b2"), pub, channel="prod", digest=D2))
    with pytest.raises(TrustError, match="replayed statement: sequence 5"):
        verify(_st(priv), pub, channel="prod", digest=D1, state=state)
    with pytest.raises(TrustError, match="replayed"):  # same sequence, another build
        verify(_st(priv, sequence=9), pub, channel="prod", digest=D1, state=state)


def test_promotions_sign_with_the_history_sequence_and_rollbacks_get_a_newer_one(keys):
    from avatar_release.promote import promote, rollback

    from tests.unit.test_promote_policy import _gate, _publish
    from avatar_release.registry import MemoryRegistry

    priv, pub, *_ = keys
    reg = MemoryRegistry("signed")
    a, da, m = _publish(reg, "a")
    b, db, _ = _publish(reg, "b")
    _gate(reg, a, da, m)
    _gate(reg, b, db, m)
    r = promote(reg, a, "staging", signing_key=priv)
    assert r.statement.payload.sequence == r.entry.sequence == reg.get_channel("staging").sequence
    again = promote(reg, a, "staging", signing_key=priv)
    assert not again.changed and again.statement == read_statement(reg, "staging")
    promote(reg, a, "prod", signing_key=priv)
    promote(reg, b, "staging", signing_key=priv)
    first = promote(reg, b, "prod", signing_key=priv).statement.payload
    back = rollback(reg, "prod", signing_key=priv).statement.payload
    assert back.build_digest == da and back.sequence > first.sequence
    verify(read_statement(reg, "prod"), pub, channel="prod", digest=da)
    # Unsigned moves leave the old statement behind, and a pod refuses the channel.
    promote(reg, b, "prod")  # no key
    with pytest.raises(TrustError, match="moved without a signed promotion"):
        verify(read_statement(reg, "prod"), pub, channel="prod", digest=db)


def test_a_stored_version_1_statement_still_verifies_with_its_key():
    from datetime import datetime

    from avatar_release.registry import MemoryRegistry

    data = Path(__file__).resolve().parents[1] / "data"
    reg = MemoryRegistry("legacy-statement")
    reg.put_record("statements", "prod", (data / "signed-statement.v1.json").read_bytes())
    st = read_statement(reg, "prod")
    assert isinstance(st, SignedStatement)
    issued = datetime.strptime(st.payload.issued_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    p = verify(st, load_public_key(data / "signed-statement.v1.pub"), channel="prod", digest=st.payload.build_digest,
               now=issued)
    assert p.channel == "prod" and p.sequence == st.payload.sequence
