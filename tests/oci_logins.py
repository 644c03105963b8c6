"""Registries as teams run them, for tests: htpasswd over TLS and token auth, with docker logins.

Everything is made here: a CA and a server certificate for 127.0.0.1 (openssl), an htpasswd file
(bcrypt), a token issuer (an HTTPS server on 127.0.0.1 signing ES256 JWTs with a key whose
certificate the registry trusts) and a private docker config directory. The servers are
CNCF distribution (:mod:`tests.oci_server`), one of each per test module that asks (module scope,
as ``oci_server``: no server outlives its module, so later tests see no stray child processes);
tests use their own repositories in them. Without ``docker-registry`` (or ``openssl``) the tests
that ask for them skip, unless ``AVATAR_RELEASE_REQUIRE_REGISTRY`` is set.

Fixtures (made visible to ``tests/integration`` by its conftest): ``pki``, ``logins``,
``basic_server``, ``token_setup``.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.oci_server import OciServer
from tests.tools import binary, module

__all__ = ["USERS", "TokenIssuer", "auths", "basic_uri", "pki", "logins", "basic_server", "token_setup"]

USERS = {"ana": "s3cret-ana", "rui": "s3cret-rui"}  # rui may only pull (token registry)


# ---- PKI, made with openssl -------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    binary("openssl")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for name in ("ca", "other-ca"):
        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=avatar-release test {name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            cwd=d,
        )
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        cwd=d,
    )
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


# ---- htpasswd over TLS ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def basic_server(pki, tmp_path_factory):
    bcrypt = module("bcrypt")
    exe = binary("docker-registry")
    root = tmp_path_factory.mktemp("oci-basic-tls")
    (root / "htpasswd").write_text(
        "".join(f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in USERS.items())
    )
    auth = f"  htpasswd:\n    realm: avatar-test\n    path: {root / 'htpasswd'}\n"
    server = OciServer(exe, root, tls=(pki["cert"], pki["key"]), auth=auth, ca=pki["ca"]).start()
    try:
        yield server
    finally:
        server.stop()


def basic_uri(server, ca: Path | None = None) -> str:
    return server.uri(f"t/{uuid.uuid4().hex[:10]}") + (f"?ca={ca}" if ca else "")


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
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "avatar-test token signer")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .sign(self.key, hashes.SHA256())
        )
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
        claims = {
            "iss": self.issuer,
            "sub": user or "",
            "aud": self.service,
            "exp": exp,
            "nbf": now - 5,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
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
    exe = binary("docker-registry")
    root = tmp_path_factory.mktemp("oci-token")
    issuer = TokenIssuer(root, pki)
    auth = (
        f"  token:\n    realm: {issuer.realm}\n    service: {issuer.service}\n    issuer: {issuer.issuer}\n"
        f"    rootcertbundle: {issuer.bundle}\n"
    )
    server = OciServer(exe, root, auth=auth).start()
    try:
        yield server, issuer
    finally:
        server.stop()
        issuer.stop()
