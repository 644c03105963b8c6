"""Logging in to real registries: distribution with htpasswd over TLS, and with token auth.

The servers, their CA and certificate, the token issuer and the docker login files come from
:mod:`tests.oci_logins`; a credential helper on PATH is made here. What every store must do
(blobs, builds, channels, records) over both logins is the conformance suite's
(``test_registry_conformance.py``); this module tests logging in: what is sent, and what each
failure says.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from avatar_release.errors import RegistryError
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_logins import USERS, auths, basic_uri
from tests.tools import binary_if_present, module

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)


def roundtrip(reg: OciRegistry) -> str:
    """Publish a build, point dev at it, read it back: every kind of request a release makes."""
    blob = reg.put_blob(b"exe-bytes")
    doc = {"build_id": "b-1", "exe": {"digest": blob, "size": 9, "media_type": "application/x-exe"}}
    digest, _ = reg.put_build("b-1", json.dumps(doc).encode())
    reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r")
    assert reg.resolve("dev").digest == digest
    assert reg.get_blob(blob, 9) == b"exe-bytes" and json.loads(reg.get_manifest_bytes(digest)) == doc
    return digest


def test_basic_auth_over_tls_with_a_docker_login_and_a_ca_in_the_uri(basic_server, pki, logins, tmp_path):
    logins(auths(basic_server.host, "ana", USERS["ana"]))
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    digest = roundtrip(reg)
    assert digest.startswith("sha256:")
    # skopeo, given the same CA and login, sees the same artifact
    if binary_if_present("skopeo"):
        certs = tmp_path / "certs"
        certs.mkdir()
        shutil.copy(pki["ca"], certs / "ca.crt")
        raw = subprocess.run(
            [
                "skopeo",
                "inspect",
                "--raw",
                "--cert-dir",
                str(certs),
                "--creds",
                f"ana:{USERS['ana']}",
                f"docker://{reg.location.host}/{reg.location.repo}:dev",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        assert "sha256:" + __import__("hashlib").sha256(raw).hexdigest() == digest


def test_the_ca_can_come_from_the_environment(basic_server, pki, logins, tmp_path, monkeypatch):
    logins(auths(f"https://{basic_server.host}/v1/", "ana", USERS["ana"]))  # docker login's key form
    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY_CA", str(pki["ca"]))
    reg = OciRegistry(basic_uri(basic_server), retry=FAST, lock_dir=tmp_path)
    assert reg.list_builds() == []


def test_wrong_password_is_a_registry_error_naming_the_user_and_the_login_file(basic_server, pki, logins, tmp_path):
    path = logins(auths(basic_server.host, "ana", "not-her-password"))
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError, match="wrong user name or password") as err:
        reg.list_builds()
    assert "'ana'" in str(err.value) and str(path) in str(err.value) and err.value.exit_code == 7
    assert "not-her-password" not in str(err.value)


def test_no_login_is_a_registry_error_that_says_how_to_log_in(basic_server, pki, logins, tmp_path):
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError, match="none were found") as err:
        reg.list_builds()
    assert f"docker login {basic_server.host}" in str(err.value) and err.value.exit_code == 7


def test_an_untrusted_certificate_is_a_clear_tls_error_not_a_retry_storm(basic_server, pki, logins, tmp_path):
    logins(auths(basic_server.host, "ana", USERS["ana"]))
    for ca, says in ((None, "the system CAs"), (pki["other_ca"], f"the CA file {pki['other_ca']}")):
        reg = OciRegistry(basic_uri(basic_server, ca), retry=FAST, lock_dir=tmp_path)
        with pytest.raises(RegistryError, match="TLS verification") as err:
            reg.list_builds()
        assert says in str(err.value) and "AVATAR_RELEASE_REGISTRY_CA" in str(err.value)
        assert reg.transport.requests == 1  # one request, no retries
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(RegistryError, match=f"the CA file {missing} .* does not exist"):
        OciRegistry(basic_uri(basic_server, missing), retry=FAST, lock_dir=tmp_path).list_builds()


# ---- a credential helper on PATH ------------------------------------------------------------------------
HELPER = """#!{python}
import json, sys
host = sys.stdin.read().strip()
with open({log!r}, "a") as f:
    f.write(sys.argv[1] + " " + host + "\\n")
store = json.load(open({store!r}))
if sys.argv[1] != "get" or host not in store:
    print("credentials not found in native keychain")
    sys.exit(1)
