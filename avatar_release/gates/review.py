"""Blind frame-by-frame review of a build whose output fell below the similarity band.

The gate picks the frames below the band (at most ``MAX_PAIRS``, evenly spread) and draws a
left/right order for each pair. The page shows each pair as "left" and "right" only. An
answer (left better / no visible difference / right better) is recorded before the difference
heat map of that pair can be fetched: the server refuses the heat map of an unanswered pair,
and an answer cannot be changed.

Who may answer, and what counts:
  * every answer is an attestation (kind ``review-answer``) signed with the answering
    reviewer's key, naming the reviewer, the pair, the frame, the choice, the gate result and
    the order commitment; a reviewer the trust policy does not name, or a key that is not
    theirs, is refused before anything is stored;
  * only answers whose signature verifies under a reviewer key of the trust policy count:
    for "already answered", for the heat map, and for ``--approve``, which needs a signed
    answer on every pair and records the digests of the answers it counted. The answers listed
    in the review record are a mirror for display, rebuilt from the signed ones on each write;
  * the server runs as one reviewer and prints an address with a random per-session token;
    a request without the token is refused (403).

Sealed order (what it means, and its limit): the review record holds no left/right order
before the decision, only ``order_commitment`` (sha256 over the order and a random 32-byte
salt) and ``sealed_order`` (order and salt, AES-GCM encrypted with a key derived from the
review seal key of the machine that ran the gate: ``AVATAR_RELEASE_REVIEW_SEAL_KEY``, else
``<config>/keys/review-seal.key``, made on first use, 0600). Only a holder of that key (the
review server, the decision) opens it. ``preferred`` (which build an answer favoured) is
resolved only at the decision, which writes the order and salt into the record, so anyone can
check them against the commitment made before the first answer. The seal hides the order from
someone who reads the review record or the CLI's output; it cannot hide it from someone who
can read the registry's frame blobs (the gate result lists the candidate's frames and their
hashes: comparing them with the page's pixels tells the sides apart) or the seal key.

``avatar-release review BUILD --serve`` runs the server; ``--approve`` / ``--reject`` record the
decision; ``avatar-release review BUILD`` shows counts (and, once decided, the order).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import os
import random
import re
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from .. import _atomic
from .._digest import canonical_json, sha256_digest
from ..errors import AvatarReleaseError, InputError, IntegrityError, NotFoundError, Refusal, TrustError
from ..media import encode_png
from ..records import REVIEW_SCHEMA_VERSION, GateResult, ReviewAnswer, ReviewDecision, ReviewRecord, utcnow
from ..registry import read_manifest
from ..trust import key_id, load_private_key
from ..trust.evidence import sign_and_store
from ..trust.policy import config_dir, load_policy, local_identity
from .report import heatmap, png_data_uri
from .review_evidence import CHOICES, MAX_PAIRS, pairs_for, signed_answers
from .store import get_frames, get_result, latest_result, load_review, result_refs, save_review

__all__ = ["MAX_PAIRS", "CHOICES", "new_review", "review_frames", "review_page", "unseal_order", "record_answer",
           "decide", "ReviewStatus", "review_status", "ReviewServer", "serve_review"]



# ---- opening a review: the order, committed and sealed ---------------------------------------------


def new_review(result: GateResult, result_digest: str, below: list[int], *, seed: int | None = None) -> ReviewRecord:
    """A sealed review of the frames below the band. ``seed`` makes the order reproducible
    (tests); without it the order comes from the OS's random source. Either way the record
    holds only a salted commitment and the sealed order."""
    if not below:
        raise InputError("nothing to review: no frame is below the band")
    below = pairs_for(below)
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    order = {"candidate_left": [rng.random() < 0.5 for _ in below], "salt": secrets.token_hex(32)}
    commitment = sha256_digest(canonical_json(order))
    key, key_id = _seal_key()
    sealed = _encrypt(key, canonical_json(order), _aad(result.build_id, result_digest, commitment))
    return ReviewRecord(
        build_id=result.build_id, build_digest=result.build_digest, gate_result_digest=result_digest,
        baseline_digest=result.baseline.digest if result.baseline else "",
        frames=list(below), order_commitment=commitment, sealed_order=sealed, seal_key_id=key_id,
        created_at=utcnow(),
    )


def unseal_order(review: ReviewRecord) -> tuple[list[bool], str | None]:
    """(per pair: is the candidate on the left?, the salt) — needs the seal key that sealed it.

    A version-1 record or a decided one carries the order itself. The opened order must match
    the commitment stored before the first answer, or this is a TrustError (tampered)."""
    if review.candidate_left is not None:
        return list(review.candidate_left), review.order_salt
    if not review.sealed_order or not review.order_commitment:
        raise IntegrityError(f"review of {review.build_id}: neither an order nor a sealed order is stored")
    key, here = _seal_key()
    if review.seal_key_id != here:
        raise TrustError(
            f"review of {review.build_id}: its left/right order was sealed with review seal key "
            f"{review.seal_key_id}, this machine's is {here} ({_seal_key_path()}); serve and decide the review "
            "on the machine that ran the gate, or point AVATAR_RELEASE_REVIEW_SEAL_KEY at that machine's key")
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aad = _aad(review.build_id, review.gate_result_digest, review.order_commitment)
    try:
        raw = base64.b64decode(review.sealed_order, validate=True)
        doc = json.loads(AESGCM(key).decrypt(raw[:12], raw[12:], aad))
    except (InvalidTag, ValueError):
        raise TrustError(f"review of {review.build_id}: the sealed order does not open under seal key {here} for "
                         "this build, gate result and commitment (tampered, or moved from another review)") from None
    if sha256_digest(canonical_json(doc)) != review.order_commitment:
        raise TrustError(f"review of {review.build_id}: the sealed order does not match its commitment "
                         f"{review.order_commitment}")
    left = doc["candidate_left"]
    if len(left) != len(review.frames):
        raise TrustError(f"review of {review.build_id}: sealed order has {len(left)} pairs, the review {len(review.frames)}")
    return list(left), doc["salt"]


def _aad(build_id: str, result_digest: str, commitment: str) -> bytes:
    # binds the ciphertext to its review: a sealed order copied into another record does not open
    return "\0".join(("avatar-release review order v1", build_id, result_digest, commitment)).encode()


def _encrypt(key: bytes, plaintext: bytes, aad: bytes) -> str:
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = secrets.token_bytes(12)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, plaintext, aad)).decode()


def _seal_key_path() -> Path:
    explicit = os.environ.get("AVATAR_RELEASE_REVIEW_SEAL_KEY")
    if explicit:
        return Path(explicit)

    return config_dir() / "keys" / "review-seal.key"


def _seal_key() -> tuple[bytes, str]:
    """(AES-256 key derived from this machine's review seal secret, the secret's id)."""
    # Lazy (heavy): cryptography loads only when a key is used.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    path = _seal_key_path()
    if not path.is_file():
        if os.environ.get("AVATAR_RELEASE_REVIEW_SEAL_KEY"):
            raise InputError(f"review seal key {path}: no such file (AVATAR_RELEASE_REVIEW_SEAL_KEY)")
        _create_secret(path)
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except ValueError:
        secret = b""
    if len(secret) < 32:
        raise InputError(f"review seal key {path}: expected at least 64 hex digits (32 random bytes)")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"avatar-release/review-seal/v1").derive(secret)
    return key, "seal:" + hashlib.sha256(secret).hexdigest()[:16]


def _create_secret(path: Path) -> None:
    """Write 32 random bytes (hex, 0600) at ``path`` unless a concurrent first use already did:
    linked into place, so a secret that sealed something is never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{_atomic.TMP_PREFIX}{path.name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        _atomic.fsync_dir(path.parent)
    finally:
        os.unlink(tmp)


# ---- frames and the blind page ------------------------------------------------------------------


def review_frames(registry, review: ReviewRecord) -> tuple[np.ndarray, np.ndarray]:
    """(candidate frames, baseline frames) of the reviewed pairs, from the stored gate runs."""
    refs = {r.digest: r for r in result_refs(registry, review.build_id)}
    if review.gate_result_digest not in refs:
        raise NotFoundError(f"review of {review.build_id}: gate result {review.gate_result_digest} is gone")
    result = get_result(registry, refs[review.gate_result_digest])
    cand = get_frames(registry, result.frames_blob)
    base_res = _baseline_result(registry, result)
    base = get_frames(registry, base_res.frames_blob)
    return cand[review.frames], base[review.frames]


def _baseline_result(registry, result: GateResult) -> GateResult:
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
    """The blind page: pairs as neutral left/right images, no hint of which is the candidate.

    Needs the order, so only the seal key's holder (the gate machine, the review server) renders it."""
    left_is_candidate, _ = unseal_order(review)
    pairs = []
    for k, cand_left in enumerate(left_is_candidate):
        left, right = (cand[k], base[k]) if cand_left else (base[k], cand[k])
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


# ---- reviewers and their signed answers ---------------------------------------------------------


def _load_signer(signer):
    """A private key, a path to one (``--reviewer-key``), or None (this machine's reviewer key)."""
    if signer is None or not isinstance(signer, (str, os.PathLike)):
        return signer

    return load_private_key(signer)


def _reviewer_key(reviewer: str | None, signer, policy, *, what: str):
    """(private key, reviewer name, policy) once the policy names ``reviewer`` with that key.

    ``reviewer`` defaults to this machine's reviewer, ``signer`` to its reviewer key: a name
    typed on the command line proves nothing, the signature does."""
    policy = policy or load_policy()
    reviewer = (reviewer or local_identity().reviewer).strip()
    if reviewer not in policy.reviewers:
        raise Refusal(f"reviewer {reviewer!r} is not named by the trust policy {policy.path} (reviewers: "
                      f"{', '.join(policy.reviewers) or 'none'}); add them under [review] with their public key")
    key = _load_signer(signer) or local_identity().reviewer_key()
    want, have = key_id(policy.keys[reviewer]), key_id(key.public_key())
    if want != have:
        raise Refusal(f"reviewer {reviewer!r}: the trust policy {policy.path} knows them by key {want}, but this "
                      f"{what} would be signed with {have}; sign with their key (--reviewer-key)")
    return key, reviewer, policy


def _subject(registry, build_id: str) -> str:
    """The build's store-independent manifest digest: what review evidence is signed about."""
    return read_manifest(registry, build_id)[1].content_digest()


def _unsigned_in_record(review: ReviewRecord, signed: dict[int, ReviewAnswer]) -> int:
    """Answers the record lists that no verified attestation backs (written by hand, or v1)."""
    return sum(1 for a in review.answers if a.pair not in signed or signed[a.pair].evidence != a.evidence)


def _save(registry, review: ReviewRecord, answers: dict[int, ReviewAnswer], **update) -> ReviewRecord:
    review = review.model_copy(update={"schema_version": REVIEW_SCHEMA_VERSION,
                                       "answers": [answers[k] for k in sorted(answers)], **update})
    save_review(registry, review)
    return review


_locks: dict[str, threading.Lock] = {}


def _lock(build_id: str) -> threading.Lock:
    return _locks.setdefault(build_id, threading.Lock())


def record_answer(registry, build_id: str, pair: int, choice: str, *, reviewer: str | None = None, signer=None,
                  policy=None) -> ReviewRecord:
    """Record one blind answer, signed by ``reviewer`` (default: this machine's reviewer) with
    ``signer`` (their private key or its path; default: this machine's reviewer key).

    Refuses a reviewer the trust policy does not name or a key that is not theirs, and a second
    answer to a pair that already has a signed one. ``preferred`` stays empty until the decision.
    """
    key, reviewer, policy = _reviewer_key(reviewer, signer, policy, what="answer")
    with _lock(build_id):
        review = load_review(registry, build_id)
        if review is None:
            raise NotFoundError(f"no review open for {build_id}")
        if review.decision is not None:
            raise Refusal(f"review of {build_id} was already decided ({review.decision.decision})")
        if not isinstance(pair, int) or isinstance(pair, bool) or not 0 <= pair < len(review.frames):
            raise InputError(f"pair {pair!r}: expected 0..{len(review.frames) - 1}")
        if choice not in CHOICES:
            raise InputError(f"choice {choice!r}: expected left, right or same")
        subject = _subject(registry, build_id)
        signed = signed_answers(registry, review, policy, subject)
        if pair in signed:
            raise Refusal(f"pair {pair} was already answered (by {signed[pair].reviewer}); answers are final")
        predicate = {"build_id": build_id, "gate_result_digest": review.gate_result_digest,
                     "order_commitment": review.order_commitment, "pair": pair, "frame": review.frames[pair],
                     "choice": choice, "reviewer": reviewer, "at": utcnow()}

        sign_and_store(registry, key, kind="review-answer", build_id=build_id, subject_digest=subject,
                       predicate=predicate)
        signed[pair] = ReviewAnswer(pair=pair, choice=choice, at=predicate["at"], reviewer=reviewer,
                                    evidence=sha256_digest(canonical_json(predicate)))
        return _save(registry, review, signed)


# ---- the decision -------------------------------------------------------------------------------


def decide(registry, build_id: str, *, approve: bool, reviewer: str, note: str, signer=None,
           policy=None) -> ReviewRecord:
    """Record the final decision on a build that needs review, signed by the reviewer.

    ``reviewer`` must be named by the trust policy (``policy``, default: the one in force) and
    ``signer`` (a private key or its path; default: this machine's own reviewer key) must be
    that reviewer's key. Approval needs a signed answer by a reviewer the policy names on every
    pair; the decision lists the digests of the answers it counted. The order is revealed into
    the record (and each answer's ``preferred`` resolved): approval needs the seal key to do
    that; a rejection is recorded even where the order cannot be opened.
    """
    if not reviewer or not reviewer.strip():
        raise InputError("--reviewer NAME is required with --approve or --reject: the person deciding")
    with _lock(build_id):
        review, digest = _decidable(registry, build_id)
        key, reviewer, policy = _reviewer_key(reviewer, signer, policy, what="decision")
        subject = _subject(registry, build_id)
        signed = signed_answers(registry, review, policy, subject)
        if approve:
            _require_every_pair(review, signed, policy)
        try:
            order, salt = unseal_order(review)
        except TrustError:
            if approve:
                raise
            order, salt = None, None  # a rejection can only hold a build back: record it anyway
        if order is not None:
            signed = {k: a.model_copy(update={"preferred": _preferred(a.choice, order[k])}) for k, a in signed.items()}
        decision = ReviewDecision(decision="approved" if approve else "rejected", reviewer=reviewer, note=note,
                                  at=utcnow(), answers=[signed[k].evidence for k in sorted(signed)],
                                  order_commitment=review.order_commitment)

        sign_and_store(registry, key, kind="review-decision", build_id=build_id, subject_digest=subject,
                       predicate={"build_id": build_id, "gate_result_digest": digest,
                                  **decision.model_dump(mode="json")})
        return _save(registry, review, signed, decision=decision,
                     **({"candidate_left": order, "order_salt": salt} if order is not None else {}))


def _decidable(registry, build_id: str) -> tuple[ReviewRecord, str]:
    """(the open review, the latest gate result's digest) when the build can be decided now."""
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
    return review, digest


def _require_every_pair(review: ReviewRecord, signed: dict[int, ReviewAnswer], policy) -> None:
    n = len(review.frames)
    missing = [k for k in range(n) if k not in signed]
    if not missing:
        return
    unsigned = _unsigned_in_record(review, signed)
    listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    raise Refusal(
        f"build {review.build_id}: {len(missing)} of {n} blind pairs unanswered (no answer signed by a reviewer "
        f"the trust policy {policy.path} names: pairs {listed})"
        + (f"; {unsigned} answer(s) in the review record carry no valid signature and do not count" if unsigned
           else "")
        + f". Answer them first (avatar-release review {review.build_id} --serve), then approve")


def _preferred(choice: str, candidate_left: bool) -> str:
    if choice == "same":
        return "same"
    return "candidate" if (choice == "left") == candidate_left else "baseline"


# ---- status: counts while open, the order once decided ------------------------------------------


@dataclass(frozen=True)
class ReviewStatus:
    """What ``avatar-release review BUILD`` shows: counts only while the review is open (no
    order, no resolved preferences); the decision, the order and each answer once decided."""

    review: ReviewRecord
    signed: dict[int, ReviewAnswer]  # verified answers, by pair
    unsigned: int  # answers the record lists that no verified signature backs

    @property
    def state(self) -> str:
        if self.review.decision is not None:
            return self.review.decision.decision
        return "answered, awaiting decision" if len(self.signed) == len(self.review.frames) else "open"

    def _by_reviewer(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.signed.values():
            out[a.reviewer] = out.get(a.reviewer, 0) + 1
        return out

    def as_json(self) -> dict:
        r = self.review
        doc = {"build_id": r.build_id, "state": self.state, "pairs": len(r.frames),
               "answered": len(self.signed), "answered_by": self._by_reviewer(), "unsigned_answers_ignored":
               self.unsigned, "frames": r.frames, "gate_result_digest": r.gate_result_digest,
               "order_commitment": r.order_commitment, "order": None, "decision": None}
        if r.decision is None:
            return doc  # sealed: nothing that tells the sides apart
        doc["decision"] = r.decision.model_dump(mode="json")
        if r.candidate_left is not None:
            doc["order"] = {"candidate_left": r.candidate_left, "salt": r.order_salt}
            doc["answers"] = [a.model_dump(mode="json") for a in r.answers]
            doc["preferences"] = {k: sum(a.preferred == k for a in r.answers) for k in ("candidate", "baseline", "same")}
        return doc

    def text(self) -> str:
        r, n = self.review, len(self.review.frames)
        who = ", ".join(f"{k} {v}" for k, v in sorted(self._by_reviewer().items())) or "nobody yet"
        ignored = f"; {self.unsigned} unsigned answer(s) in the record ignored" if self.unsigned else ""
        if r.decision is None:
            return (f"{r.build_id}: review {self.state}; {len(self.signed)}/{n} pairs answered, signed ({who})"
                    f"{ignored}; which side is the candidate stays sealed until the decision")
        d = r.decision
        head = f"{r.build_id}: review {d.decision} by {d.reviewer} at {d.at}; {len(self.signed)}/{n} pairs answered"
        if r.candidate_left is None:
            return head + f"{ignored}; the order could not be opened when it was decided (still sealed)"
        prefs = self.as_json()["preferences"]
        lines = [head + f" (candidate preferred {prefs['candidate']}, baseline {prefs['baseline']}, "
                        f"no difference {prefs['same']}){ignored}"]
        answers = {a.pair: a for a in r.answers}
        for k, frame in enumerate(r.frames):
            side = "left" if r.candidate_left[k] else "right"
            a = answers.get(k)
            said = f"{a.choice} -> {a.preferred} ({a.reviewer})" if a else "unanswered"
            lines.append(f"  pair {k:>2} frame {frame:>4}: candidate on the {side}; {said}")
        return "\n".join(lines)


def review_status(registry, build_id: str, *, policy=None) -> ReviewStatus:
    review = load_review(registry, build_id)
    if review is None:
        raise NotFoundError(f"no review for {build_id}: only a gate that ends in needs-review opens one")
    signed = signed_answers(registry, review, policy or load_policy(), _subject(registry, build_id))
    return ReviewStatus(review, signed, _unsigned_in_record(review, signed))


# ---- the server ---------------------------------------------------------------------------------


def serve_review(registry, build_id: str, *, reviewer: str | None = None, reviewer_key=None,
                 host: str = "127.0.0.1", port: int = 0) -> ReviewServer:
    """A review server for ``build_id`` answering as ``reviewer`` (checked against the trust
    policy now); call ``.run()`` to serve until Ctrl-C."""
    return ReviewServer(registry, build_id, reviewer=reviewer, reviewer_key=reviewer_key, host=host, port=port)


class ReviewServer:
    """HTTP server for one build's blind review, answering as one reviewer.

    Every path is under ``/<token>/`` (a random token per server, in ``url``); anything else is
    403, so a page or script that does not know the printed address cannot answer or read."""

    def __init__(self, registry, build_id: str, *, reviewer: str | None = None, reviewer_key=None, policy=None,
                 host: str = "127.0.0.1", port: int = 0):
        self.key, self.reviewer, self.policy = _reviewer_key(reviewer, reviewer_key, policy, what="answer")
        review = load_review(registry, build_id)
        if review is None:
            raise NotFoundError(f"no review open for {build_id}: only a gate that ends in needs-review opens one")
        if review.decision is not None:
            raise Refusal(f"review of {build_id} was already {review.decision.decision}; see "
                          f"`avatar-release review {build_id}`")
        self.registry, self.build_id = registry, build_id
        self.token = secrets.token_urlsafe(24)
        cand, base = review_frames(registry, review)
        self._page = review_page(review, cand, base).encode()
        self._heat = [encode_png(heatmap(c, b)) for c, b in zip(cand, base)]
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.url = f"http://{host}:{self.httpd.server_address[1]}/{self.token}/"

    def _signed(self) -> tuple[ReviewRecord, dict[int, ReviewAnswer]]:
        r = load_review(self.registry, self.build_id)
        return r, signed_answers(self.registry, r, self.policy, _subject(self.registry, self.build_id))

    def answer(self, pair, choice) -> ReviewRecord:
        return record_answer(self.registry, self.build_id, pair, choice, reviewer=self.reviewer, signer=self.key,
                             policy=self.policy)

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

    def start(self) -> "ReviewServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: ReviewServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet; the CLI prints what matters
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Referrer-Policy", "no-referrer")  # the token is in the path
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, doc: dict) -> None:
            self._send(code, json.dumps(doc).encode(), "application/json")

        def _route(self) -> str | None:
            """The path below ``/<token>/``, or None (and a 403 sent) without the session token."""
            token, slash, rest = self.path.split("?")[0].lstrip("/").partition("/")
            if slash and hmac.compare_digest(token.encode(), server.token.encode()):
                return rest
            self._json(403, {"error": "this review needs the address its server printed (with the session token)"})
            return None

        def do_GET(self):
            path = self._route()
            if path is None:
                return
            if path in ("", "index.html"):
                return self._send(200, server._page, "text/html; charset=utf-8")
            try:
                review, signed = server._signed()
            except AvatarReleaseError as e:
                return self._json(500, {"error": str(e)})
            if path == "state":
                return self._json(200, {"answered": len(signed), "pairs": len(review.frames),
                                        "complete": len(signed) == len(review.frames),
                                        "decided": review.decision is not None})
            m = re.fullmatch(r"heatmap/(\d+)\.png", path)
            if m:
                k = int(m.group(1))
                if k >= len(review.frames):
                    return self._json(404, {"error": f"no pair {k}"})
                if k not in signed:
                    return self._json(403, {"error": f"answer pair {k} before its heat map is shown"})
                return self._send(200, server._heat[k], "image/png")
            return self._json(404, {"error": f"no such page {path}"})

        def do_POST(self):
            path = self._route()
            if path is None:
                return
            if path != "answer":
                return self._json(404, {"error": f"no such endpoint {path}"})
            try:
                n = int(self.headers.get("Content-Length", "0"))
                doc = json.loads(self.rfile.read(min(n, 4096)) or b"{}")
                r = server.answer(doc.get("pair"), doc.get("choice"))
            except (ValueError, AttributeError):
                return self._json(400, {"error": "expected JSON {pair, choice}"})
            except (InputError, Refusal, NotFoundError) as e:
                return self._json(409 if isinstance(e, Refusal) else 400, {"error": str(e)})
            except AvatarReleaseError as e:
                return self._json(500, {"error": str(e)})
            return self._json(200, {"recorded": True, "answered": len(r.answers),
                                    "complete": len(r.answers) == len(r.frames)})

    return Handler
