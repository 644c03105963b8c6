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

The review's modules, one job each (this module only gathers their public names):
  review_order     draw, commit and seal the left/right order; open it (the seal is ``trust.seal``)
  review_page      the reviewed frames and the blind page (package data ``review_page.html``)
  review_answers   who may sign review evidence; the signed blind answers
  review_decision  the signed decision, revealing the order
  review_status    what ``avatar-release review BUILD`` shows
  review_server    the HTTP server, answering as one reviewer
  review_evidence  what counts (shared with the promotion policy): the one signer check
"""

from __future__ import annotations

from .review_answers import record_answer
from .review_decision import decide
from .review_evidence import CHOICES, MAX_PAIRS
from .review_order import new_review, unseal_order
from .review_page import review_frames, review_page
from .review_server import ReviewServer, serve_review
from .review_status import ReviewStatus, review_status

__all__ = [
    "MAX_PAIRS",
    "CHOICES",
    "new_review",
    "review_frames",
    "review_page",
    "unseal_order",
    "record_answer",
    "decide",
    "ReviewStatus",
    "review_status",
    "ReviewServer",
    "serve_review",
]
