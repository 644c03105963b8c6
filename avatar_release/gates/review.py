"""Blind frame-by-frame review of a build whose output fell below the similarity band.

The gate picks the frames below the band (at most ``MAX_PAIRS``, evenly spread), draws a
left/right order for each pair from a recorded seed, and stores that in the review record.
The page shows each pair as "left" and "right" only; which side is the candidate is known to
the server, never to the page. An answer (left better / no visible difference / right
better) is recorded before the difference heat map of that pair can be fetched: the server
refuses the heat map of an unanswered pair, and an answer cannot be changed.

``avatar-release review BUILD --serve`` runs the server; ``--approve`` / ``--reject`` record the
decision. Approval needs every pair answered; a decision is final.
"""

from __future__ import annotations

import html
import json
import random
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from ..errors import InputError, NotFoundError, Refusal
from ..media import encode_png
from ..records import GateResult, ReviewAnswer, ReviewDecision, ReviewRecord, utcnow
from .report import heatmap, png_data_uri
from .store import get_frames, latest_result, load_review, save_review

__all__ = ["MAX_PAIRS", "new_review", "review_page", "ReviewServer", "record_answer", "decide", "review_frames"]

MAX_PAIRS = 24


def new_review(result: GateResult, result_digest: str, below: list[int], *, seed: int | None = None) -> ReviewRecord:
    if not below:
        raise InputError("nothing to review: no frame is below the band")
    if len(below) > MAX_PAIRS:
        idx = np.linspace(0, len(below) - 1, num=MAX_PAIRS).round().astype(int)
        below = [below[i] for i in sorted(set(idx.tolist()))]
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    return ReviewRecord(
        build_id=result.build_id, build_digest=result.build_digest, gate_result_digest=result_digest,
        baseline_digest=result.baseline.digest if result.baseline else "",
        seed=seed, frames=list(below), candidate_left=[rng.random() < 0.5 for _ in below],
        created_at=utcnow(),
    )


def review_frames(registry, review: ReviewRecord) -> tuple[np.ndarray, np.ndarray]:
    """(candidate frames, baseline frames) of the reviewed pairs, from the stored gate runs."""
    from .store import get_result, result_refs

    refs = {r.digest: r for r in result_refs(registry, review.build_id)}
    if review.gate_result_digest not in refs:
        raise NotFoundError(f"review of {review.build_id}: gate result {review.gate_result_digest} is gone")
    result = get_result(registry, refs[review.gate_result_digest])
    cand = get_frames(registry, result.frames_blob)
    base_res = _baseline_result(registry, result)
    base = get_frames(registry, base_res.frames_blob)
    return cand[review.frames], base[review.frames]


def _baseline_result(registry, result: GateResult) -> GateResult:
    from .store import get_result, result_refs

    b = result.baseline
    for ref in result_refs(registry, b.build_id):
        if ref.digest == b.gate_result_digest:
            return get_result(registry, ref)
    raise NotFoundError(f"baseline gate result {b.gate_result_digest} of {b.build_id} not found")


_PAGE_CSS = """
body{font:15px/1.4 system-ui,sans-serif;margin:24px;max-width:1000px;color:#222}
.pair{display:flex;gap:24px}.pair figure{margin:0;text-align:center}
img.f{width:400px;image-rendering:pixelated;border:1px solid #bbb}
button{font-size:15px;margin:6px 8px 6px 0;padding:6px 14px}
#heat img{width:400px;image-rendering:pixelated}#notice{color:#a60}
"""

_PAGE_JS = """
const pairs = JSON.parse(document.getElementById('pairs').textContent);
let current = 0;
const served = location.protocol.startsWith('http');
function show(i) {
  current = i;
  document.getElementById('counter').textContent = `Pair ${i + 1} of ${pairs.length}`;
  document.getElementById('left').src = pairs[i].left;
  document.getElementById('right').src = pairs[i].right;
  document.getElementById('heat').innerHTML = '';
  document.getElementById('status').textContent = '';
  document.getElementById('next').disabled = true;
  for (const b of document.querySelectorAll('button.answer')) b.disabled = !served;
}
async function answer(choice) {
  for (const b of document.querySelectorAll('button.answer')) b.disabled = true;
  const r = await fetch('answer', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                   body: JSON.stringify({pair: current, choice: choice})});
  const body = await r.json();
  if (!r.ok) { document.getElementById('status').textContent = body.error; return; }
  document.getElementById('status').textContent = `Recorded: ${choice}.`;
  document.getElementById('heat').innerHTML =
    `<p>Difference heat map (shown only after your answer):</p><img alt="heat map" src="heatmap/${current}.png">`;
  document.getElementById('next').disabled = current + 1 >= pairs.length;
  if (body.complete) document.getElementById('done').hidden = false;
}
document.getElementById('next').onclick = () => show(current + 1);
for (const b of document.querySelectorAll('button.answer')) b.onclick = () => answer(b.dataset.choice);
if (!served) document.getElementById('notice').hidden = false;
fetch('state').then(r => r.json()).then(s => { show(Math.min(s.answered, pairs.length - 1));
  if (s.complete) document.getElementById('done').hidden = false; }).catch(() => show(0));
"""


