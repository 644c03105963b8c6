"""Signed promotion statements: every way a pod refuses one, and how promotions produce them."""

from __future__ import annotations

import base64
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from avatar_release.errors import InputError, TrustError
from avatar_release.trust.keys import generate_keypair, key_id, load_private_key, load_public_key
from avatar_release.trust.statements import (
    AcceptedState,
    PromotionStatement,
    read_statement,
    sign,
    verify,
)
from tests.helpers import cpu_manifest, put_stand_in_build, with_release_state

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
    with pytest.raises(TrustError, match="signed for channel 'dev', not 'prod'"):
        verify(_st(priv, channel="dev"), pub, channel="prod", digest=D1)
    with pytest.raises(TrustError, match="moved without a signed promotion"):
        verify(good, pub, channel="prod", digest=D2)
    past = datetime.now(UTC) - timedelta(days=40)
    with pytest.raises(TrustError, match="expired"):
        verify(
            sign(priv, build_id="b1", build_digest=D1, channel="prod", sequence=5, who="ci", now=past),
            pub,
            channel="prod",
            digest=D1,
        )
    state = AcceptedState(tmp_path / "a.json")
    state.accept(verify(_st(priv, sequence=9, build_digest=D2, build_id="b2"), pub, channel="prod", digest=D2))
    with pytest.raises(TrustError, match="replayed statement: sequence 5"):
        verify(_st(priv), pub, channel="prod", digest=D1, state=state)
    with pytest.raises(TrustError, match="replayed"):  # same sequence, another build
        verify(_st(priv, sequence=9), pub, channel="prod", digest=D1, state=state)


def test_promotions_sign_with_the_history_sequence_and_rollbacks_get_a_newer_one(keys):
    from avatar_release.promote import promote, rollback
    from avatar_release.registry import MemoryRegistry
    from tests.release_records import publish_stand_in, signed_gate_result

    priv, pub, *_ = keys
    reg = with_release_state(MemoryRegistry("signed"))
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    signed_gate_result(reg, b, db, m, against=(a, da))  # b is gated against a, the prod it will replace
    r = promote(reg, a, "staging", signing_key=priv)
    # the statement (pods with --trust-key) numbers moves as the registry's plain history does
    assert r.statement.payload.sequence == reg.get_channel("staging").sequence and r.entry.action == "promote"
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


def test_a_statement_in_the_format_before_envelopes_is_refused_naming_the_command_that_signs_it_again():
    """The bare-signature format (signed-statement, written before 2026-12-01) is outside the support
    window: a version error (exit 11), not a tampering alarm, with the fix."""
    from avatar_release.errors import SchemaVersionError
    from avatar_release.registry import MemoryRegistry

    data = Path(__file__).resolve().parents[1] / "data"
    reg = MemoryRegistry("legacy-statement")
    reg.put_record("statements", "prod", (data / "signed-statement.v1.json").read_bytes())
    with pytest.raises(
        SchemaVersionError,
        match=r"statement for channel prod: an avatar-release/signed-statement .*"
        r"outside this avatar-release's support window, which reads DSSE "
        r"envelopes of avatar-release/statement v1\.\.2; sign the channel "
        r"again with this avatar-release: `avatar-release keys sign prod "
        r"--key KEY`",
    ) as info:
        read_statement(reg, "prod")
    assert info.value.exit_code == 11 and info.value.found == 1


