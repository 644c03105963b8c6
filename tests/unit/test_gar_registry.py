"""Google Artifact Registry backend, up to the wire (no Google Cloud is reachable from the tests).

Checked: URI parsing and its errors, the endpoint and URLs built, the bearer token sent (and
only to the registry's host), token refresh, the Artifact Registry API requests made for tag
listings, clear errors for missing credentials, refused access and an unreachable endpoint;
then the whole registry behaviour through the GAR code path against a local OCI registry
standing in for ``L-docker.pkg.dev``.
"""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass

import pytest
import requests

from avatar_release._digest import sha256_digest
from avatar_release.errors import InputError, RegistryError
from avatar_release.registry import GarRegistry, Registry, open_registry
from avatar_release.registry._gar import parse_gar_uri
from avatar_release.registry.oci import RetryPolicy
from tests.oci_memory import MemoryDistribution, MemoryResponse

URI = "gar://projects/my-proj/locations/us-central1/repositories/releases"
BASE = "https://us-central1-docker.pkg.dev/v2/my-proj/releases/avatar-release"
FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002, connect_timeout=1.0, read_timeout=5.0)


# ---- fakes -------------------------------------------------------------------------------------------
class FakeCredentials:
    """The google.auth Credentials surface the backend uses: valid, token, refresh(request)."""

    def __init__(self, tokens=("tok-1", "tok-2", "tok-3"), fail: Exception | None = None):
        self.tokens, self.fail = list(tokens), fail
        self.token, self.valid, self.refreshes = None, False, 0

    def refresh(self, request):
        if self.fail:
            raise self.fail
        self.refreshes += 1
        self.token, self.valid = self.tokens.pop(0), True


def FakeSession(answer):  # noqa: N802 (reads as the class it replaced)
    """The package's in-memory distribution server with every request answered by ``answer(method,
    url) -> (status, headers, body)``; it records what was sent in ``.sent``."""
    return MemoryDistribution(before=lambda method, url, headers, data: MemoryResponse(*answer(method, url), url=url))


@dataclass
class FakeTag:
    name: str


class FakeTagsClient:
    def __init__(self, tags, error: Exception | None = None):
        self.tags, self.error, self.requests = tags, error, []

    def list_tags(self, request=None, **kw):
        self.requests.append(request)
        if self.error:
            raise self.error
        return [FakeTag(f"{request['parent']}/tags/{t}") for t in self.tags]


def blob_upload_server(method, url):
    """Enough of the OCI API for one blob push: HEAD 404, POST 202 (+Location), PUT 201."""
    if method == "HEAD":
        return 404, {}, b""
    if method == "POST":
        return 202, {"Location": "/v2/my-proj/releases/avatar-release/blobs/uploads/u1?_state=s"}, b""
    return 201, {"Docker-Content-Digest": sha256_digest(b"payload")}, b""


# ---- URIs --------------------------------------------------------------------------------------------
def test_uri_maps_to_the_docker_endpoint_and_the_api_resource_names():
    loc = parse_gar_uri(URI)
    assert (loc.project, loc.location, loc.repository, loc.package) == (
        "my-proj",
        "us-central1",
        "releases",
        "avatar-release",
    )
    assert loc.host == "us-central1-docker.pkg.dev" and loc.oci_repo == "my-proj/releases/avatar-release"
    assert loc.package_name == "projects/my-proj/locations/us-central1/repositories/releases/packages/avatar-release"
    custom = parse_gar_uri(URI + "/packages/team/avatar")
    assert custom.oci_repo == "my-proj/releases/team/avatar"
    assert custom.package_name.endswith("/packages/team%2Favatar")
    assert parse_gar_uri("gar://projects/my-proj/locations/us/repositories/r/").host == "us-docker.pkg.dev"
    reg = GarRegistry(URI, credentials=FakeCredentials())
    assert reg.location.base == BASE


