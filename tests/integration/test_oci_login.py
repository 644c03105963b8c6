"""Logging in to real registries: distribution with htpasswd over TLS, and with token auth.

Everything a team's registry has is made here: a CA and a server certificate (openssl), an
htpasswd file (bcrypt), a token issuer (an HTTPS server on 127.0.0.1 signing ES256 JWTs with a
key whose certificate the registry trusts), docker login files and a credential helper on PATH.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from avatar_release.errors import RegistryError
from avatar_release.registry import OciRegistry
from avatar_release.registry.oci import RetryPolicy
from tests.oci_server import OciServer, registry_binary_or_skip

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, connect_timeout=2.0, read_timeout=20.0)
USERS = {"ana": "s3cret-ana", "rui": "s3cret-rui"}  # rui may only pull (token registry)


# ---- PKI, made with openssl -------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
                 "-subj", f"/CN=avatar-release test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                               "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return {"ca": d / "ca.pem", "other_ca": d / "other-ca.pem", "cert": d / "server.pem", "key": d / "server.key"}


@pytest.fixture
def logins(tmp_path, monkeypatch):
    """A private docker config directory; nothing of the user's own logins is seen."""
    cfg = tmp_path / "docker"
    cfg.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    for var in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "AVATAR_RELEASE_REGISTRY_CA"):
        monkeypatch.delenv(var, raising=False)

    def write(doc: dict) -> Path:
        (cfg / "config.json").write_text(json.dumps(doc))
        return cfg / "config.json"

    return write


