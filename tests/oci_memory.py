"""A distribution registry held in memory, behind the HTTP session the transport talks to.

As httpx ships a mock transport, the tests keep a registry to run against without a network
(here, not in the wheel: only tests use it).
``OciRegistry("oci+http://registry.test/team/app", session=MemoryDistribution())`` runs every line of the OCI client — tags, manifests, blobs (whole, chunked and resumed),
pagination, referrers with or without the API — against a server that answers as CNCF
distribution does (status codes, ``Docker-Content-Digest``, ``Range``, ``Link``, error codes).
Blobs are shared between the repositories of one server, as distribution keeps them.

``before(method, url, headers, data)`` may answer a request instead of the server (a
:class:`MemoryResponse`), to inject faults; every request is recorded in ``sent``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from avatar_release._digest import is_digest, sha256_digest

__all__ = ["MemoryDistribution", "MemoryResponse", "Before"]

_INDEX = "application/vnd.oci.image.index.v1+json"


class MemoryResponse:
    """An HTTP answer in memory (the :class:`avatar_release.registry.oci.HttpResponse` surface)."""

    def __init__(self, status_code: int, headers: Mapping[str, str] | None = None, body: bytes = b"", url: str = ""):
        self.status_code, self.url = status_code, url
        self.headers = _Headers(headers or {})
        self.content = body

    def iter_content(self, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        for i in range(0, len(self.content), max(1, chunk_size)):
            yield self.content[i : i + chunk_size]

    def close(self) -> None:
        pass


class _Headers(dict):
    """Case-insensitive header lookup, as HTTP wants."""

    def __init__(self, items: Mapping[str, str]):
        super().__init__({k.lower(): v for k, v in items.items()})

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(str(key).lower())


Before = Callable[[str, str, Mapping[str, str], bytes], "MemoryResponse | None"]


@dataclass
class _Repo:
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # digest -> (media type, bytes)
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    return (
        status,
        {"Content-Type": "application/json"},
        json.dumps({"errors": [{"code": code, "message": message}]}).encode(),
    )


class MemoryDistribution:
    """The distribution API in memory: ``referrers_api`` answers ``/referrers`` (OCI 1.1) and
    ``OCI-Subject``; ``page_size`` caps a tag listing page, so pagination is exercised."""

    def __init__(self, *, referrers_api: bool = False, page_size: int = 100, before: Before | None = None):
        self.referrers_api, self.page_size, self.before = referrers_api, page_size, before
        self.blobs: dict[str, bytes] = {}
        self.repos: dict[str, _Repo] = {}
        self.uploads: dict[str, bytearray] = {}
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        self._mutex = threading.Lock()

    def request(self, method: str, url: str, **kwargs: Any) -> MemoryResponse:
        headers = dict(kwargs.get("headers") or {})
        data = bytes(kwargs.get("data") or b"")
        self.sent.append((method, url, headers))
        if self.before is not None:
            canned = self.before(method, url, headers, data)
            if canned is not None:
                return canned
        parts = urlsplit(url)
        with self._mutex:
            status, hdrs, body = self._route(method, unquote(parts.path), parse_qs(parts.query), headers, data)
        return MemoryResponse(status, hdrs, b"" if method == "HEAD" else body, url)

    # ---- routing ----------------------------------------------------------------------------
    def _route(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], data: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if path in ("/v2", "/v2/"):
            return 200, {}, b"{}"
        for marker, handler in (
            ("/blobs/uploads/", self._upload),
            ("/manifests/", self._manifest),
            ("/blobs/", self._blob),
            ("/referrers/", self._referrers),
        ):
            if marker in path:
                repo, _, rest = path.removeprefix("/v2/").partition(marker)
                return handler(method, repo, rest, query, headers, data)
        if path.endswith("/tags/list") and method == "GET":
            return self._tags(path.removeprefix("/v2/").removesuffix("/tags/list"), query)
        return 404, {"Content-Type": "text/plain"}, b"404 page not found"

    def _tags(self, repo: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if repo not in self.repos:
            return _error(404, "NAME_UNKNOWN", "repository name not known to registry")
        n = min(int(query.get("n", [str(self.page_size)])[0]), self.page_size)
        last = query.get("last", [""])[0]
        names = sorted(t for t in self.repos[repo].tags if t > last)
        page, more = names[:n], len(names) > n
        hdrs = {"Content-Type": "application/json"}
        if more:
            hdrs["Link"] = f'</v2/{repo}/tags/list?n={n}&last={page[-1]}>; rel="next"'
        return 200, hdrs, json.dumps({"name": repo, "tags": page}).encode()

    def _blob(
        self, method: str, repo: str, digest: str, query: dict[str, list[str]], headers: dict[str, str], data: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        blob = self.blobs.get(digest)
        if method not in ("GET", "HEAD"):
            return _error(405, "UNSUPPORTED", "the operation is unsupported")
        if blob is None:
            return _error(404, "BLOB_UNKNOWN", "blob unknown to registry")
        return 200, {"Content-Length": str(len(blob)), "Docker-Content-Digest": digest}, blob

    def _upload(
        self, method: str, repo: str, session: str, query: dict[str, list[str]], headers: dict[str, str], data: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if method == "POST" and not session:
            session = uuid.uuid4().hex
            self.uploads[session] = bytearray()
            return 202, {"Location": f"/v2/{repo}/blobs/uploads/{session}", "Range": "0-0"}, b""
        held = self.uploads.get(session)
        if held is None:
            return _error(404, "BLOB_UPLOAD_UNKNOWN", "blob upload unknown to registry")
        where = {"Location": f"/v2/{repo}/blobs/uploads/{session}", "Range": f"0-{len(held) - 1}"}
        if method == "GET":
            return 204, where, b""
        if method == "PATCH":
            start = int(headers.get("Content-Range", f"{len(held)}-").split("-")[0])
            if start != len(held):
                return _error(416, "BLOB_UPLOAD_INVALID", f"range starts at {start}, the upload holds {len(held)}")
            held += data
            return 202, {**where, "Range": f"0-{len(held) - 1}"}, b""
        if method == "PUT":
            held += data
            digest = query.get("digest", [""])[0]
            if sha256_digest(bytes(held)) != digest:
                return _error(400, "DIGEST_INVALID", "provided digest did not match uploaded content")
            self.blobs[digest] = bytes(self.uploads.pop(session))
            return 201, {"Location": f"/v2/{repo}/blobs/{digest}", "Docker-Content-Digest": digest}, b""
        return _error(405, "UNSUPPORTED", "the operation is unsupported")

    def _manifest(
        self, method: str, repo: str, ref: str, query: dict[str, list[str]], headers: dict[str, str], data: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if method == "PUT":
            return self._put_manifest(repo, ref, headers.get("Content-Type", ""), data)
        if method not in ("GET", "HEAD"):
            return _error(405, "UNSUPPORTED", "the operation is unsupported")
        store = self.repos.get(repo)
        digest = ref if is_digest(ref) else (store.tags.get(ref) if store else None)
        if store is None or digest not in store.manifests:
            return _error(404, "MANIFEST_UNKNOWN", "manifest unknown")
        media, body = store.manifests[digest]
        return 200, {"Content-Type": media, "Docker-Content-Digest": digest, "Content-Length": str(len(body))}, body

    def _put_manifest(self, repo: str, ref: str, media: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
        digest = sha256_digest(data)
        if is_digest(ref) and ref != digest:
            return _error(400, "DIGEST_INVALID", "provided digest did not match uploaded content")
        try:
            doc = json.loads(data)
        except ValueError:
            return _error(400, "MANIFEST_INVALID", "manifest invalid")
        store = self.repos.setdefault(repo, _Repo())
        named = [doc.get("config")] + list(doc.get("layers") or []) if isinstance(doc, dict) else []
        missing = [d["digest"] for d in named if isinstance(d, dict) and d.get("digest") not in self.blobs]
        missing += [
            d["digest"]
            for d in (doc.get("manifests") or [])
            if isinstance(doc, dict) and isinstance(d, dict) and d.get("digest") not in store.manifests
        ]
        if missing:
            return _error(400, "MANIFEST_BLOB_UNKNOWN", f"blob unknown to registry: {missing[0]}")
        store.manifests[digest] = (media, data)
        if not is_digest(ref):
            store.tags[ref] = digest
        hdrs = {"Docker-Content-Digest": digest, "Location": f"/v2/{repo}/manifests/{digest}"}
        subject = doc.get("subject") if isinstance(doc, dict) else None
        if self.referrers_api and isinstance(subject, dict):
            hdrs["OCI-Subject"] = str(subject.get("digest"))
        return 201, hdrs, b""

    def _referrers(
        self, method: str, repo: str, digest: str, query: dict[str, list[str]], headers: dict[str, str], data: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if not self.referrers_api:
            return 404, {"Content-Type": "text/plain"}, b"404 page not found"
        store = self.repos.get(repo) or _Repo()
        found = []
        for d, (media, body) in store.manifests.items():
            doc = json.loads(body)
            if isinstance(doc, dict) and (doc.get("subject") or {}).get("digest") == digest:
                found.append(
                    {
                        "mediaType": media,
                        "digest": d,
                        "size": len(body),
                        "artifactType": doc.get("artifactType"),
                        "annotations": doc.get("annotations", {}),
                    }
                )
        hdrs = {"Content-Type": _INDEX}
        if "artifactType" in query:
            found = [f for f in found if f["artifactType"] == query["artifactType"][0]]
            hdrs["OCI-Filters-Applied"] = "artifactType"
        return 200, hdrs, json.dumps({"schemaVersion": 2, "mediaType": _INDEX, "manifests": found}).encode()
