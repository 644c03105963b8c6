"""Google Artifact Registry: ``gar://projects/P/locations/L/repositories/R[/packages/IMAGE]``.

A thin configuration of the OCI client (:mod:`.oci`: a location and a Google access-token auth strategy): builds, channels, history and
records are laid out exactly as there, in the Docker-format repository ``R`` under the
image ``IMAGE`` (default ``avatar-release``), i.e. at
``https://L-docker.pkg.dev/v2/P/R/IMAGE/...``. What differs:

* every request to ``L-docker.pkg.dev`` carries ``Authorization: Bearer <token>``, the
  access token of the Google application-default credentials (``google.auth.default``),
  refreshed when it expires. ``google.auth`` is imported on the first request, never at
  import time; it comes with the ``[gar]`` extra (``google-cloud-artifact-registry``);
* tag listings (``ls``, prefix resolution, record names) go through the Artifact Registry
  API (``google.cloud.artifactregistry_v1.ArtifactRegistryClient.list_tags``) when that
  library is installed, and through the OCI ``tags/list`` endpoint otherwise. Listings only
  enumerate names: what a tag points at is always read through the OCI endpoint.

The channel compare-and-swap has the same limits as with any OCI registry (a writer lock
per machine plus read-back verification; see :mod:`.oci._registry`). Artifact Registry's own IAM is
the access control: readers need ``roles/artifactregistry.reader``, publishers and
promoters ``roles/artifactregistry.writer`` on the repository.

Testing: no Google Cloud endpoint is reachable from the machines this project is tested
on, so the tests check everything up to the wire (URI parsing and its errors, the URLs
built, the Authorization header sent, the API requests made, token refresh, and a clear
RegistryError for an unreachable endpoint) with a fake credentials object, a fake tags
client and an injected HTTP session, and run the full registry behaviour through the same
code against a local OCI registry standing in for ``L-docker.pkg.dev``. It has not been
run against Artifact Registry itself.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from ..errors import InputError, RegistryError
from .oci import OciLocation, OciRegistry, RetryPolicy, TokenAuth

__all__ = ["GarRegistry", "GarLocation", "parse_gar_uri"]

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_PACKAGE = "avatar-release"
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_LOCATION_RE = re.compile(r"^[a-z]+(?:-[a-z]+[0-9]+)?$")
_REPOSITORY_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_PACKAGE_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_FORM = "gar://projects/PROJECT/locations/LOCATION/repositories/REPOSITORY[/packages/IMAGE]"


@dataclass(frozen=True)
class GarLocation:
    project: str
    location: str
    repository: str
    package: str = DEFAULT_PACKAGE

    @property
    def repository_name(self) -> str:
        """The Artifact Registry resource name of the repository."""
        return f"projects/{self.project}/locations/{self.location}/repositories/{self.repository}"

    @property
    def package_name(self) -> str:
        """The resource name of the package (image); '/' in an image name is %2F there."""
        return f"{self.repository_name}/packages/{quote(self.package, safe='')}"

    @property
    def host(self) -> str:
        return f"{self.location}-docker.pkg.dev"

    @property
    def oci_repo(self) -> str:
        return f"{self.project}/{self.repository}/{self.package}"


def _check(kind: str, value: str, pattern: re.Pattern, rule: str, uri: str) -> str:
    if not pattern.match(value):
        raise InputError(f"registry {uri!r}: invalid {kind} {value!r}: expected {rule}; form: {_FORM}")
    return value


def parse_gar_uri(uri: str) -> GarLocation:
    """Parse and validate a ``gar://`` URI; InputError naming the faulty part otherwise."""
    if not isinstance(uri, str) or not uri.startswith("gar://"):
        raise InputError(f"registry {uri!r}: expected {_FORM}")
    rest = uri.removeprefix("gar://")
    if any(c in rest for c in "?#@ \\:"):
        raise InputError(f"registry {uri!r}: no query, fragment, port or credentials allowed; form: {_FORM}")
    parts = rest.rstrip("/").split("/")
    keys = ("projects", "locations", "repositories")
    if len(parts) < 6 or tuple(parts[0:6:2]) != keys or (len(parts) > 6 and (len(parts) < 8 or parts[6] != "packages")):
        raise InputError(f"registry {uri!r}: expected {_FORM}")
    project = _check(
        "project",
        parts[1],
        _PROJECT_RE,
        "6-30 lowercase letters, digits or '-', starting with a letter (domain-scoped projects are not supported)",
        uri,
    )
    location = _check(
        "location", parts[3], _LOCATION_RE, "a region such as us-central1 or a multi-region such as us", uri
    )
    repository = _check(
        "repository",
        parts[5],
        _REPOSITORY_RE,
        "lowercase letters, digits and '-', starting with a letter, at most 63 characters",
        uri,
    )
    package = "/".join(parts[7:]) or DEFAULT_PACKAGE
    _check("image", package, _PACKAGE_RE, "lowercase path components such as avatar-release or team/avatar", uri)
    return GarLocation(project, location, repository, package)


