"""The blind review is blind and accountable (issue 14, part 4): the order stays sealed until the
decision, every answer is signed by a reviewer the trust policy names, the server answers only
to its session token, and nothing written into the registry by hand counts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files

import numpy as np
import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import InputError, Refusal, TrustError
from avatar_release.gates import review_outcome
from avatar_release.gates.review import (
    ReviewServer,
    decide,
    new_review,
    record_answer,
    review_page,
    review_status,
    unseal_order,
)
from avatar_release.gates.store import latest_result, load_review, put_frames, save_result, save_review
from avatar_release.records import (
    BaselineRef,
    GateEvidence,
    GateRequestRecord,
    GateResult,
    GateSetRecord,
    ReviewAnswer,
    utcnow,
)
from avatar_release.registry import LocalRegistry, MemoryRegistry, read_manifest
from avatar_release.trust import generate_keypair, load_private_key
from avatar_release.trust.evidence import attestation_refs, sign_and_store
from avatar_release.trust.policy import load_policy, local_identity
from avatar_release.trust.seal import SEAL_KEY_ENV, load_seal_key, seal, unseal
from tests.release_records import environment_of, publish_stand_in

PAIRS = [1, 3, 4]  # frames below the band, under review


def _result(reg, build_id, digest, m, frames, *, status, baseline=None) -> str:
    gs = GateSetRecord(
        name="t",
        version=1,
        digest="sha256:" + "0" * 64,
        requests=[
            GateRequestRecord(name="r", image_variant=0, audio_variant=0, seed=0, frames=len(frames), buckets=["f8"])
        ],
    )
    r = GateResult(
        status=status,
        build_id=build_id,
        build_digest=digest,
        pipeline="tiny",
        target="cpu-8",
        baseline=baseline,
        tier=2 if baseline else None,
        environment=environment_of(m),
        tool={},
        gate_set=gs,
        gates=[GateEvidence(name="similarity-band", status="below-band", summary="x")],
        frame_sha256=[["h"] * len(frames)],
        frames_blob=put_frames(reg, frames),
        created_at=utcnow(),
        created_by="test",
    )
    return save_result(reg, r, subject_digest=m.content_digest())


def _open_review(reg):
    """A candidate (needs review) against a passed baseline, real frames for both, a sealed review."""
    rng = np.random.default_rng(0)
    b, db, mb = publish_stand_in(reg, "b")
    base = rng.integers(0, 256, size=(6, 6, 8, 3), dtype=np.uint8)
    b_digest = _result(reg, b, db, mb, base, status="passed")
    a, da, ma = publish_stand_in(reg, "a")
    cand = base.copy()
    cand[PAIRS, 0, 0, 0] ^= 1
    digest = _result(
        reg,
        a,
        da,
        ma,
        cand,
        status="needs-review",
        baseline=BaselineRef(build_id=b, digest=db, gate_result_digest=b_digest),
    )
    result, _ = latest_result(reg, a)
    review = new_review(result, digest, PAIRS)
    save_review(reg, review)
    return a, review


@pytest.fixture
def stranger(tmp_path):
    priv, _, kid = generate_keypair(tmp_path / "k", "stranger")
    return load_private_key(priv), kid


def _policy_with(tmp_path, name: str):
    """A policy naming this machine's reviewer and ``name`` (with a key of their own)."""
    me = local_identity()
    priv, pub, _ = generate_keypair(tmp_path / "keys", name)
    path = tmp_path / "trust.toml"
    path.write_text(
        f'schema_version = 1\n[keys]\ngate = "{me.gate_key_path.with_suffix(".pub")}"\n'
        f'{me.reviewer} = "{me.reviewer_key_path.with_suffix(".pub")}"\n{name} = "{pub}"\n'
        f'[gate]\n"*" = ["gate"]\n[review]\nreviewers = ["{me.reviewer}", "{name}"]\n'
    )
    return load_policy(path), load_private_key(priv)