print(json.dumps({{"ServerURL": host, "Username": store[host][0], "Secret": store[host][1]}}))
"""


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """``docker-credential-avtest`` on PATH, answering from a JSON file; returns (store path, log path)."""
    bindir, store, log = tmp_path / "bin", tmp_path / "store.json", tmp_path / "helper.log"
    bindir.mkdir()
    exe = bindir / "docker-credential-avtest"
    exe.write_text(HELPER.format(python=sys.executable, log=str(log), store=str(store)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    return store, log


@pytest.mark.parametrize("how", ["credHelpers", "credsStore"])
def test_a_credential_helper_supplies_the_login(basic_server, pki, logins, helper, tmp_path, how):
    store, log = helper
    store.write_text(json.dumps({basic_server.host: ["ana", USERS["ana"]]}))
    logins({"credHelpers": {basic_server.host: "avtest"}} if how == "credHelpers" else {"credsStore": "avtest"})
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    roundtrip(reg)
    assert log.read_text().splitlines() == [f"get {basic_server.host}"]  # asked once, for this host


def test_a_helper_without_the_host_and_a_missing_helper_are_clear(basic_server, pki, logins, helper, tmp_path):
    store, _ = helper
    store.write_text("{}")
    logins({"credsStore": "avtest"})
    with pytest.raises(RegistryError, match="none were found"):
        OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path).list_builds()
    logins({"credsStore": "nosuchhelper"})
    with pytest.raises(RegistryError, match="docker-credential-nosuchhelper is not on PATH"):
        OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path).list_builds()


@pytest.fixture
def token_reg(token_setup, pki, logins, tmp_path, monkeypatch):
    server, issuer = token_setup
    issuer.lifetime, issuer.expires_in, issuer.expired_next = 300, 300, 0
    issuer.issued.clear()
    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY_CA", str(pki["ca"]))  # the token server's CA
    repo = f"t/{uuid.uuid4().hex[:10]}"

    def make(user: str | None = "ana", password: str | None = None):
        logins(auths(server.host, user, password or USERS[user]) if user else {})
        return OciRegistry(server.uri(repo), retry=FAST, lock_dir=tmp_path)

    return make, issuer


def test_token_flow_pulls_and_pushes_with_one_token_per_scope(token_reg, oci_server, tmp_path, capsys):
    make, issuer = token_reg
    reg = make("ana")
    roundtrip(reg)
    anonymous = OciRegistry(oci_server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path / "anon")
    roundtrip(anonymous)
    with capsys.disabled():
        print(
            f"\n[measure] publish + move + read: {anonymous.transport.requests} requests anonymous, "
            f"{reg.transport.requests} with token auth (challenges and token fetches included)"
        )
    # the token flow costs its challenges and token fetches, not a request per operation
    assert reg.transport.requests <= anonymous.transport.requests + 6
    scopes = [tuple(s) for _, s in issuer.issued]
    repo = reg.location.repo
    # one token for writes and one for reads, each cached for the whole release
    assert sorted(set(scopes)) == [(f"repository:{repo}:pull",), (f"repository:{repo}:pull,push",)]
    assert len(issuer.issued) == 2 and {u for u, _ in issuer.issued} == {"ana"}
    assert reg.transport.auth.token_fetches == 2


def test_a_pull_only_user_reads_but_cannot_write(token_reg):
    make, issuer = token_reg
    roundtrip(make("ana"))
    reader = make("rui")
    assert reader.resolve("dev").build_id == "b-1"
    with pytest.raises(RegistryError, match="refused") as err:
        reader.put_blob(b"not allowed")
    assert "'rui'" in str(err.value) and err.value.exit_code == 7


def test_wrong_password_at_the_token_server_is_clear(token_reg):
    make, issuer = token_reg
    with pytest.raises(RegistryError, match="token server .* refused user 'ana'.*wrong user name or password"):
        make("ana", "wrong").list_builds()


def test_an_expired_token_is_fetched_again_and_a_token_expired_on_arrival_is_an_error(token_reg):
    make, issuer = token_reg
    reg = make("ana")
    assert reg.list_builds() == [] and reg.transport.auth.token_fetches == 1
    # the cached token expires at the server before the client expected it to (a clock skew, a revocation)
    cached = reg.transport.auth._tokens[reg.transport.scope("GET")]
    now = int(time.time())
    cached.value = issuer.sign(
        {
            "iss": issuer.issuer,
            "sub": "ana",
            "aud": issuer.service,
            "exp": now - 3600,
            "nbf": now - 7200,
            "iat": now - 7200,
            "jti": "old",
            "access": [],
        }
    )
    assert reg.list_builds() == []  # the 401 fetched a fresh token, and the request went through
    assert reg.transport.auth.token_fetches == 2
    issuer.expired_next = 10  # every token stale: the registry refuses even the fresh one
    stale = make("ana")
    with pytest.raises(RegistryError, match="refused a token just issued by .*expired on arrival") as err:
        stale.list_builds()
    assert err.value.exit_code == 7


def test_a_token_past_its_expires_in_is_renewed_before_use(token_reg):
    make, issuer = token_reg
    issuer.expires_in = 1  # under the client's safety margin: every request asks anew
    reg = make("ana")
    reg.list_builds()
    reg.list_builds()
    assert reg.transport.auth.token_fetches >= 2
    issuer.expires_in = 300
    steady = make("ana")
    steady.list_builds()
    steady.list_builds()
    assert steady.transport.auth.token_fetches == 1


def test_anonymous_token_is_refused_with_a_login_hint(token_reg):
    make, issuer = token_reg
    with pytest.raises(RegistryError, match="none were found"):
        make(None).list_builds()


def test_oras_with_basic_auth_over_tls_pulls_a_build_published_here(basic_server, pki, logins, tmp_path):
    """A standard client, logged in the same way, reads what avatar-release wrote."""
    oras = module("oras.client")
    logins(auths(basic_server.host, "ana", USERS["ana"]))
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    digest = roundtrip(reg)
    client = oras.OrasClient(hostname=basic_server.host, tls_verify=str(pki["ca"]), auth_backend="basic")
    client.login(username="ana", password=USERS["ana"], hostname=basic_server.host, tls_verify=str(pki["ca"]))
    out = tmp_path / "pulled"
    client.pull(target=f"{reg.location.host}/{reg.location.repo}:dev", outdir=str(out))
    assert (out / "avatar-release-manifest.json").read_bytes() == reg.get_manifest_bytes(digest)
    assert sorted(p.name for p in out.iterdir()) == ["avatar-release-manifest.json", "exe"]
    assert (out / "exe").read_bytes() == b"exe-bytes"


def test_the_cli_exits_7_and_says_which_credentials_were_refused(basic_server, pki, logins):
    from click.testing import CliRunner

    from avatar_release.cli import cli

    path = logins(auths(basic_server.host, "ana", "wrong"))
    r = CliRunner().invoke(cli, ["ls", "--registry", basic_uri(basic_server, pki["ca"])])
    assert r.exit_code == 7, r.output
    assert "wrong user name or password" in r.output and "'ana'" in r.output and str(path) in r.output