class GoogleToken:
    """The bearer token of Google credentials: an injected provider's, or the credentials' (refreshed
    when stale), application-default ones unless given. ``google.auth`` is imported on first use."""

    def __init__(self, where: str, credentials: Any = None, provider: Callable[[], str] | None = None):
        self.where, self.credentials, self.provider = where, credentials, provider
        self._mutex = threading.Lock()

    def google_credentials(self) -> Any:
        if self.credentials is None:
            try:
                # Lazy (gar extra): the Artifact Registry client loads only for gar:// stores.
                import google.auth
                import google.auth.exceptions
            except ImportError:
                raise RegistryError(
                    f"{self.where}: the Artifact Registry backend needs google-auth; "
                    "install it with: pip install 'avatar-release[gar]'"
                ) from None
            try:
                self.credentials, _ = google.auth.default(scopes=[SCOPE])
            except google.auth.exceptions.DefaultCredentialsError as e:
                raise RegistryError(
                    f"{self.where}: no Google credentials found ({str(e).splitlines()[0]}); run "
                    "`gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS, or run "
                    "with a service account"
                ) from None
        return self.credentials

    def __call__(self) -> str:
        if self.provider is not None:
            return self.provider()
        creds = self.google_credentials()
        with self._mutex:
            if not getattr(creds, "valid", False) or not getattr(creds, "token", None):
                try:
                    creds.refresh(_auth_request())
                except RegistryError:
                    raise
                except Exception as e:  # google.auth's RefreshError / TransportError and friends
                    raise RegistryError(
                        f"{self.where}: could not get a Google access token ({type(e).__name__}: {e}); "
                        "check `gcloud auth application-default print-access-token` works here"
                    ) from None
            token = creds.token
        if not token:
            raise RegistryError(f"{self.where}: the Google credentials gave an empty access token")
        return token


class GarTags:
    """Tag listing through the Artifact Registry API (``list_tags``), or None to use the OCI endpoint
    (without the library, or with only a bearer token)."""

    def __init__(self, gar: GarLocation, where: str, token: GoogleToken, client: Any, hint: str):
        self.gar, self.where, self.token, self.client, self.hint = gar, where, token, client, hint

    def _client(self) -> Any | None:
        if self.client is None:
            if self.token.credentials is None and self.token.provider is not None:
                return None  # only a bearer token: list over the OCI endpoint with it
            try:
                # Lazy (gar extra): the Artifact Registry client loads only for gar:// stores.
                from google.cloud import artifactregistry_v1
            except ImportError:
                return None
            self.client = artifactregistry_v1.ArtifactRegistryClient(credentials=self.token.google_credentials())
        return self.client

    def __call__(self) -> list[str] | None:
        client = self._client()
        if client is None:
            return None
        parent = self.gar.package_name
        try:
            names = [t.name for t in client.list_tags(request={"parent": parent, "page_size": 1000})]
        except Exception as e:
            if type(e).__name__ == "NotFound":  # google.api_core.exceptions.NotFound: nothing pushed yet
                return []
            raise RegistryError(
                f"{self.where}: listing tags of {parent} through the Artifact Registry API failed "
                f"({type(e).__name__}: {e}); " + self.hint
            ) from None
        prefix = f"{parent}/tags/"
        return [n.removeprefix(prefix) for n in names if n.startswith(prefix)]


class GarRegistry(OciRegistry):
    """The OCI client configured for Artifact Registry: its location, a Google access-token auth
    strategy (:class:`GoogleToken`) and its tags API (:class:`GarTags`); nothing else differs.

    ``credentials`` (a google.auth Credentials: ``valid``, ``token``, ``refresh(request)``)
    or ``token_provider`` (``() -> str``) replace the application-default credentials;
    ``tags_client`` replaces the ``ArtifactRegistryClient`` (``list_tags(request=...)``);
    ``endpoint`` (``scheme://host[:port]``) replaces ``https://L-docker.pkg.dev``.
    """

    def __init__(
        self,
        uri: str,
        *,
        credentials: Any = None,
        token_provider: Callable[[], str] | None = None,
        tags_client: Any = None,
        endpoint: str | None = None,
        session: Any = None,
        retry: RetryPolicy | None = None,
        lock_dir: str | None = None,
        lock_timeout: float = 120.0,
    ):
        self.gar = gar = parse_gar_uri(uri)
        location = _endpoint_location(endpoint, gar) if endpoint else OciLocation("https", gar.host, gar.oci_repo)
        where = f"registry {location.host}/{location.repo}"
        hint = (
            f"grant this identity roles/artifactregistry.reader (to load) or roles/artifactregistry.writer "
            f"(to publish and promote) on {gar.repository_name}, and check the credentials in use with "
            "`gcloud auth application-default print-access-token`"
        )
        token = GoogleToken(where, credentials, token_provider)
        super().__init__(
            uri,
            session=session,
            retry=retry,
            lock_dir=lock_dir,
            lock_timeout=lock_timeout,
            location=location,
            auth=TokenAuth(token, hint),
            tag_lister=GarTags(gar, where, token, tags_client, hint),
        )


def _endpoint_location(endpoint: str, gar: GarLocation) -> OciLocation:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise InputError(f"GAR endpoint {endpoint!r}: expected scheme://host[:port], e.g. https://us-docker.pkg.dev")
    return OciLocation(parts.scheme, parts.netloc, gar.oci_repo)


def _auth_request() -> Any:
    # Lazy (gar extra): the Artifact Registry client loads only for gar:// stores.
    from google.auth.transport.requests import Request

    return Request()
