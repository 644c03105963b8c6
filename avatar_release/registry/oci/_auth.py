"""Logging in to a registry the way container tools do, as strategies the transport calls.

Where credentials come from (first match wins), for the registry's ``HOST[:PORT]``:

1. ``$REGISTRY_AUTH_FILE`` (podman, skopeo, buildah), else ``$XDG_RUNTIME_DIR/containers/auth.json``;
2. ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``.

In each file: ``credHelpers[HOST]`` names a helper; else ``auths[HOST]`` (``auth`` =
base64 ``user:password``, or ``username`` + ``password``; keys may carry a scheme or a path,
as ``docker login`` writes them); else ``credsStore`` names a helper for every host. A helper
``NAME`` is the program ``docker-credential-NAME``, run as ``docker-credential-NAME get`` with
the host on stdin; it answers ``{"Username": ..., "Secret": ...}`` (the docker-credential-helpers
protocol) or exits non-zero with ``credentials not found``. Identity tokens (``identitytoken``,
or a helper's ``<token>`` user: OAuth2 refresh tokens) are not supported and say so.

How they are used is the registry's choice, read from its ``WWW-Authenticate`` challenge:

* ``Basic``: the credentials on every request to the registry's host (after the first challenge);
* ``Bearer realm=...,service=...,scope=...`` (the distribution token flow): a GET to the realm
  with ``service`` and ``scope``, with the credentials as Basic auth when there are any
  (anonymous otherwise, for public pulls); the token (``token`` or ``access_token``) is cached
  per scope until ``expires_in`` (60 s when absent) less a margin, and fetched again on expiry
  or when the registry answers 401 to it. Reads ask for ``repository:REPO:pull``, writes for
  ``repository:REPO:pull,push``, so a reader never needs push rights.

Credentials and tokens go to the registry's own host only (never to a host a redirect names);
the credentials also go to the token realm the registry names, but only over HTTPS or to a
loopback address, never in clear text across a network.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

from ...errors import RegistryError
from ._location import LOCAL_HOSTS, hostname_of

__all__ = [
    "Auth",
    "Credentials",
    "Challenge",
    "AnonymousAuth",
    "TokenAuth",
    "LoginAuth",
    "find_credentials",
    "parse_challenge",
    "auth_files",
]

TOKEN_MARGIN_S = 10.0  # a token this close to expiry is fetched again rather than risked
DEFAULT_TOKEN_LIFETIME_S = 60.0  # the distribution token spec's default for a missing expires_in
HELPER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str  # where they came from, for messages ("/home/u/.docker/config.json auths", "helper pass")

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def parse_challenge(header: str | None) -> Challenge | None:
    """``Bearer realm="r",service="s",scope="a,b"`` -> Challenge; quoted values may hold commas."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " ,":
            i += 1
        eq = rest.find("=", i)
        if eq < 0:
            break
        key = rest[i:eq].strip().lower()
        i = eq + 1
        if i < n and rest[i] == '"':
            end = i + 1
            value = []
            while end < n and rest[end] != '"':
                if rest[end] == "\\" and end + 1 < n:
                    end += 1
                value.append(rest[end])
                end += 1
            params[key] = "".join(value)
            i = end + 1
        else:
            end = rest.find(",", i)
            end = n if end < 0 else end
            params[key] = rest[i:end].strip()
            i = end
    return Challenge(scheme.lower(), params)


# ---- where credentials come from ----------------------------------------------------------------
def auth_files() -> list[Path]:
    """The login files looked at, in order (whether or not they exist)."""
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    elif os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    docker = Path(os.environ["DOCKER_CONFIG"]) if os.environ.get("DOCKER_CONFIG") else Path.home() / ".docker"
    out.append(docker / "config.json")
    return out


def _key_host(key: str) -> str:
    """An ``auths`` key as docker writes it (``https://host:5000/v1/``, ``host:5000``) -> ``host:5000``."""
    if "://" in key:
        key = urlsplit(key).netloc
    return key.split("/", 1)[0].lower()