def review_page(review: ReviewRecord, cand: np.ndarray, base: np.ndarray) -> str:
    """The blind page: pairs as neutral left/right images, no hint of which is the candidate."""
    pairs = []
    for k, left_is_candidate in enumerate(review.candidate_left):
        left, right = (cand[k], base[k]) if left_is_candidate else (base[k], cand[k])
        pairs.append({"left": png_data_uri(left), "right": png_data_uri(right)})
    e = html.escape
    cmd = f"avatar-release review {review.build_id} --serve"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Blind review</title><style>{_PAGE_CSS}</style></head><body>"
        f"<h1>Blind review: {len(pairs)} frame pairs</h1>"
        "<p>Each pair shows the same frame from two renders, in random order. For each pair, say which side "
        "looks better, or that you see no difference. Your answer is recorded before the difference is shown.</p>"
        f"<p id='notice' hidden>Opened from a file: answers cannot be recorded. Run <code>{e(cmd)}</code> "
        "and open the address it prints.</p>"
        "<h2 id='counter'></h2>"
        "<div class='pair'><figure><img class='f' id='left' alt='left'><figcaption>left</figcaption></figure>"
        "<figure><img class='f' id='right' alt='right'><figcaption>right</figcaption></figure></div>"
        "<div><button class='answer' data-choice='left'>Left looks better</button>"
        "<button class='answer' data-choice='same'>No visible difference</button>"
        "<button class='answer' data-choice='right'>Right looks better</button>"
        "<button id='next' disabled>Next pair</button></div>"
        "<p id='status'></p><div id='heat'></div>"
        f"<p id='done' hidden>All answers recorded. Decide with <code>avatar-release review {e(review.build_id)} "
        "--approve|--reject --reviewer NAME --note TEXT</code>.</p>"
        f"<script type='application/json' id='pairs'>{json.dumps(pairs)}</script>"
        f"<script>{_PAGE_JS}</script></body></html>"
    )


def record_answer(registry, build_id: str, pair: int, choice: str) -> ReviewRecord:
    """Record one blind answer; refuses a second answer to the same pair."""
    lock = _locks.setdefault(build_id, threading.Lock())
    with lock:
        review = load_review(registry, build_id)
        if review is None:
            raise NotFoundError(f"no review open for {build_id}")
        if review.decision is not None:
            raise Refusal(f"review of {build_id} was already decided ({review.decision.decision})")
        if not isinstance(pair, int) or not 0 <= pair < len(review.frames):
            raise InputError(f"pair {pair!r}: expected 0..{len(review.frames) - 1}")
        if choice not in ("left", "right", "same"):
            raise InputError(f"choice {choice!r}: expected left, right or same")
        if any(a.pair == pair for a in review.answers):
            raise Refusal(f"pair {pair} was already answered; answers are final")
        cand_left = review.candidate_left[pair]
        preferred = "same" if choice == "same" else (
            "candidate" if (choice == "left") == cand_left else "baseline")
        answer = ReviewAnswer(pair=pair, choice=choice, preferred=preferred, at=utcnow())
        review = review.model_copy(update={"answers": [*review.answers, answer]})
        save_review(registry, review)
        return review


_locks: dict[str, threading.Lock] = {}


