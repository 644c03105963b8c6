"""The review server: one build's blind page over HTTP, answering as one reviewer.

The server prints an address with a random per-session token; every path is under
``/<token>/`` and anything else is refused (403), so a page or script that does not know the
printed address cannot answer or read. A pair's heat map is served only once the pair has a
signed answer. The server owns its state: the page and heat maps rendered once, and the lock
that serialises its handler threads' answers (so two answers to one pair cannot both pass the
"already answered" check).
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from ..errors import AvatarReleaseError, InputError, NotFoundError, Refusal
from ..media import encode_png
from ..records import ReviewAnswer, ReviewRecord
from ..registry import Registry
from ..trust.policy import TrustPolicy
from .report import heatmap
from .review_answers import record_answer, reviewer_signer
from .review_evidence import review_subject, signed_answers
from .review_page import review_frames, review_page
from .store import load_review

if TYPE_CHECKING:
    from .review_answers import Signer

__all__ = ["ReviewServer", "serve_review"]

_HEATMAP = re.compile(r"heatmap/(\d+)\.png")
_MAX_BODY = 4096  # an answer is a few dozen bytes


@dataclass(frozen=True)
class _Response:
    code: int
    body: bytes
    content_type: str

    @classmethod
    def json(cls, code: int, doc: dict[str, Any]) -> _Response:
        return cls(code, json.dumps(doc).encode(), "application/json")


def serve_review(
    registry: Registry,
    build_id: str,
    *,
    reviewer: str | None = None,
    reviewer_key: Signer = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> ReviewServer:
    """A review server for ``build_id`` answering as ``reviewer`` (checked against the trust
    policy now); call ``.run()`` to serve until Ctrl-C."""
    return ReviewServer(registry, build_id, reviewer=reviewer, reviewer_key=reviewer_key, host=host, port=port)


class ReviewServer:
    """HTTP server for one build's blind review, answering as one reviewer.

    Every path is under ``/<token>/`` (a random token per server, in ``url``); anything else is
    403, so a page or script that does not know the printed address cannot answer or read."""

    def __init__(
        self,
        registry: Registry,
        build_id: str,
        *,
        reviewer: str | None = None,
        reviewer_key: Signer = None,
        policy: TrustPolicy | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.key, self.reviewer, self.policy = reviewer_signer(reviewer, reviewer_key, policy, what="answer")
        review = load_review(registry, build_id)
        if review is None:
            raise NotFoundError(f"no review open for {build_id}: only a gate that ends in needs-review opens one")
        if review.decision is not None:
            raise Refusal(
                f"review of {build_id} was already {review.decision.decision}; see `avatar-release review {build_id}`"
            )
        self.registry, self.build_id = registry, build_id
        self.token = secrets.token_urlsafe(24)
        cand, base = review_frames(registry, review)
        self._page = review_page(review, cand, base).encode()
        self._heat = [encode_png(heatmap(c, b)) for c, b in zip(cand, base)]
        self._answering = threading.Lock()  # one answer at a time from this server's handler threads
        self.httpd = _HTTPServer((host, port), self)
        self.url = f"http://{host}:{self.httpd.server_address[1]}/{self.token}/"

    # ---- what the page asks -----------------------------------------------------------------------

    def answer(self, pair: int, choice: str) -> ReviewRecord:
        """Record one signed answer as this server's reviewer (one at a time)."""
        with self._answering:
            return record_answer(
                self.registry, self.build_id, pair, choice, reviewer=self.reviewer, signer=self.key, policy=self.policy
            )

    def route(self, raw_path: str) -> str | None:
        """The path below ``/<token>/``, or None without the session token."""
        token, slash, rest = raw_path.split("?")[0].lstrip("/").partition("/")
        if slash and hmac.compare_digest(token.encode(), self.token.encode()):
            return rest
        return None

    def get(self, path: str) -> _Response:
        if path in ("", "index.html"):
            return _Response(200, self._page, "text/html; charset=utf-8")
        try:
            review, signed = self._signed()
        except AvatarReleaseError as e:
            return _Response.json(500, {"error": str(e)})
        if path == "state":
            return _Response.json(
                200,
                {
                    "answered": len(signed),
                    "pairs": len(review.frames),
                    "complete": len(signed) == len(review.frames),
                    "decided": review.decision is not None,
                },
            )
        m = _HEATMAP.fullmatch(path)
        if m is None:
            return _Response.json(404, {"error": f"no such page {path}"})
        k = int(m.group(1))
        if k >= len(review.frames):
            return _Response.json(404, {"error": f"no pair {k}"})
        if k not in signed:
            return _Response.json(403, {"error": f"answer pair {k} before its heat map is shown"})
        return _Response(200, self._heat[k], "image/png")

    def post(self, path: str, read_body: Callable[[], bytes]) -> _Response:
        """``read_body`` is called only for a path that takes one; a ValueError from it is a 400."""
        if path != "answer":
            return _Response.json(404, {"error": f"no such endpoint {path}"})
        try:
            doc = json.loads(read_body() or b"{}")
            r = self.answer(doc.get("pair"), doc.get("choice"))
        except (ValueError, AttributeError):
            return _Response.json(400, {"error": "expected JSON {pair, choice}"})
        except (InputError, Refusal, NotFoundError) as e:
            return _Response.json(409 if isinstance(e, Refusal) else 400, {"error": str(e)})
        except AvatarReleaseError as e:
            return _Response.json(500, {"error": str(e)})
        return _Response.json(
            200, {"recorded": True, "answered": len(r.answers), "complete": len(r.answers) == len(r.frames)}
        )

    def _signed(self) -> tuple[ReviewRecord, dict[int, ReviewAnswer]]:
        r = load_review(self.registry, self.build_id)
        assert r is not None  # found when this server opened; a review record is never removed
        return r, signed_answers(self.registry, r, self.policy, review_subject(self.registry, self.build_id))

    # ---- running ------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def run(self) -> None:
        """Serve until Ctrl-C, then close."""
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def start(self) -> ReviewServer:
        """Serve from a background thread (tests, embedding); ``close()`` stops it."""
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _HTTPServer(ThreadingHTTPServer):
    """The socket server, pointing its handlers at the review server that owns it."""

    def __init__(self, address: tuple[str, int], review: ReviewServer) -> None:
        self.review = review
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    """HTTP plumbing only: the token check and every answer come from ``ReviewServer``."""

    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet; the CLI prints what matters
        pass

    def _send(self, r: _Response) -> None:
        self.send_response(r.code)
        self.send_header("Content-Type", r.content_type)
        self.send_header("Content-Length", str(len(r.body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")  # the token is in the path
        self.end_headers()
        self.wfile.write(r.body)

    def _route(self) -> str | None:
        """The path below ``/<token>/``, or None (and a 403 sent) without the session token."""
        path = self.server.review.route(self.path)
        if path is None:
            self._send(
                _Response.json(
                    403, {"error": "this review needs the address its server printed (with the session token)"}
                )
            )
        return path

    def do_GET(self) -> None:
        path = self._route()
        if path is not None:
            self._send(self.server.review.get(path))

    def do_POST(self) -> None:
        path = self._route()
        if path is not None:
            self._send(self.server.review.post(path, self._body))

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length", "0"))  # ValueError: the server answers 400
        return self.rfile.read(min(n, _MAX_BODY))
