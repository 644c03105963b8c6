"""Login for OCI registries without a server: challenges, login files, where credentials may go."""

from __future__ import annotations

import base64
import json

import pytest

from avatar_release.errors import InputError, RegistryError
from avatar_release.registry.oci import (
    Credentials,
    LoginAuth,
    OciLocation,
    RetryPolicy,
    Transport,
    find_credentials,
    parse_challenge,
    parse_oci_uri,
)
from tests.oci_memory import MemoryDistribution, MemoryResponse

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)


@pytest.fixture
def env(tmp_path, monkeypatch):
    for var in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    (tmp_path / "docker").mkdir()
    return tmp_path


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_challenges_parse_with_commas_inside_quotes():
    c = parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:a/b:pull,push",error="insufficient_scope"'
    )
    assert c.scheme == "bearer" and c.params == {
        "realm": "https://auth.example/token",
        "service": "registry.example",
        "scope": "repository:a/b:pull,push",
        "error": "insufficient_scope",
    }
    assert parse_challenge('Basic realm="x"').scheme == "basic" and parse_challenge(None) is None


def test_login_files_in_the_order_container_tools_use(env, monkeypatch):
    (env / "docker" / "config.json").write_text(
        json.dumps(
            {
                "auths": {
                    "https://reg.example:5000/v1/": {"auth": b64("docker-user:pw1")},
                    "other.example": {"username": "u2", "password": "pw2"},
                }
            }
        )
    )
    assert find_credentials("reg.example:5000").username == "docker-user"
    assert find_credentials("REG.example:5000").password == "pw1"
    assert find_credentials("other.example") == Credentials("u2", "pw2", f"{env / 'docker' / 'config.json'} auths")
    assert find_credentials("reg.example") is None  # the port is part of the host
    podman = env / "auth.json"
    podman.write_text(json.dumps({"auths": {"reg.example:5000": {"auth": b64("podman-user:pw3")}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(podman))
    assert find_credentials("reg.example:5000").username == "podman-user"  # REGISTRY_AUTH_FILE first
    assert find_credentials("other.example").username == "u2"  # then the docker config


def test_unsupported_or_broken_logins_say_so(env):
    cfg = env / "docker" / "config.json"
    cfg.write_text(json.dumps({"auths": {"reg.example": {"identitytoken": "refresh-me"}}}))
    with pytest.raises(RegistryError, match="identity token"):
        find_credentials("reg.example")
    cfg.write_text(json.dumps({"auths": {"reg.example": {"auth": b64("no-colon")}}}))
    with pytest.raises(RegistryError, match="not base64 'user:password'"):
        find_credentials("reg.example")
    cfg.write_text("{not json")
    with pytest.raises(RegistryError, match=f"cannot read the login file {cfg}"):
        find_credentials("reg.example")


def test_ca_is_a_uri_parameter_and_nothing_else_is():
    assert parse_oci_uri("oci://reg.example/team/avatar?ca=/etc/ca.pem").ca == "/etc/ca.pem"
    assert parse_oci_uri("oci://reg.example/team/avatar").verify() in (
        True,
        __import__("os").environ.get("AVATAR_RELEASE_REGISTRY_CA"),
    )
    for bad in ("oci://reg.example/a?user=x", "oci://reg.example/a?ca=", "oci://u:p@reg.example/a"):
        with pytest.raises(InputError, match="no credentials, query"):
            parse_oci_uri(bad)


def Script(answer):  # noqa: N802 (reads as the class it replaced)
    """The package's in-memory distribution server with every request answered by ``answer(method,
    url, headers) -> (status, headers, body)``; it records what was sent in ``.sent``."""
    return MemoryDistribution(
        before=lambda method, url, headers, data: MemoryResponse(*answer(method, url, headers), url=url)
    )


def test_credentials_go_to_the_registry_host_only():
    creds = Credentials("ana", "pw", "test")

    def answer(method, url, headers):
        if "reg.example" in url and "Authorization" not in headers:
            return 401, {"WWW-Authenticate": 'Basic realm="r"'}, b""
        return 200, {}, b"{}"

    loc = OciLocation("https", "reg.example", "team/avatar")
    session = Script(answer)
    t = Transport(loc, session=session, retry=FAST)
    t.auth = LoginAuth(loc.host, t.fetch_token, creds)
    assert t.call("list tags", "GET", f"{loc.base}/tags/list").status == 200
    t.call("pull blob", "GET", "https://blobs.elsewhere.example/sha256/abc")
    sent = [(u.split("/")[2], h.get("Authorization")) for _, u, h in session.sent]
    assert sent == [("reg.example", None), ("reg.example", creds.basic()), ("blobs.elsewhere.example", None)]


def test_a_request_sent_before_another_answered_the_challenge_is_sent_again_with_the_login():
    """Parallel blobs of a copy (issue 42 item 5.5): two requests go out before the registry's Basic
    challenge is answered; the one whose 401 arrives second is not 'wrong user name or password'."""
    creds = Credentials("ana", "pw", "test")
    order: list[str] = []

    def answer(method, url, headers):
        if "Authorization" not in headers:
            if url.endswith("/first") and not order:
                order.append("first sent")
                assert t.call("check blob", "HEAD", f"{loc.base}/blobs/second").status == 200  # meanwhile
            return 401, {"WWW-Authenticate": 'Basic realm="r"'}, b""
        return (200, {}, b"") if headers["Authorization"] == creds.basic() else (401, {}, b"")

    loc = OciLocation("https", "reg.example", "team/avatar")
    session = Script(answer)
    t = Transport(loc, session=session, retry=FAST)
    t.auth = LoginAuth(loc.host, t.fetch_token, creds)
    assert t.call("check blob", "HEAD", f"{loc.base}/blobs/first").status == 200
    sent = [(u.rsplit("/", 1)[1], h.get("Authorization")) for _, u, h in session.sent]
    assert sent == [("first", None), ("second", None), ("second", creds.basic()), ("first", creds.basic())]
    # the same credentials refused are still refused, once, and said so
    wrong = Transport(loc, session=Script(answer), retry=FAST)
    wrong.auth = LoginAuth(loc.host, wrong.fetch_token, Credentials("ana", "not-pw", "test"))
    with pytest.raises(RegistryError, match="wrong user name or password"):
        wrong.call("check blob", "HEAD", f"{loc.base}/blobs/other")
    assert len(wrong._session.sent) == 2


def test_credentials_never_go_to_a_plain_http_token_realm_on_another_host():
    def answer(method, url, headers):
        return 401, {"WWW-Authenticate": 'Bearer realm="http://auth.example/token",service="s"'}, b""

    loc = OciLocation("https", "reg.example", "team/avatar")
    session = Script(answer)
    t = Transport(loc, session=session, retry=FAST)
    t.auth = LoginAuth(loc.host, t.fetch_token, Credentials("ana", "pw", "test"))
    with pytest.raises(RegistryError, match="plain HTTP on another host; refusing to send credentials"):
        t.call("list tags", "GET", f"{loc.base}/tags/list")
    assert [u.split("/")[2] for _, u, _ in session.sent] == ["reg.example"]
