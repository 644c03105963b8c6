"""HTTP to one OCI repository: retries, bounded reads, TLS, and an auth strategy.

* Transient failures (HTTP 5xx, 429, connection errors and timeouts, a body cut off mid-way;
  distribution answers 500 to tag reads that race with tag writes) are retried as urllib3's
  ``Retry`` decides (jittered exponential backoff; a ``Retry-After`` honoured up to a bound);
  after the last attempt a :class:`RegistryError` names the host, the operation and the last
  status. The loop stays here because a streamed body can break after the headers, which
  urllib3 cannot resend, and the session may be any requests-compatible one.
* A 401 is handed to the auth strategy (:mod:`._auth`) once per request; if it can answer the
  challenge, the request is sent again at once. A 401 to a request that went out before another
  one (a parallel blob of a copy) had the strategy answer the challenge is sent again with what
  the strategy gives now, not taken as refused credentials. A 401 after that, or a 403, is a RegistryError
  with the strategy's explanation (which credentials, refused how). Never retried blindly.
* A TLS failure (an untrusted certificate, a missing CA file) is a RegistryError that says
  which CA was used and how to give another; it is not retried.
* Bodies are read at most to a bound + 1 byte, so an overlong body is detected without reading it.
* Authorization goes to the repository's own host only, never to a host a redirect or a
  ``Location`` header names (a blob store behind the registry).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urljoin, urlsplit

from ...errors import RegistryError
from ._auth import AnonymousAuth, Auth
from ._location import CA_ENV, OciLocation

if TYPE_CHECKING:  # urllib3 loads with requests, on the first request
    from urllib3.util.retry import Retry

__all__ = ["RetryPolicy", "Reply", "Transport", "HttpSession", "HttpResponse", "registry_errors", "ERROR_BODY"]

ERROR_BODY = 16 << 10
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
POOL_SIZE = 32  # connections kept per host: the node cache's pulls and the loader's readers at once


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before calling the registry unreachable: the settings of urllib3's ``Retry``.

    ``attempts`` counts every try of one request (so 4 = the first try and 3 retries); the first
    retry goes at once, the next after 2 x ``base_delay``, then twice as long each time up to
    ``max_delay``, each with up to ``base_delay`` of jitter so a fleet of pods does not retry in
    lockstep. A ``Retry-After`` the registry sends (429, 503) is waited instead, at most
    ``max_retry_after`` seconds.
    """

    attempts: int = 4
    base_delay: float = 0.25
    max_delay: float = 4.0
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_retry_after: int = 30

    def urllib3(self) -> Retry:
        """A fresh urllib3 ``Retry`` for one request: every method (uploads are sessions and blobs
        are content-addressed, so a resend is safe), no redirects, the last answer returned."""
        # Lazy (heavy): urllib3 loads with requests, when an oci:// store first talks HTTP.
        from urllib3.util.retry import Retry

        return Retry(
            total=max(0, self.attempts - 1),
            redirect=0,
            status_forcelist=RETRY_STATUS,
            allowed_methods=None,
            backoff_factor=self.base_delay,
            backoff_max=self.max_delay,
            backoff_jitter=self.base_delay,
            retry_after_max=int(self.max_retry_after),
            raise_on_status=False,
        )


@dataclass
class Reply:
    """What one HTTP exchange returned; the body is already read (bounded)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str
    sent_auth: str | None = None  # the Authorization header the request carried (None: none)

    def get_redirect_location(self) -> bool:  # what urllib3's Retry asks of an answer
        return False


class HttpResponse(Protocol):
    """What the transport reads of an answer (a ``requests.Response`` is one)."""

    status_code: int
    headers: Mapping[str, str]
    url: str

    def iter_content(self, chunk_size: int) -> Iterator[bytes]: ...
    def close(self) -> None: ...


class HttpSession(Protocol):
    """What the transport sends requests through: a ``requests.Session``, or
    the tests' ``MemoryDistribution``, a distribution registry held in memory."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> HttpResponse: ...


def registry_errors(body: bytes) -> str:
    """The ``errors`` list of an OCI error body as ``CODE: message`` text, if there is one."""
    try:
        doc = json.loads(body)
        parts = [f"{e.get('code', '?')}: {e.get('message', '')}".strip() for e in doc.get("errors", [])]
        return "; ".join(parts)
    except (ValueError, AttributeError, TypeError):
        return body[:200].decode("utf-8", "replace").strip()


def _short(e: BaseException) -> str:
    text = str(e)
    return text if len(text) <= 300 else text[:300] + "..."