def _run_helper(name: str, host: str, where: str) -> Credentials | None:
    exe = shutil.which(f"docker-credential-{name}")
    if exe is None:
        raise RegistryError(
            f"registry {host}: {where} names the credential helper {name!r}, but docker-credential-{name} is "
            "not on PATH; install it or remove it from that file"
        )
    try:
        done = subprocess.run([exe, "get"], input=host.encode(), capture_output=True, timeout=HELPER_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RegistryError(f"registry {host}: credential helper {exe} failed to run ({e})") from None
    out = (done.stdout or b"").decode("utf-8", "replace").strip()
    if done.returncode != 0:
        text = (out + " " + (done.stderr or b"").decode("utf-8", "replace")).strip()
        if "credentials not found" in text.lower():
            return None
        raise RegistryError(
            f"registry {host}: credential helper {exe} exited with {done.returncode}: {text[:300] or 'no output'}"
        )
    try:
        doc = json.loads(out)
        user, secret = doc["Username"], doc["Secret"]
    except (ValueError, KeyError, TypeError):
        raise RegistryError(
            f"registry {host}: credential helper {exe} did not answer JSON with Username and Secret (got {out[:80]!r})"
        ) from None
    if user == "<token>":
        raise RegistryError(
            f"registry {host}: credential helper {exe} gave an identity token (OAuth2 refresh token), which "
            "avatar-release does not support; log in with a user name and password or access token"
        )
    return Credentials(str(user), str(secret), f"credential helper docker-credential-{name}")


def _from_file(path: Path, host: str) -> Credentials | None:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RegistryError(f"registry {host}: cannot read the login file {path} ({e}); fix or remove it") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"registry {host}: the login file {path} is not a JSON object")
    helpers = doc.get("credHelpers") or {}
    for key, name in helpers.items():
        if _key_host(key) == host:
            return _run_helper(str(name), host, f"{path} credHelpers")
    for key, entry in (doc.get("auths") or {}).items():
        if _key_host(key) != host or not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            raise RegistryError(
                f"registry {host}: {path} holds an identity token (OAuth2 refresh token) for it, which "
                "avatar-release does not support; log in with a user name and password or access token"
            )
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                sep = ""
            if not sep:
                raise RegistryError(f"registry {host}: the auth entry for it in {path} is not base64 'user:password'")
            return Credentials(user, password, f"{path} auths")
        if entry.get("username") and entry.get("password"):
            return Credentials(str(entry["username"]), str(entry["password"]), f"{path} auths")
    if doc.get("credsStore"):
        return _run_helper(str(doc["credsStore"]), host, f"{path} credsStore")
    return None


def find_credentials(host: str) -> Credentials | None:
    """The credentials container tools would use for ``host`` (``HOST[:PORT]``), or None."""
    host = host.lower()
    for path in auth_files():
        creds = _from_file(path, host)
        if creds is not None:
            return creds
    return None


# ---- strategies -------------------------------------------------------------------------------------
class Auth(Protocol):
    """What the transport asks of an authentication strategy.

    ``headers(scope)`` before each request to the registry's host; after a 401,
    ``challenged(reply, scope)`` returns True when a retry may now succeed (new credentials or a
    fresh token), at most once per request; ``refused(reply, scope)`` is the message for a
    request that was refused anyway (401 after that retry, or 403).
    """

    def headers(self, scope: str) -> dict[str, str]: ...
    def challenged(self, reply: Any, scope: str) -> bool: ...
    def refused(self, reply: Any, scope: str) -> str: ...


class AnonymousAuth:
    """No credentials: for registries that need none."""

    def headers(self, scope: str) -> dict[str, str]:
        return {}

    def challenged(self, reply: Any, scope: str) -> bool:
        return False

    def refused(self, reply: Any, scope: str) -> str:
        return "this registry needs credentials, and none were configured"


class TokenAuth:
    """A bearer token from a provider (``() -> str``) on every request: Google access tokens for GAR."""

    def __init__(self, token: Callable[[], str], hint: str):
        self._token, self._hint = token, hint

    def headers(self, scope: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token()}"}

    def challenged(self, reply: Any, scope: str) -> bool:
        return False

    def refused(self, reply: Any, scope: str) -> str:
        return self._hint


@dataclass
class _Token:
    value: str
    expires_at: float  # time.monotonic()