def _cli(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# ---- sealed ----------------------------------------------------------------------------------------


def test_json_status_never_contains_the_order_until_the_decision(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    a, review = _open_review(reg)
    record_answer(reg, a, 0, "left")
    left, salt = unseal_order(review)
    stored = reg.get_record("reviews", a)
    assert b'candidate_left":[' not in stored and salt.encode() not in stored  # the record itself, too

    res = _cli("review", a, "--registry", str(reg.root), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["review"]
    assert (doc["answered"], doc["pairs"], doc["answered_by"], doc["order"]) == (1, 3, {"ana": 1}, None)
    for leak in ("candidate_left", "preferred", "sealed_order", "seed", "salt", "candidate", "baseline"):
        assert leak not in res.stdout, leak
    text = _cli("review", a, "--registry", str(reg.root)).output
    assert "1/3 pairs answered" in text and "sealed" in text and "candidate on the" not in text

    for k, choice in ((1, "same"), (2, "right")):
        record_answer(reg, a, k, choice)
    res = _cli("review", a, "--reject", "--reviewer", "ana", "--registry", str(reg.root))
    assert res.exit_code == 0, res.output
    doc = json.loads(_cli("review", a, "--registry", str(reg.root), "--json").stdout)["review"]
    assert doc["order"] == {"candidate_left": left, "salt": salt}  # revealed by the decision
    assert [x["preferred"] for x in doc["answers"]] == [
        "candidate" if left[0] else "baseline",
        "same",
        "baseline" if left[2] else "candidate",
    ]
    text = _cli("review", a, "--registry", str(reg.root)).output
    assert f"candidate on the {'left' if left[0] else 'right'}" in text


def test_the_report_of_an_open_review_shows_no_labelled_frames_or_heat_maps(tmp_path):
    from avatar_release.gates.report import write_report

    reg = MemoryRegistry("report")
    a, review = _open_review(reg)
    result, digest = latest_result(reg, a)
    frames = np.zeros((6, 6, 8, 3), np.uint8)
    sealed = write_report(tmp_path / "open", result, digest, frames, frames + 1, review_page="review.html")
    page = sealed.read_text()
    assert "data:image/png" not in page and "Sealed while the blind review is open" in page
    assert "review.html" in page and "<svg" in page  # the link and the PSNR plot stay
    assert "data:image/png" in write_report(tmp_path / "done", result, digest, frames, frames + 1).read_text()


def test_a_sealed_order_moved_from_another_review_does_not_open(tmp_path):
    reg = MemoryRegistry("moved")
    a, review = _open_review(reg)
    other = new_review(latest_result(reg, a)[0], "sha256:" + "d" * 64, PAIRS)
    swapped = review.model_copy(update={"sealed_order": other.sealed_order})
    with pytest.raises(TrustError, match="does not open"):
        unseal_order(swapped)
    with pytest.raises(TrustError, match="sealed with review seal key seal:0"):
        unseal_order(review.model_copy(update={"seal_key_id": "seal:0000000000000000"}))


# ---- accountable -----------------------------------------------------------------------------------


def test_an_unknown_reviewer_or_a_key_that_is_not_theirs_cannot_answer(stranger):
    reg = MemoryRegistry("unknown")
    a, _ = _open_review(reg)
    before = (attestation_refs(reg, a), reg.get_record("reviews", a))
    with pytest.raises(Refusal, match="reviewer 'mallory' is not named by the trust policy"):
        record_answer(reg, a, 0, "left", reviewer="mallory")
    key, kid = stranger
    with pytest.raises(Refusal, match=f"this answer would be signed with {kid}"):
        record_answer(reg, a, 0, "left", reviewer="ana", signer=key)
    with pytest.raises(Refusal, match="reviewer 'mallory' is not named"):
        ReviewServer(reg, a, reviewer="mallory")
    assert (attestation_refs(reg, a), reg.get_record("reviews", a)) == before  # nothing stored


def _request(url: str, body: dict | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_server_refuses_requests_without_its_session_token():
    reg = MemoryRegistry("token")
    a, _ = _open_review(reg)
    server = ReviewServer(reg, a).start()
    try:
        root = server.url.removesuffix(server.token + "/")
        assert server.url.startswith("http://127.0.0.1:") and len(server.token) >= 32
        assert _request(root + "answer", {"pair": 0, "choice": "left"}) == 403
        assert _request(root + "x" * len(server.token) + "/answer", {"pair": 0, "choice": "left"}) == 403
        assert _request(root) == 403 and _request(root + "state") == 403 and _request(root + "heatmap/0.png") == 403
        assert load_review(reg, a).answers == []  # none of that recorded anything
        assert _request(server.url) == 200
        assert _request(server.url + "heatmap/0.png") == 403  # answer first
        assert _request(server.url + "answer", {"pair": 0, "choice": "left"}) == 200
        assert _request(server.url + "heatmap/0.png") == 200
        assert _request(server.url + "answer", {"pair": 0, "choice": "right"}) == 409  # final
    finally:
        server.close()
    [answer] = load_review(reg, a).answers
    assert answer.reviewer == "ana" and answer.choice == "left" and answer.evidence is not None


def test_approval_needs_answers_from_reviewers_the_policy_names(tmp_path, stranger):
    reg = MemoryRegistry("names")
    a, review = _open_review(reg)
    wider, bo_key = _policy_with(tmp_path, "bo")
    for k in range(len(PAIRS)):  # bo answers every pair, under a policy that names bo
        record_answer(reg, a, k, "same", reviewer="bo", signer=bo_key, policy=wider)
    # ... the policy in force names only ana: bo's signed answers do not count
    with pytest.raises(Refusal, match="3 of 3 blind pairs unanswered .no answer signed by a reviewer the trust"):
        decide(reg, a, approve=True, reviewer="ana", note="")
    # a stranger's key signing answers in ana's name does not count either
    key, _ = stranger
    subject = read_manifest(reg, a)[1].content_digest()
    for k, frame in enumerate(review.frames):
        sign_and_store(
            reg,
            key,
            kind="review-answer",
            build_id=a,
            subject_digest=subject,
            predicate={
                "build_id": a,
                "gate_result_digest": review.gate_result_digest,
                "order_commitment": review.order_commitment,
                "pair": k,
                "frame": frame,
                "choice": "same",
                "reviewer": "ana",
                "at": utcnow(),
            },
        )
    with pytest.raises(Refusal, match="3 of 3 blind pairs unanswered"):
        decide(reg, a, approve=True, reviewer="ana", note="")
    assert load_review(reg, a).decision is None
    # under the policy that names bo, the same answers cover every pair, and the decision lists them
    done = decide(reg, a, approve=True, reviewer="ana", note="", policy=wider)
    assert len(done.decision.answers) == 3 and {x.reviewer for x in done.answers} == {"bo"}


def test_a_forged_answer_record_without_a_signature_does_not_count():
    reg = MemoryRegistry("forged")
    a, review = _open_review(reg)
    forged = [
        ReviewAnswer(pair=k, choice="same", at=utcnow(), reviewer="ana", evidence="sha256:" + "e" * 64)
        for k in range(len(PAIRS))
    ]
    save_review(reg, review.model_copy(update={"answers": forged}))  # what write access to the registry allows
    with pytest.raises(
        Refusal,
        match="3 of 3 blind pairs unanswered.*3 answer.s. in the review record carry no "
        "valid signature and do not count",
    ):
        decide(reg, a, approve=True, reviewer="ana", note="")
    status = review_status(reg, a)
    assert status.as_json()["answered"] == 0 and status.unsigned == 3 and status.state == "open"
    r = record_answer(reg, a, 0, "left")  # the forged entry neither blocks the real answer nor survives it
    assert [(x.pair, x.choice, x.evidence != forged[0].evidence) for x in r.answers] == [(0, "left", True)]


def test_a_decision_counts_only_in_the_name_of_the_reviewer_whose_key_signed_it(tmp_path):
    """One signer check decides for the review commands (before signing) and for the promotion
    policy (re-verifying what was signed): a name written into a decision proves nothing."""
    reg = MemoryRegistry("decision-names")
    a, review = _open_review(reg)
    wider, bo_key = _policy_with(tmp_path, "bo")
    for k in range(len(PAIRS)):
        record_answer(reg, a, k, "same", reviewer="bo", signer=bo_key, policy=wider)
    with pytest.raises(Refusal, match="reviewer 'ana': the trust policy .* but this decision would be signed with"):
        decide(reg, a, approve=True, reviewer="ana", note="", signer=bo_key, policy=wider)
    result, digest = latest_result(reg, a)
    subject = read_manifest(reg, a)[1].content_digest()

    def approval(name: str) -> None:  # what bo's key can sign by hand, in any name
        sign_and_store(
            reg,
            bo_key,
            kind="review-decision",
            build_id=a,
            subject_digest=subject,
            predicate={
                "build_id": a,
                "gate_result_digest": digest,
                "decision": "approved",
                "reviewer": name,
                "note": "",
                "at": utcnow(),
                "answers": [x.evidence for x in load_review(reg, a).answers],
                "order_commitment": review.order_commitment,
            },
        )

    approval("ana")
    outcome = review_outcome(reg, a, result, digest, subject, wider, 1)
    assert outcome.status == "needs-review" and outcome.approvers == ()
    assert outcome.ignored == ("a decision names reviewer 'ana', whose key did not sign it",)
    approval("bo")  # past the signer check: judged on the review itself (this result lists no frames below)
    outcome = review_outcome(reg, a, result, digest, subject, wider, 1)
    assert outcome.ignored[1:] == (
        "approval by bo: the review's pairs are not the frames the signed gate result put below the band",
    )


# ---- the seal, the page, the server's own state ---------------------------------------------------


def test_a_sealed_text_opens_only_under_its_own_key_and_associated_data(tmp_path, monkeypatch):
    monkeypatch.setenv(SEAL_KEY_ENV, str(tmp_path / "missing.key"))
    with pytest.raises(InputError, match=r"missing.key: no such file \(AVATAR_RELEASE_REVIEW_SEAL_KEY\)"):
        load_seal_key()  # a named key is never made up
    monkeypatch.delenv(SEAL_KEY_ENV)
    monkeypatch.setenv("AVATAR_RELEASE_CONFIG_DIR", str(tmp_path / "config"))
    key = load_seal_key()  # first use: a secret of 32 random bytes, 0600
    assert key.path == tmp_path / "config" / "keys" / "review-seal.key"
    assert key.path.stat().st_mode & 0o777 == 0o600 and len(key.path.read_text().strip()) == 64
    assert load_seal_key() == key and key.key.hex() not in repr(key)  # the same key next time; never printed
    sealed = seal(key, b"the order", b"this review")
    assert unseal(key, sealed, b"this review") == b"the order"
    with pytest.raises(TrustError, match=f"does not open under seal key {key.key_id}"):
        unseal(key, sealed, b"another review")
    (tmp_path / "other.key").write_text("ab" * 32)
    monkeypatch.setenv(SEAL_KEY_ENV, str(tmp_path / "other.key"))
    other = load_seal_key()
    assert other.key_id != key.key_id
    with pytest.raises(TrustError, match="does not open"):
        unseal(other, sealed, b"this review")


def test_the_blind_page_is_package_data_with_every_slot_filled_and_escaped():
    template = files("avatar_release.gates").joinpath("review_page.html").read_text(encoding="utf-8")
    assert "{{pairs_json}}" in template and "{{build_id}}" in template
    reg = MemoryRegistry("page")
    _, review = _open_review(reg)
    decided = review.model_copy(update={"build_id": "<b>&", "candidate_left": [True, False, True], "order_salt": "s"})
    frames = np.zeros((3, 6, 8, 3), np.uint8)
    page = review_page(decided, frames, frames + 1)
    assert "{{" not in page and page.count("data:image/png;base64,") == 6
    assert "review &lt;b&gt;&amp; --serve" in page and "<b>&" not in page
    assert "candidate" not in page.lower() and "baseline" not in page.lower()


class _SlowWrites(MemoryRegistry):
    """Once ``slow`` is set, every record write takes a while: an answer checked while another
    is being stored would not see it."""

    slow = False

    def update_record(self, namespace: str, name: str, update: Callable[[bytes | None], bytes]) -> bytes:
        if self.slow:
            time.sleep(0.2)
        return super().update_record(namespace, name, update)


def test_concurrent_answers_to_one_pair_through_the_server_record_exactly_one():
    reg = _SlowWrites("race")
    a, _ = _open_review(reg)
    before = len(attestation_refs(reg, a))
    reg.slow = True
    server = ReviewServer(reg, a).start()
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(
                pool.map(
                    lambda c: _request(server.url + "answer", {"pair": 0, "choice": c}), ["left", "right", "same"] * 2
                )
            )
    finally:
        server.close()
    assert sorted(codes) == [200, 409, 409, 409, 409, 409]
    assert len(attestation_refs(reg, a)) == before + 1  # one signed answer stored, not one per request
    assert len(load_review(reg, a).answers) == 1 and len(review_status(reg, a).signed) == 1