def decide(registry, build_id: str, *, approve: bool, reviewer: str, note: str, signer=None,
           policy=None) -> ReviewRecord:
    """Record the final decision on a build that needs review, signed by the reviewer.

    ``reviewer`` must be named by the trust policy (``policy``, default: the one in force) and
    ``signer`` (default: this machine's own reviewer key) must be that reviewer's key: a name
    typed on the command line proves nothing, the signature does.
    """
    if not reviewer.strip():
        raise InputError("--reviewer: give the name of the person deciding")
    latest = latest_result(registry, build_id)
    if latest is None:
        raise NotFoundError(f"build {build_id} has no gate result; run `avatar-release gate {build_id}` first")
    result, digest = latest
    review = load_review(registry, build_id)
    if review is None or result.status != "needs-review":
        raise Refusal(f"build {build_id}: its latest gate result is {result.status!r}; only a build that "
                      "needs review can be approved or rejected")
    if review.decision is not None:
        d = review.decision
        raise Refusal(f"build {build_id} was already {d.decision} by {d.reviewer} at {d.at}; decisions are final")
    if review.gate_result_digest != digest:
        raise Refusal(f"the open review is for gate result {review.gate_result_digest}, the latest is {digest}; "
                      f"re-run `avatar-release gate {build_id}`")
    if approve and not review.complete:
        missing = len(review.frames) - len({a.pair for a in review.answers})
        raise Refusal(f"build {build_id}: {missing} of {len(review.frames)} blind pairs unanswered; answer them "
                      f"first (avatar-release review {build_id} --serve), then approve")
    reviewer = reviewer.strip()
    key, policy = _reviewer_key(reviewer, signer, policy)
    decision = ReviewDecision(decision="approved" if approve else "rejected", reviewer=reviewer, note=note,
                              at=utcnow())
    from ..registry import read_manifest
    from ..trust.evidence import sign_and_store

    _, manifest = read_manifest(registry, build_id)
    sign_and_store(registry, key, kind="review-decision", build_id=build_id, subject_digest=manifest.content_digest(),
                   predicate={"build_id": build_id, "gate_result_digest": digest, **decision.model_dump(mode="json")})
    review = review.model_copy(update={"decision": decision})
    save_review(registry, review)
    return review


def _reviewer_key(reviewer: str, signer, policy):
    """(the reviewer's private key, the policy) once the policy names ``reviewer`` with that key."""
    from ..trust import key_id
    from ..trust.policy import load_policy, local_identity

    policy = policy or load_policy()
    if reviewer not in policy.reviewers:
        raise Refusal(f"reviewer {reviewer!r} is not named by the trust policy {policy.path} (reviewers: "
                      f"{', '.join(policy.reviewers) or 'none'}); add them under [review] with their public key")
    key = signer or local_identity().reviewer_key()
    want, have = key_id(policy.keys[reviewer]), key_id(key.public_key())
    if want != have:
        raise Refusal(f"reviewer {reviewer!r}: the trust policy {policy.path} knows them by key {want}, but this "
                      f"decision would be signed with {have}; sign with their key (--reviewer-key)")
    return key, policy


class ReviewServer:
    """HTTP server for one build's blind review (127.0.0.1 by default)."""

    def __init__(self, registry, build_id: str, *, host: str = "127.0.0.1", port: int = 0):
        review = load_review(registry, build_id)
        if review is None:
            raise NotFoundError(f"no review open for {build_id}: only a gate that ends in needs-review opens one")
        self.registry, self.build_id = registry, build_id
        cand, base = review_frames(registry, review)
        self._page = review_page(review, cand, base).encode()
        self._heat = [encode_png(heatmap(c, b)) for c, b in zip(cand, base)]
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet; the CLI prints what matters
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def _json(self, code: int, doc: dict) -> None:
                self._send(code, json.dumps(doc).encode(), "application/json")

            def do_GET(self):
                path = self.path.split("?")[0]
                if path in ("/", "/index.html"):
                    return self._send(200, server._page, "text/html; charset=utf-8")
                if path == "/state":
                    r = load_review(server.registry, server.build_id)
                    return self._json(200, {"answered": len(r.answers), "pairs": len(r.frames),
                                            "complete": r.complete, "decided": r.decision is not None})
                m = re.fullmatch(r"/heatmap/(\d+)\.png", path)
                if m:
                    k = int(m.group(1))
                    r = load_review(server.registry, server.build_id)
                    if k >= len(r.frames):
                        return self._json(404, {"error": f"no pair {k}"})
                    if not any(a.pair == k for a in r.answers):
                        return self._json(403, {"error": f"answer pair {k} before its heat map is shown"})
                    return self._send(200, server._heat[k], "image/png")
                return self._json(404, {"error": f"no such page {path}"})

            def do_POST(self):
                if self.path != "/answer":
                    return self._json(404, {"error": f"no such endpoint {self.path}"})
                try:
                    n = int(self.headers.get("Content-Length", "0"))
                    doc = json.loads(self.rfile.read(min(n, 4096)) or b"{}")
                    r = record_answer(server.registry, server.build_id, doc.get("pair"), doc.get("choice"))
                except (ValueError, AttributeError):
                    return self._json(400, {"error": "expected JSON {pair, choice}"})
                except (InputError, Refusal, NotFoundError) as e:
                    return self._json(409 if isinstance(e, Refusal) else 400, {"error": str(e)})
                return self._json(200, {"recorded": True, "answered": len(r.answers), "complete": r.complete})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> "ReviewServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