def iter_bounded(resp: HttpResponse, limit: int) -> Iterator[bytes]:
    """The chunks of a streamed body, at most ``limit`` + 1 bytes in all: enough to tell 'too long' apart."""
    want = limit + 1
    got = 0
    for chunk in resp.iter_content(chunk_size=min(1 << 20, max(want, 1))):
        if not chunk:
            continue
        chunk = chunk[: want - got]
        got += len(chunk)
        yield chunk
        if got >= want:
            break


def read_bounded(resp: HttpResponse, limit: int) -> bytes:
    """Read at most ``limit`` + 1 bytes of a streamed body."""
    return b"".join(iter_bounded(resp, limit))


def next_link(link: str | None, root: str) -> str | None:
    """The ``rel="next"`` target of a ``Link`` header (tag list pagination), absolute."""
    if not link:
        return None
    for part in link.split(","):
        target, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", "") or "rel=next" in params.replace(" ", ""):
            url = target.strip().strip("<>")
            absolute = urljoin(root + "/", url)
            if urlsplit(absolute).netloc != urlsplit(root).netloc:
                return None  # never follow a pagination link to another host
            return absolute
    return None


class Transport:
    """Requests to one repository's host, with retries, bounded reads, TLS settings and auth."""

    def __init__(
        self,
        location: OciLocation,
        *,
        session: HttpSession | None = None,
        retry: RetryPolicy | None = None,
        auth: Auth | None = None,
    ):
        self.location = location
        self.retry = retry or RetryPolicy()
        self.auth: Auth = auth or AnonymousAuth()
        self._session = session
        self._mutex = threading.Lock()
        self.requests = 0  # every HTTP request sent, retries and token fetches included (measurements)

    def where(self) -> str:
        return f"registry {self.location.host}/{self.location.repo}"

    def session(self) -> HttpSession:
        """The HTTP session (requests-compatible); created on first use, never at import."""
        with self._mutex:
            if self._session is None:
                # Lazy (heavy): requests loads only when an oci:// store first talks HTTP.
                import requests
                from requests.adapters import HTTPAdapter

                session = requests.Session()
                for scheme in ("http://", "https://"):  # side-by-side pulls (node cache, weights) keep theirs
                    session.mount(scheme, HTTPAdapter(pool_maxsize=POOL_SIZE))
                self._session = cast(HttpSession, session)  # a Session has this surface
            return self._session

    def verify(self) -> str | bool:
        verify = self.location.verify()
        if isinstance(verify, str) and not os.path.isfile(verify):
            source = "?ca= in the registry URI" if verify == self.location.ca else CA_ENV
            raise RegistryError(f"{self.where()}: the CA file {verify} (from {source}) does not exist")
        return verify

    def scope(self, method: str) -> str:
        """The token scope a request needs: reads pull, writes pull and push."""
        actions = "pull" if method in ("GET", "HEAD") else "pull,push"
        return f"repository:{self.location.repo}:{actions}"

    def call(
        self,
        op: str,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        limit: int = ERROR_BODY,
        sink: Callable[[Iterator[bytes]], None] | None = None,
    ) -> Reply:
        """One request, retried on 5xx/429 and connection failures; reads at most limit+1 bytes.

        With ``sink``, a 2xx body is not held: ``sink(chunks)`` consumes it as it arrives (at most
        ``limit`` + 1 bytes) and is called afresh if the request is retried, so it must start over.
        """
        # Lazy (heavy): requests loads only when an oci:// store first talks HTTP.
        import requests

        transient = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
        scope, retry, reauthed = self.scope(method), self.retry.urllib3(), False
        while True:
            try:
                reply = self._exchange(method, url, headers, data, limit, scope, sink)
            except requests.exceptions.SSLError as e:
                raise self._tls_error(op, e) from None
            except transient as e:
                retry = self._again(retry, op, method, url, error=e)
                continue
            except requests.RequestException as e:
                raise RegistryError(f"{self.where()}: {op} failed ({type(e).__name__}: {_short(e)})") from None
            if retry.is_retry(method, reply.status, "Retry-After" in reply.headers):
                retry = self._again(retry, op, method, url, reply=reply)
                continue
            if (
                reply.status == 401
                and not reauthed
                and (self._stale_auth(url, reply, scope) or self.auth.challenged(reply, scope))
            ):
                reauthed = True  # answering a challenge is not a failed attempt
                continue
            if reply.status in (401, 403):
                raise RegistryError(
                    f"{self.where()}: {op} was refused (HTTP {reply.status}: "
                    f"{registry_errors(reply.body) or 'no detail'}); {self.auth.refused(reply, scope)}"
                )
            return reply

    def _again(
        self,
        retry: Retry,
        op: str,
        method: str,
        url: str,
        *,
        error: Exception | None = None,
        reply: Reply | None = None,
    ) -> Retry:
        """The ``Retry`` for the next try, once its wait is over; RegistryError when none is left."""
        from urllib3.exceptions import InvalidHeader, MaxRetryError

        try:
            retry = retry.increment(method, url, response=cast(Any, reply), error=error)
        except MaxRetryError:
            if error is not None:
                last = f"{type(error).__name__}: {_short(error)}"
            else:
                assert reply is not None  # a retry is for an error or an answer
                last = f"HTTP {reply.status}" + (f" ({registry_errors(reply.body)})" if reply.body else "")
            raise RegistryError(
                f"{self.where()}: {op} failed after {self.retry.attempts} attempt(s), last: {last}; "
                f"check that {self.location.root} is up and reachable from here, then retry"
            ) from None
        try:
            retry.sleep(cast(Any, reply))
        except InvalidHeader:  # a Retry-After that is neither seconds nor a date: back off instead
            retry.sleep()
        return retry

    def _stale_auth(self, url: str, reply: Reply, scope: str) -> bool:
        """Whether a 401 answers other credentials than the strategy gives now: the request went out
        while another request (in another thread) was answering the registry's first challenge, so
        it carried none (or an older token). Sent again with the current ones, as its own first try;
        only a 401 to what the strategy gives now is refused credentials."""
        if urlsplit(url).netloc != self.location.host:
            return False
        now = self.auth.headers(scope).get("Authorization")
        return now is not None and now != reply.sent_auth

    def _tls_error(self, op: str, e: Exception) -> RegistryError:
        verify = self.location.verify()
        using = f"the CA file {verify}" if isinstance(verify, str) else "the system CAs"
        return RegistryError(
            f"{self.where()}: {op}: TLS verification of {self.location.host} failed with {using} "
            f"({_short(e)}); if the registry uses a private CA, give its certificate with "
            f"{CA_ENV}=PATH or oci://{self.location.host}/{self.location.repo}?ca=PATH"
        )

    def _exchange(
        self,
        method: str,
        url: str,
        headers: dict | None,
        data: bytes | None,
        limit: int,
        scope: str,
        sink: Callable[[Iterator[bytes]], None] | None = None,
    ) -> Reply:
        # Credentials go to this registry's host only, never to a host a Location header names.
        own = urlsplit(url).netloc == self.location.host
        hdrs = {**(self.auth.headers(scope) if own else {}), **(headers or {})}
        timeout = (self.retry.connect_timeout, self.retry.read_timeout)
        self.requests += 1
        resp = self.session().request(
            method, url, headers=hdrs, data=data, stream=True, timeout=timeout, verify=self.verify()
        )
        try:
            # Error bodies are read for their message up to a small bound, whatever ``limit`` is.
            ok = 200 <= resp.status_code < 300
            if ok and sink is not None and method != "HEAD":
                sink(iter_bounded(resp, limit))
                return Reply(
                    resp.status_code, resp.headers, b"", str(getattr(resp, "url", url)), hdrs.get("Authorization")
                )
            bound = limit if ok else ERROR_BODY
            body = b"" if method == "HEAD" else read_bounded(resp, bound)
            return Reply(
                resp.status_code, resp.headers, body, str(getattr(resp, "url", url)), hdrs.get("Authorization")
            )
        finally:
            resp.close()

    def fetch_token(self, url: str, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        """A GET to a token realm (the auth strategy's), with this transport's TLS settings."""
        # Lazy (heavy): requests loads only when an oci:// store first talks HTTP.
        import requests

        timeout = (self.retry.connect_timeout, self.retry.read_timeout)
        self.requests += 1
        try:
            resp = self.session().request(
                "GET", url, headers=headers, stream=True, timeout=timeout, verify=self.verify(), allow_redirects=False
            )
        except requests.exceptions.SSLError as e:
            raise self._tls_error(f"token request to {urlsplit(url).netloc}", e) from None
        except requests.RequestException as e:
            raise RegistryError(
                f"{self.where()}: the token server {url.split('?')[0]} is unreachable ({type(e).__name__}: {_short(e)})"
            ) from None
        try:
            return resp.status_code, resp.headers, read_bounded(resp, 1 << 20)
        finally:
            resp.close()

    def fail(self, op: str, reply: Reply) -> RegistryError:
        detail = registry_errors(reply.body) or "no detail"
        return RegistryError(f"{self.where()}: {op} failed with HTTP {reply.status} ({detail})")