class LoginAuth:
    """Basic or bearer-token auth, as the registry's challenge asks, with the container tools' logins.

    ``fetch(url, headers) -> (status, headers, body)`` performs the token GET through the
    transport's session (same TLS settings); ``credentials`` replaces the lookup in the login files.
    """

    def __init__(
        self,
        host: str,
        fetch: Callable[[str, dict[str, str]], tuple[int, Any, bytes]],
        credentials: Credentials | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.host = host
        self._fetch, self._clock = fetch, clock
        self._creds: Credentials | None = credentials
        self._looked = credentials is not None
        self._mode: str | None = None  # None until the registry challenges: "basic" or "bearer"
        self._realm: str | None = None
        self._service: str | None = None
        self._tokens: dict[str, _Token] = {}
        self._mutex = threading.Lock()
        self.token_fetches = 0  # how many times a token was asked for (tests, measurements)

    # credentials are looked up on the first challenge, never for a registry that asks for none
    def credentials(self) -> Credentials | None:
        if not self._looked:
            self._creds = find_credentials(self.host)
            self._looked = True
        return self._creds

    def _who(self) -> str:
        c = self._creds
        return f"user {c.username!r} (from {c.source})" if c else "no credentials"

    def _no_credentials(self) -> str:
        files = ", ".join(str(p) for p in auth_files())
        return (
            f"this registry needs credentials and none were found for {self.host} (looked in {files}); "
            f"log in with `docker login {self.host}` (or podman/skopeo login), or set DOCKER_CONFIG or "
            "REGISTRY_AUTH_FILE to a login file that has them"
        )

    def headers(self, scope: str) -> dict[str, str]:
        with self._mutex:
            if self._mode == "basic" and self._creds is not None:
                return {"Authorization": self._creds.basic()}
            if self._mode == "bearer":
                token = self._tokens.get(scope)
                if token is None or token.expires_at - TOKEN_MARGIN_S <= self._clock():
                    token = self._new_token(scope)
                return {"Authorization": f"Bearer {token.value}"}
            return {}

    def challenged(self, reply: Any, scope: str) -> bool:
        challenge = parse_challenge(reply.headers.get("WWW-Authenticate"))
        if challenge is None:
            return False
        with self._mutex:
            if challenge.scheme == "basic":
                if self._mode == "basic":
                    return False  # the credentials were sent and refused
                if self.credentials() is None:
                    raise RegistryError(f"registry {self.host}: {self._no_credentials()}")
                self._mode = "basic"
                return True
            if challenge.scheme == "bearer" and challenge.params.get("realm"):
                self._mode = "bearer"
                self._realm, self._service = challenge.params["realm"], challenge.params.get("service")
                self._tokens.pop(scope, None)  # refused: expired at the server, or for another scope
                self._new_token(scope, challenge.params.get("scope"))
                return True
            return False

    def refused(self, reply: Any, scope: str) -> str:
        challenge = parse_challenge(reply.headers.get("WWW-Authenticate"))
        error = (challenge.params.get("error") if challenge else None) or ""
        if reply.status == 403 or error == "insufficient_scope":
            if self._mode == "bearer" and self._creds is None:
                return self._no_credentials() + " (an anonymous token was not enough)"
            return f"{self._who()} is not allowed {scope} here; ask the registry's administrators for access"
        if self._mode == "basic":
            return (
                f"the registry refused the credentials of {self._who()}: wrong user name or password; "
                f"log in again with `docker login {self.host}`"
            )
        if self._mode == "bearer" and self._creds is None:
            return self._no_credentials() + " (an anonymous token was refused)"
        if self._mode == "bearer":
            return (
                f"the registry refused a token just issued by {self._realm} for {scope}"
                f"{f' ({error})' if error else ''}: it was expired on arrival or not valid for this "
                "registry (check the clocks of the token server and the registry, and the service name); "
                f"credentials: {self._who()}"
            )
        return (
            self._no_credentials()
            if self.credentials() is None
            else (f"the registry refused {self._who()} without saying how to authenticate")
        )

    # the distribution token flow -------------------------------------------------------------------
    def _new_token(self, scope: str, challenge_scope: str | None = None) -> _Token:
        realm = self._realm or ""
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise RegistryError(f"registry {self.host}: its token realm {realm!r} is not an http(s) URL")
        creds = self.credentials()
        headers: dict[str, str] = {}
        if creds is not None:
            if parts.scheme != "https" and hostname_of(parts.netloc) not in LOCAL_HOSTS:
                raise RegistryError(
                    f"registry {self.host}: its token realm {realm} is plain HTTP on another host; refusing to "
                    "send credentials there in clear text (the token server must use HTTPS)"
                )
            headers["Authorization"] = creds.basic()
        scopes = sorted({scope} | ({challenge_scope} if challenge_scope and challenge_scope != scope else set()))
        query = [("service", self._service)] if self._service else []
        query += [("scope", s) for s in scopes]
        url = realm + ("&" if "?" in realm else "?") + urlencode(query)
        self.token_fetches += 1
        status, _, body = self._fetch(url, headers)
        if status in (401, 403):
            why = (
                "wrong user name or password" if creds else "anonymous access is not allowed: " + self._no_credentials()
            )
            raise RegistryError(
                f"registry {self.host}: the token server {realm} refused {self._who()} for {scope} "
                f"(HTTP {status}): {why}"
            )
        if status != 200:
            raise RegistryError(f"registry {self.host}: the token server {realm} answered HTTP {status} for {scope}")
        try:
            doc = json.loads(body)
            value = doc.get("token") or doc.get("access_token")
            lifetime = float(doc.get("expires_in") or DEFAULT_TOKEN_LIFETIME_S)
        except (ValueError, AttributeError, TypeError):
            value, lifetime = None, 0.0
        if not isinstance(value, str) or not value:
            raise RegistryError(f"registry {self.host}: the token server {realm} answered without a token")
        token = _Token(value, self._clock() + lifetime)
        self._tokens[scope] = token
        return token