def auths(host: str, user: str, password: str) -> dict:
    return {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def roundtrip(reg: OciRegistry) -> str:
    """Publish a build, point dev at it, read it back: every kind of request a release makes."""
    blob = reg.put_blob(b"exe-bytes")
    doc = {"build_id": "b-1", "exe": {"digest": blob, "size": 9, "media_type": "application/x-exe"}}
    digest, _ = reg.put_build("b-1", json.dumps(doc).encode())
    reg.move_channel("dev", reg.resolve("b-1"), expected_digest=None, action="publish", who="t", reason="r")
    assert reg.resolve("dev").digest == digest
    assert reg.get_blob(blob, 9) == b"exe-bytes" and json.loads(reg.get_manifest_bytes(digest)) == doc
    return digest


# ---- htpasswd over TLS ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def basic_server(pki, tmp_path_factory):
    import bcrypt

    exe = registry_binary_or_skip()
    root = tmp_path_factory.mktemp("oci-basic-tls")
    (root / "htpasswd").write_text("".join(
        f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in USERS.items()))
    auth = f"  htpasswd:\n    realm: avatar-test\n    path: {root / 'htpasswd'}\n"
    server = OciServer(exe, root, tls=(pki["cert"], pki["key"]), auth=auth, ca=pki["ca"]).start()
    try:
        yield server
    finally:
        server.stop()


def basic_uri(server, ca: Path | None = None) -> str:
    return server.uri(f"t/{uuid.uuid4().hex[:10]}") + (f"?ca={ca}" if ca else "")


def test_basic_auth_over_tls_with_a_docker_login_and_a_ca_in_the_uri(basic_server, pki, logins, tmp_path):
    logins(auths(basic_server.host, "ana", USERS["ana"]))
    reg = OciRegistry(basic_uri(basic_server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    digest = roundtrip(reg)
    assert digest.startswith("sha256:")
    # skopeo, given the same CA and login, sees the same artifact
    if shutil.which("skopeo"):
        certs = tmp_path / "certs"
        certs.mkdir()
        shutil.copy(pki["ca"], certs / "ca.crt")
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--cert-dir", str(certs), "--creds",
                              f"ana:{USERS['ana']}", f"docker://{reg.location.host}/{reg.location.repo}:dev"],
                             capture_output=True, check=True, timeout=60).stdout
        assert "sha256:" + __import__("hashlib").sha256(raw).hexdigest() == digest


def test_the_ca_can_come_from_the_environment(basic_server, pki, logins, tmp_path, monkeypatch):
    logins(auths(f"https://{basic_server.host}/v1/", "ana", USERS["ana"]))  # docker login's key form
    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY_CA", str(pki["ca"]))
    reg = OciRegistry(basic_uri(basic_server), retry=FAST, lock_dir=tmp_path)
    assert reg.list_builds() == []


def test_wrong_password_is_a_registry_error_naming_the_user_and_the_login_file(basic_server, pki, logins,
                                                                                tmp_path):
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
        t0 = time.monotonic()
        with pytest.raises(RegistryError, match="TLS verification") as err:
            reg.list_builds()
        assert says in str(err.value) and "AVATAR_RELEASE_REGISTRY_CA" in str(err.value)
        assert reg.transport.requests == 1 and time.monotonic() - t0 < 2
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


# ---- token auth: a token issuer written here ---------------------------------------------------------------
def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """An HTTPS token endpoint: Basic auth against USERS, ES256 JWTs with the signer certificate in x5c.

    ``lifetime`` is the real validity of a token; ``expires_in`` what the answer claims;
    ``expired_next`` makes the next N tokens expired on issue (the registry refuses them).
    """

    service, issuer = "avatar-test", "avatar-test-issuer"

    def __init__(self, root: Path, pki: dict[str, Path]):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        import datetime as dt

        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "avatar-test token signer")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
                .not_valid_after(now + dt.timedelta(days=2)).sign(self.key, hashes.SHA256()))
        self.bundle = root / "token-signer.pem"
        self.bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.lifetime, self.expires_in, self.expired_next = 300, 300, 0
        self.issued: list[tuple[str, list[str]]] = []  # (user, scopes)
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                status, body = issuer.answer(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki["cert"], pki["key"])
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/token"

    def answer(self, path: str, authorization: str | None) -> tuple[int, bytes]:
        user = None
        if authorization:
            u, _, p = base64.b64decode(authorization.removeprefix("Basic ")).decode().partition(":")
            if USERS.get(u) != p:
                return 401, b'{"details":"wrong user or password"}'
            user = u
        q = parse_qs(urlsplit(path).query)
        scopes = q.get("scope", [])
        access = []
        for s in scopes:
            kind, name, actions = s.split(":")
            allowed = {"ana": {"pull", "push"}, "rui": {"pull"}}.get(user or "", set())
            access.append({"type": kind, "name": name, "actions": sorted(set(actions.split(",")) & allowed)})
        now = int(time.time())
        exp = now + self.lifetime
        if self.expired_next:
            self.expired_next -= 1
            exp = now - 3600  # past the registry's 60 s leeway
        claims = {"iss": self.issuer, "sub": user or "", "aud": self.service, "exp": exp, "nbf": now - 5,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        self.issued.append((user or "", scopes))
        return 200, json.dumps({"token": self.sign(claims), "expires_in": self.expires_in}).encode()

    def sign(self, claims: dict) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        header = {"typ": "JWT", "alg": "ES256", "x5c": [self.x5c]}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def token_setup(pki, tmp_path_factory):
    """(registry over plain HTTP on loopback with token auth, the issuer over HTTPS with the test CA)."""
    exe = registry_binary_or_skip()
    root = tmp_path_factory.mktemp("oci-token")
    issuer = TokenIssuer(root, pki)
    auth = (f"  token:\n    realm: {issuer.realm}\n    service: {issuer.service}\n    issuer: {issuer.issuer}\n"
            f"    rootcertbundle: {issuer.bundle}\n")
    server = OciServer(exe, root, auth=auth).start()
    try:
        yield server, issuer
    finally:
        server.stop()
        issuer.stop()


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
        print(f"\n[measure] publish + move + read: {anonymous.transport.requests} requests anonymous, "
              f"{reg.transport.requests} with token auth (challenges and token fetches included)")
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
    cached.value = issuer.sign({"iss": issuer.issuer, "sub": "ana", "aud": issuer.service, "exp": now - 3600,
                                "nbf": now - 7200, "iat": now - 7200, "jti": "old", "access": []})
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


# ---- the registry contract, over both logins ------------------------------------------------------------
@pytest.fixture(params=["basic-tls", "token"])
def reg(request, pki, logins, tmp_path, monkeypatch):
    """A fresh repository behind each login (the contract tests below take ``reg``)."""
    if request.param == "basic-tls":
        server = request.getfixturevalue("basic_server")
        logins(auths(server.host, "ana", USERS["ana"]))
        return OciRegistry(basic_uri(server, pki["ca"]), retry=FAST, lock_dir=tmp_path)
    server, issuer = request.getfixturevalue("token_setup")
    issuer.lifetime, issuer.expires_in, issuer.expired_next = 300, 300, 0
    monkeypatch.setenv("AVATAR_RELEASE_REGISTRY_CA", str(pki["ca"]))
    logins(auths(server.host, "ana", USERS["ana"]))
    return OciRegistry(server.uri(f"t/{uuid.uuid4().hex[:10]}"), retry=FAST, lock_dir=tmp_path)


from tests.unit import test_registry as contract  # noqa: E402

test_contract_blob_round_trip_and_dedup = contract.test_blob_round_trip_and_dedup
test_contract_blob_with_lying_size_is_refused = contract.test_blob_with_lying_size_is_refused
test_contract_missing_blob_is_not_found = contract.test_missing_blob_is_not_found
test_contract_put_build_is_immutable = contract.test_put_build_is_immutable
test_contract_resolve_channel_build_id_digest_and_prefix = contract.test_resolve_channel_build_id_digest_and_prefix
test_contract_move_channel_is_compare_and_swap = contract.test_move_channel_is_compare_and_swap
test_contract_names_that_escape_are_refused = contract.test_names_that_escape_are_refused


def test_oras_with_basic_auth_over_tls_pulls_a_build_published_here(basic_server, pki, logins, tmp_path):
    """A standard client, logged in the same way, reads what avatar-release wrote."""
    oras = pytest.importorskip("oras.client")
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