def test_a_restarted_pod_refuses_an_older_statement_replayed_to_it(keys, tmp_path):
    """Freshness: a pod that remembers nothing still refuses a superseded statement, because the
    short-lived signed timestamp names the newest sequence."""
    from avatar_release.promote import promote
    from avatar_release.promote.actions import refresh_timestamp
    from avatar_release.registry import MemoryRegistry
    from avatar_release.trust.statements import verify_channel
    from tests.release_records import publish_stand_in, signed_gate_result

    priv, pub, *_ = keys
    reg = with_release_state(MemoryRegistry("fresh"))
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    signed_gate_result(reg, b, db, m)
    promote(reg, a, "staging", signing_key=priv)
    old = {
        k: reg._read(k) for k in ("channels/staging.json", "records/statements/staging", "records/timestamps/staging")
    }
    promote(reg, b, "staging", signing_key=priv)
    assert verify_channel(reg, "staging", pub, digest=db).build_id == b  # a fresh pod, the newest: fine
    # someone with write access puts back a's pointer and statement (both genuinely signed, unexpired)
    reg._write_atomic("channels/staging.json", old["channels/staging.json"])
    reg._write_atomic("records/statements/staging", old["records/statements/staging"])
    with pytest.raises(TrustError, match="replayed statement: sequence .* but the timestamp .* says the newest"):
        verify_channel(reg, "staging", pub, digest=da, state=AcceptedState(tmp_path / "restarted.json"))
    # ...and a's old timestamp too: it expired within a day, so it vouches for nothing
    reg._write_atomic("records/timestamps/staging", old["records/timestamps/staging"])
    later = datetime.now(UTC) + timedelta(hours=25)
    with pytest.raises(TrustError, match="timestamp expired"):
        verify_channel(reg, "staging", pub, digest=da, now=later)
    # without a timestamp at all a pod cannot tell, and says how to fix it
    reg2 = with_release_state(MemoryRegistry("no-ts"))
    a2, da2, m2 = publish_stand_in(reg2, "a")
    signed_gate_result(reg2, a2, da2, m2)
    promote(reg2, a2, "staging")
    from avatar_release.promote.actions import sign_channel

    sign_channel(reg2, "staging", priv)
    reg2._delete("records/timestamps/staging")
    with pytest.raises(TrustError, match="no signed timestamp.*keys refresh staging"):
        verify_channel(reg2, "staging", pub, digest=da2)
    assert verify_channel(reg2, "staging", pub, digest=da2, require_fresh=False).build_id == a2
    refresh_timestamp(reg2, "staging", priv, valid_hours=1)
    assert verify_channel(reg2, "staging", pub, digest=da2).sequence == reg2.get_channel("staging").sequence


def test_trust_files_writable_by_group_or_others_are_refused_naming_the_chmod(tmp_path, monkeypatch):
    """As ssh refuses a loose authorized_keys: whoever can write the file picks the trusted keys."""
    from avatar_release.trust.policy import load_policy

    priv, pub, _ = generate_keypair(tmp_path)
    policy = tmp_path / "trust.toml"
    policy.write_text(f'schema_version = 1\n[keys]\nci = "{pub}"\n[gate]\n"*" = ["ci"]\n')
    assert load_policy(policy).gate_keys("cpu-8")
    for path, load in ((policy, load_policy), (Path(pub), load_public_key), (Path(priv), load_private_key)):
        mode = path.stat().st_mode
        path.chmod(mode | 0o020)
        with pytest.raises(TrustError, match=rf"{path} is writable by group or others .*chmod go-w {path}"):
            load(path)
        path.chmod(mode)


def test_nothing_from_a_manifest_acts_before_its_signed_statement_is_verified(keys, monkeypatch):
    """A pod with a trust key: an unsigned channel move is refused before the manifest's XLA flags
    or device count touch the process."""
    from avatar_release.cli._devices import prepare_devices_for_build
    from avatar_release.promote import promote
    from avatar_release.registry import MemoryRegistry
    from avatar_release.runtime import TrustConfig
    from tests.release_records import signed_gate_result

    _, pub, *_ = keys
    reg = with_release_state(MemoryRegistry("flags-after-trust"))
    m = cpu_manifest()  # its identity holds
    digest = put_stand_in_build(reg, m)
    signed_gate_result(reg, m.build_id, digest, m)
    promote(reg, m.build_id, "staging")  # moved without a signing key: no statement
    monkeypatch.setenv("XLA_FLAGS", "--xla_untouched=1")
    with pytest.raises(TrustError, match="staging"):
        prepare_devices_for_build(reg, "staging", trust=TrustConfig(pub, None, require_fresh=False))
    assert os.environ["XLA_FLAGS"] == "--xla_untouched=1"