@pytest.mark.parametrize(
    "uri, why",
    [
        ("gar://projects/my-proj/locations/us-central1", "expected gar://projects/PROJECT"),
        ("gar://project/my-proj/locations/us-central1/repositories/r", "expected gar://projects/PROJECT"),
        ("gar://projects/my-proj/locations/us-central1/repositories/r/images/x", "expected gar://projects/PROJECT"),
        ("gar://projects/My_Proj/locations/us-central1/repositories/r", "invalid project 'My_Proj'"),
        ("gar://projects/example.com:proj/locations/us/repositories/r", "no query, fragment, port"),
        ("gar://projects/my-proj/locations/US/repositories/r", "invalid location 'US'"),
        ("gar://projects/my-proj/locations/us-central1/repositories/-r", "invalid repository '-r'"),
        ("gar://projects/my-proj/locations/us-central1/repositories/r/packages/../x", "invalid image"),
        ("gar://projects/my-proj/locations/us-central1/repositories/r?x=1", "no query"),
    ],
)
def test_bad_uris_are_input_errors_that_show_the_form(uri, why):
    with pytest.raises(InputError, match=why) as err:
        open_registry(uri)
    assert "gar://projects/PROJECT/locations/LOCATION/repositories/REPOSITORY" in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.extra("gar")  # google-auth
def test_opening_a_gar_registry_touches_no_credentials(monkeypatch):
    import google.auth

    monkeypatch.setattr(google.auth, "default", lambda **kw: pytest.fail("credentials read at open time"))
    reg = open_registry(URI)
    assert isinstance(reg, GarRegistry) and isinstance(reg, Registry) and reg.uri == URI


# ---- the wire ------------------------------------------------------------------------------------------
@pytest.mark.extra("gar")  # google-auth
def test_every_request_carries_the_bearer_token_of_the_credentials(tmp_path):
    creds, session = FakeCredentials(), FakeSession(blob_upload_server)
    reg = GarRegistry(URI, credentials=creds, session=session, retry=FAST, lock_dir=tmp_path)
    assert reg.put_blob(b"payload") == sha256_digest(b"payload")
    digest = sha256_digest(b"payload")
    assert [(m, u) for m, u, _ in session.sent] == [
        ("HEAD", f"{BASE}/blobs/{digest}"),
        ("POST", f"{BASE}/blobs/uploads/"),
        ("PUT", f"{BASE}/blobs/uploads/u1?_state=s&digest={digest}"),
    ]
    assert all(h["Authorization"] == "Bearer tok-1" for _, _, h in session.sent)
    assert creds.refreshes == 1  # one token for all three requests
    creds.valid = False  # expired: the next request refreshes it
    reg.has_blob(digest)
    assert session.sent[-1][2]["Authorization"] == "Bearer tok-2" and creds.refreshes == 2


def test_the_token_is_never_sent_to_another_host(tmp_path):
    def answer(method, url):
        if method == "POST":
            return 202, {"Location": "https://uploads.example.net/upload/u1?sig=x"}, b""
        return blob_upload_server(method, url)

    session = FakeSession(answer)
    reg = GarRegistry(URI, token_provider=lambda: "tok-x", session=session, retry=FAST, lock_dir=tmp_path)
    reg.put_blob(b"payload")
    put = session.sent[-1]
    assert put[1].startswith("https://uploads.example.net/") and "Authorization" not in put[2]
    assert session.sent[0][2]["Authorization"] == "Bearer tok-x"


@pytest.mark.extra("gar")  # google-auth
def test_application_default_credentials_are_used_with_the_cloud_platform_scope(monkeypatch, tmp_path):
    import google.auth

    asked = {}

    def default(scopes=None, **kw):
        asked["scopes"] = scopes
        return FakeCredentials(tokens=("adc-token",)), "my-proj"

    monkeypatch.setattr(google.auth, "default", default)
    session = FakeSession(lambda m, u: (200, {"Content-Length": "7"}, b""))
    reg = GarRegistry(URI, session=session, retry=FAST, lock_dir=tmp_path)
    assert reg.has_blob(sha256_digest(b"payload"))
    assert asked["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert session.sent[0][2]["Authorization"] == "Bearer adc-token"


@pytest.mark.extra("gar")  # google-auth
def test_missing_credentials_say_how_to_get_them(monkeypatch, tmp_path):
    import google.auth
    import google.auth.exceptions

    def default(**kw):
        raise google.auth.exceptions.DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", default)
    reg = GarRegistry(URI, session=FakeSession(blob_upload_server), retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError, match="no Google credentials found .*gcloud auth application-default login"):
        reg.has_blob(sha256_digest(b"x"))


@pytest.mark.extra("gar")  # google-auth
def test_a_token_that_cannot_be_refreshed_is_a_registry_error(tmp_path):
    import google.auth.exceptions

    creds = FakeCredentials(fail=google.auth.exceptions.RefreshError("invalid_grant: token revoked"))
    reg = GarRegistry(URI, credentials=creds, session=FakeSession(blob_upload_server), retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError, match="could not get a Google access token .*invalid_grant"):
        reg.has_blob(sha256_digest(b"x"))


@pytest.mark.extra("gar")  # google-auth
def test_refused_access_names_the_roles_to_grant(tmp_path):
    body = json.dumps(
        {
            "errors": [
                {"code": "DENIED", "message": "Permission 'artifactregistry.repositories.downloadArtifacts' denied"}
            ]
        }
    ).encode()
    session = FakeSession(lambda m, u: (403, {}, body))
    reg = GarRegistry(URI, credentials=FakeCredentials(), session=session, retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError) as err:
        reg.get_blob(sha256_digest(b"x"), 1)
    msg = str(err.value)
    assert "HTTP 403" in msg and "DENIED" in msg and "roles/artifactregistry.reader" in msg
    assert "projects/my-proj/locations/us-central1/repositories/releases" in msg
    assert len(session.sent) == 1  # an authorization failure is not retried


@pytest.mark.extra("gar")  # google-auth
def test_an_unreachable_endpoint_is_a_clear_registry_error(tmp_path):
    class Unreachable:
        calls = 0

        def request(self, method, url, **kw):
            Unreachable.calls += 1
            raise requests.ConnectionError(f"Failed to resolve '{url.split('/')[2]}' (Name or service not known)")

    reg = GarRegistry(URI, credentials=FakeCredentials(), session=Unreachable(), retry=FAST, lock_dir=tmp_path)
    with pytest.raises(RegistryError) as err:
        reg.resolve("prod")
    msg = str(err.value)
    assert "registry us-central1-docker.pkg.dev/my-proj/releases/avatar-release" in msg
    assert "resolve channel prod failed after 3 attempt(s)" in msg and "ConnectionError" in msg
    assert "https://us-central1-docker.pkg.dev is up and reachable" in msg
    assert Unreachable.calls == 3 and err.value.exit_code == 7


@pytest.mark.extra("gar")  # google-auth
def test_an_unreachable_endpoint_over_real_sockets(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = GarRegistry(
        URI, credentials=FakeCredentials(), endpoint=f"http://127.0.0.1:{port}", retry=FAST, lock_dir=tmp_path
    )
    with pytest.raises(RegistryError, match=rf"127\.0\.0\.1:{port}/my-proj/releases/avatar-release: pull blob"):
        reg.get_blob(sha256_digest(b"x"), 1)


def test_bad_endpoint_override_is_an_input_error():
    with pytest.raises(InputError, match="expected scheme://host"):
        GarRegistry(URI, endpoint="ftp://somewhere/path")


# ---- tags through the Artifact Registry API -------------------------------------------------------------
def test_tags_are_listed_through_the_artifact_registry_api(tmp_path):
    client = FakeTagsClient(["dev", "_avr.b.b-1", "_avr.b.b-2", "_avr.r.reviews.N.b-1", "_avr.history"])
    reg = GarRegistry(
        URI + "/packages/team/avatar",
        credentials=FakeCredentials(),
        tags_client=client,
        session=FakeSession(lambda m, u: (404, {}, b"")),
        retry=FAST,
        lock_dir=tmp_path,
    )
    assert reg.list_records("reviews") == ["b-1"]
    parent = "projects/my-proj/locations/us-central1/repositories/releases/packages/team%2Favatar"
    assert client.requests == [{"parent": parent, "page_size": 1000}]
    assert reg.manifests.tags_with("_avr.b.") == ["_avr.b.b-1", "_avr.b.b-2"]


def test_a_package_that_does_not_exist_yet_has_no_tags(tmp_path):
    NotFound = type("NotFound", (Exception,), {})
    reg = GarRegistry(
        URI,
        credentials=FakeCredentials(),
        tags_client=FakeTagsClient([], NotFound("404 package")),
        retry=FAST,
        lock_dir=tmp_path,
    )
    assert reg.list_records("reviews") == []
    broken = GarRegistry(
        URI,
        credentials=FakeCredentials(),
        tags_client=FakeTagsClient([], RuntimeError("503")),
        retry=FAST,
        lock_dir=tmp_path,
    )
    with pytest.raises(RegistryError, match="listing tags of projects/my-proj/.* through the Artifact Registry API"):
        broken.list_builds()


# ---- the whole behaviour through the GAR code path, against a local stand-in ---------------------------------
class RecordingSession(requests.Session):
    def __init__(self):
        super().__init__()
        self.auth_seen: list[str | None] = []

    def request(self, method, url, **kw):
        self.auth_seen.append((kw.get("headers") or {}).get("Authorization"))
        return super().request(method, url, **kw)


class OciBackedTagsClient:
    """Answers list_tags like the Artifact Registry API, from the stand-in's OCI tag list."""

    def __init__(self, base):
        self.base, self.parents = base, []

    def list_tags(self, request=None, **kw):
        self.parents.append(request["parent"])
        r = requests.get(f"{self.base}/tags/list", timeout=5)
        tags = r.json().get("tags") or [] if r.status_code == 200 else []
        return [FakeTag(f"{request['parent']}/tags/{t}") for t in tags]


@pytest.mark.extra("gar")  # google-auth
def test_full_behaviour_through_the_gar_code_path_against_a_local_stand_in(oci_server, tmp_path):
    uri = f"gar://projects/my-proj/locations/us-central1/repositories/releases/packages/t{uuid.uuid4().hex[:8]}"
    session, creds = RecordingSession(), FakeCredentials(tokens=("tok-a",))
    tags = OciBackedTagsClient(f"http://{oci_server.host}/v2/{parse_gar_uri(uri).oci_repo}")
    reg = GarRegistry(
        uri,
        credentials=creds,
        tags_client=tags,
        endpoint=f"http://{oci_server.host}",
        session=session,
        retry=FAST,
        lock_dir=tmp_path,
    )
    blob = reg.put_blob(b"exe")
    doc = {"build_id": "b-1", "weights": {"blob": {"digest": blob, "size": 3, "media_type": "application/x-exe"}}}
    digest, created = reg.put_build("b-1", json.dumps(doc).encode())
    assert created and reg.put_build("b-1", b"{}") == (digest, False)
    entry = reg.move_channel("prod", reg.resolve("b"), expected_digest=None, action="promote", who="t", reason="r")
    assert reg.resolve("prod").digest == digest and entry.sequence == 1
    reg.update_record("gate-results", "b-1", lambda old: b"ok")
    assert reg.get_record("gate-results", "b-1") == b"ok" and reg.list_records("gate-results") == ["b-1"]
    assert [b.build_id for b in reg.list_builds()] == ["b-1"]
    assert json.loads(reg.get_manifest_bytes(digest)) == doc
    assert session.auth_seen and set(session.auth_seen) == {"Bearer tok-a"}
    assert set(tags.parents) == {parse_gar_uri(uri).package_name}