def test_a_stateless_pod_accepts_no_timestamp_signed_longer_ago_than_its_cap(keys):
    """The replay window of a pod that remembers nothing is its cap (default 1 h), whatever expiry the
    signer chose: a 24 h timestamp signed two hours ago is refused."""
    from avatar_release.trust.statements import TIMESTAMP_VALIDITY, sign, sign_timestamp, verify_fresh

    priv, pub, *_ = keys
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    st = sign(priv, build_id="b", build_digest="sha256:" + "a" * 64, channel="prod", sequence=3, who="t", now=now)
    ts = sign_timestamp(
        priv,
        channel="prod",
        sequence=3,
        build_id="b",
        build_digest="sha256:" + "a" * 64,
        validity=timedelta(hours=24),
        now=now - timedelta(hours=2),
    )
    assert TIMESTAMP_VALIDITY == timedelta(hours=1)
    with pytest.raises(TrustError, match=r"signed 2\.0 h ago .*longer ago than this pod accepts \(1 h\)"):
        verify_fresh(ts, pub, statement=st.payload, now=now)
    assert verify_fresh(ts, pub, statement=st.payload, now=now, max_age=timedelta(hours=3)).sequence == 3


def test_a_stateless_pod_s_replay_window_is_the_timestamp_age_limit(keys, tmp_path):
    """The replay window that remains (issue 26, measured): someone with write access puts back an
    older, genuinely signed pointer + statement + timestamp. A pod with no trust state accepts it
    only while that timestamp is younger than the policy's lifetime and the pod's own cap (1 h by
    default each); a pod that kept its state (deploy/: a volume per pod) refuses it at once."""
    from avatar_release.promote import promote
    from avatar_release.registry import MemoryRegistry
    from avatar_release.trust.statements import read_timestamp, verify_channel
    from tests.release_records import publish_stand_in, signed_gate_result

    priv, pub, *_ = keys
    reg = with_release_state(MemoryRegistry("window"))
    a, da, m = publish_stand_in(reg, "a")
    b, db, _ = publish_stand_in(reg, "b")
    signed_gate_result(reg, a, da, m)
    signed_gate_result(reg, b, db, m)
    promote(reg, a, "staging", signing_key=priv)
    kept = AcceptedState(tmp_path / "kept.json")
    kept.accept(verify_channel(reg, "staging", pub, digest=da, state=kept))  # as load() does once loaded
    keys_ = ("channels/staging.json", "records/statements/staging", "records/timestamps/staging")
    old = {k: reg._read(k) for k in keys_}
    issued = datetime.strptime(read_timestamp(reg, "staging").payload.issued_at, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC
    )
    promote(reg, b, "staging", signing_key=priv)
    kept.accept(verify_channel(reg, "staging", pub, digest=db, state=kept))
    for k, v in old.items():
        reg._write_atomic(k, v)  # the replay: a's move, exactly as it was signed
    # a pod with no memory, inside the window: it cannot tell (this is the window that remains)
    assert verify_channel(reg, "staging", pub, digest=da, now=issued + timedelta(minutes=59)).build_id == a
    # past the policy's lifetime (1 h): refused
    with pytest.raises(TrustError, match="timestamp expired"):
        verify_channel(reg, "staging", pub, digest=da, now=issued + timedelta(minutes=61))
    # a pod capped tighter than the signer (--max-timestamp-age 0.25 h) closes it sooner
    with pytest.raises(TrustError, match=r"longer ago than this pod accepts \(0.25 h\)"):
        verify_channel(
            reg, "staging", pub, digest=da, now=issued + timedelta(minutes=16), max_age=timedelta(minutes=15)
        )
    # a pod that kept its trust state: refused at once, whatever the timestamp says
    with pytest.raises(TrustError, match="replayed statement"):
        verify_channel(
            reg,
            "staging",
            pub,
            digest=da,
            state=AcceptedState(tmp_path / "kept.json"),
            now=issued + timedelta(minutes=1),
        )
