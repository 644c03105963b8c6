"""Gate logic without rendering: verdicts, tiers, gate set layout, blind review rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from avatar_release.errors import InputError, IntegrityError, NotFoundError, Refusal, SpecError
from avatar_release.gates import _compare as C
from avatar_release.gates.review import decide, new_review, record_answer, review_page, unseal_order
from avatar_release.gates.store import latest_result, load_review, save_result, save_review
from avatar_release.gates.tier import decide_tier, load_levers
from avatar_release.records import (
    Band,
    BlobRef,
    EnvironmentRecord,
    GateEvidence,
    GateRequestRecord,
    GateResult,
    GateSetRecord,
    LeverRecord,
    Manifest,
    parse_record,
)
from avatar_release.records.gate import (
    BitExactDetails,
    SimilarityBandDetails,
    TwinBaselineDetails,
    ZeroRecompileDetails,
)
from avatar_release.registry import MemoryRegistry
from tests.helpers import cpu_manifest

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return cpu_manifest()


def _gs(frames: int = 4, requests: int = 2) -> GateSetRecord:
    return GateSetRecord(
        name="t",
        version=1,
        digest="sha256:" + "0" * 64,
        requests=[
            GateRequestRecord(name=f"r{i}", image_variant=i, audio_variant=0, seed=0, frames=frames, buckets=["f8"])
            for i in range(requests)
        ],
    )


def _frames(n: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 6, 8, 3), dtype=np.uint8)


def _band(floor: float, ceiling: int = 1) -> Band:
    env = EnvironmentRecord(
        fingerprint="sha256:" + "1" * 64,
        backend="cpu",
        platform_version="x",
        device_kind="cpu",
        device_count=8,
        jax="0",
        jaxlib="0",
    )
    return Band(
        pipeline="tiny",
        target="cpu-8",
        psnr_floor_db=floor,
        max_abs_diff_ceiling=ceiling,
        margin_db=0,
        reference_build="b",
        reference_digest="sha256:" + "2" * 64,
        variants=[],
        gate_set=_gs(),
        environment=env,
        tool={},
        measured_at="now",
        method="test",
    )


# ---- verdicts -------------------------------------------------------------------------------------


def test_zero_recompile_names_every_compile_with_its_stage():
    ok = C.zero_recompile([("a", 0, []), ("b", 0, [])])
    assert ok.status == "passed"
    bad = C.zero_recompile(
        [
            ("a", 0, []),
            ("b", 2, [{"during": "stage sr/f8 (inputs latents(8,))"}, {"during": "stage vae/f8 (inputs x(1,))"}]),
        ]
    )
    evidence = bad.details_as(ZeroRecompileDetails)
    assert bad.status == "failed" and evidence.compiles == 2 and [e["run"] for e in evidence.events] == ["b", "b"]
    assert "stage sr/f8 (inputs latents(8,))" in bad.summary and "stage vae/f8" in bad.summary


def test_twin_gate_reports_where_the_twins_diverge():
    a = _frames()
    a[5, 0, 0, 0] = 100
    b = a.copy()
    b[5, 0, 0, 0] = 103
    gs = _gs()
    ha = [C.frame_label(gs, i) + "h" for i in range(8)]  # any distinct strings do
    hb = list(ha)
    hb[5] = "different"
    ev = C.twin_baseline(gs, ha, hb, a, b)
    assert ev.status == "failed"
    first = ev.details_as(TwinBaselineDetails).first
    assert first.label == "r1 frame 1" and first.frame == 5 and first.max_abs_diff == 3
    assert "non-deterministic" in ev.summary and "1 of 8" in ev.summary
    assert C.twin_baseline(gs, ha, ha, a, a).status == "passed"


def test_bit_exact_lists_differing_frames_with_size_of_the_difference():
    base = _frames()
    cand = base.copy()
    cand[2] = np.clip(cand[2].astype(int) + 1, 0, 255).astype(np.uint8)
    from avatar_release.gates.metrics import frame_sha256

    ev = C.bit_exact(_gs(), [frame_sha256(f) for f in cand], [frame_sha256(f) for f in base], cand, base)
    evidence = ev.details_as(BitExactDetails)
    assert ev.status == "failed" and evidence.differing_frames == 1
    [row] = evidence.frames
    assert row.frame == 2 and row.max_abs_diff == 1 and 40 < row.psnr_db < 60
    same = C.bit_exact(_gs(), [frame_sha256(f) for f in base], [frame_sha256(f) for f in base], base, base)
    assert same.status == "passed"


def test_band_passes_only_when_every_frame_is_inside():
    base = _frames()
    cand = base.copy()
    cand[3, :2, :2, 0] ^= 1  # a few one-level flips in one frame
    psnr3 = C.per_frame_psnr(cand, base)[3]
    assert C.similarity_band(_gs(), cand, base, _band(psnr3 - 0.01)).status == "passed"
    below = C.similarity_band(_gs(), cand, base, _band(psnr3 + 0.01))
    assert below.status == "below-band" and below.details_as(SimilarityBandDetails).frames_below == [3]
    assert "needs a blind review" in below.summary
    assert C.similarity_band(_gs(), cand, base, _band(0.0, ceiling=0)).status == "below-band"  # ceiling


# ---- typed evidence ------------------------------------------------------------------------------


def test_every_verdict_reads_as_its_gates_typed_evidence():
    """What each gate writes fits its model exactly (the models forbid unknown fields)."""
    from avatar_release.gates.metrics import frame_sha256

    gs, base = _gs(), _frames()
    cand = base.copy()
    cand[6] ^= 1
    hb, hc = [frame_sha256(f) for f in base], [frame_sha256(f) for f in cand]
    zr = C.zero_recompile([("a", 0, []), ("b", 0, [])]).details_as(ZeroRecompileDetails)
    assert zr.runs == ["a", "b"] and zr.compiles is None and zr.hosts is None
    assert C.twin_baseline(gs, hb, hb[:7], base, base[:7]).details_as(TwinBaselineDetails).frames == [8, 7]
    twin = C.twin_baseline(gs, hb, hc, base, cand).details_as(TwinBaselineDetails)
    assert twin.differing_frames == 1 and twin.frames == [6] and twin.first.label == "r1 frame 2"
    be = C.bit_exact(gs, hc, hb, cand, None).details_as(BitExactDetails)
    assert be.frames[0].frame == 6 and be.frames[0].max_abs_diff is None and be.lowest_psnr_db is None
    assert C.bit_exact(gs, hb, hb, base, base).details_as(BitExactDetails).frames is None
    band = C.similarity_band(gs, cand, base, _band(99.0)).details_as(SimilarityBandDetails)
    assert band.frames_below == [6] and band.per_frame_psnr_db[0] is None and band.psnr_floor_db == 99.0
    with pytest.raises(TypeError, match="bit-exact evidence read as SimilarityBandDetails"):
        C.bit_exact(gs, hb, hb, base, base).details_as(SimilarityBandDetails)


def test_a_stored_gate_result_reads_typed_and_writes_back_unchanged():
    """The typed evidence is a view: the stored record's bytes, fields and schema stay as they were."""
    raw = (DATA / "gate-result.v1.json").read_bytes()
    result = parse_record(GateResult, raw, where="stored v1")
    assert result.model_dump(mode="json", exclude_unset=True) == json.loads(raw)
    zr = result.evidence(ZeroRecompileDetails)
    assert zr.imports == [] and zr.runs == ["twin #1", "twin #2"] and zr.hosts is None  # older than hosts
    assert result.evidence(TwinBaselineDetails).first is None
    assert result.evidence(BitExactDetails) is None and result.band_used() is None


def test_evidence_that_does_not_fit_its_model_is_an_integrity_error_naming_the_field():
    def band(details: dict) -> GateEvidence:
        return GateEvidence(name="similarity-band", status="below-band", summary="x", details=details)

    with pytest.raises(IntegrityError, match=r"similarity-band evidence: frames_below\.0: Input should be a valid int"):
        band({"frames_below": ["3"]}).details_as(SimilarityBandDetails)  # no coercion of signed evidence
    with pytest.raises(IntegrityError, match="similarity-band evidence: frames: Extra inputs are not permitted"):
        band({"frames": [3]}).details_as(SimilarityBandDetails)
    result = GateResult.model_validate(
        {**json.loads((DATA / "gate-result.v1.json").read_bytes()), "band": {"path": "b.json", "psnr_floor_db": 40.0}}
    )
    with pytest.raises(IntegrityError, match="gate result band: digest: Field required"):
        result.band_used()


def test_added_evidence_is_checked_and_only_the_fields_set_are_written():
    zr = C.zero_recompile([("twin #1", 0, []), ("twin #2", 0, [])])
    more = zr.with_details(ZeroRecompileDetails(imports=[], hosts={"twin #1": "pod-a", "twin #2": "pod-b"}))
    assert more.details == {
        "runs": ["twin #1", "twin #2"],
        "imports": [],
        "hosts": {"twin #1": "pod-a", "twin #2": "pod-b"},
    }
    assert zr.details == {"runs": ["twin #1", "twin #2"]}  # records are frozen: a copy


# ---- tiers ----------------------------------------------------------------------------------------


def _variant(m: Manifest, **changes) -> Manifest:
    return m.model_copy(update=changes)


def _declared(*keys: str, effect: str = "reassociation") -> dict[str, LeverRecord]:
    return {k: LeverRecord(effect=effect) for k in keys}


def test_declared_levers_make_a_candidate_tier_2(manifest):
    """Levers are the pipeline's: each v4 manifest records the ones its pipeline declared."""
    levers = load_levers()
    base = _variant(manifest, levers=_declared("matmul_k_split", "residual_dtype"))
    cand = _variant(
        base, overrides={**manifest.overrides, "matmul_k_split": "2"}, config={**manifest.config, "matmul_k_split": 2}
    )
    d = decide_tier(cand, base, levers)
    assert d.tier == 2 and "matmul_k_split" in d.reasons[0]
    bf16 = _variant(base, overrides={"residual_dtype": "bfloat16"})
    assert decide_tier(bf16, base, levers).tier == 2


def test_a_lever_counts_only_where_both_pipelines_declare_it_alike(manifest):
    levers = load_levers()
    change = {"overrides": {**manifest.overrides, "matmul_k_split": "2"}}
    # Declared by the candidate alone (a build cannot vouch for itself against prod): tier 1.
    alone = _variant(manifest, levers=_declared("matmul_k_split"), **change)
    d = decide_tier(alone, _variant(manifest, levers={}), levers)
    assert d.tier == 1 and "not a lever both builds' pipelines declare" in d.reasons[0]
    # Declared by both, with another effect: tier 1 as well.
    other = _variant(manifest, levers=_declared("matmul_k_split", effect="precision"))
    assert decide_tier(_variant(alone, **change), other, levers).tier == 1
    # Declared by neither: no override is a lever.
    neither = _variant(manifest, levers={})
    assert decide_tier(_variant(neither, **change), neither, levers).tier == 1


def test_anything_undeclared_keeps_tier_1(manifest):
    levers = load_levers()
    weights = manifest.weights.model_copy(update={"raw_digest": "sha256:" + "9" * 64})
    d = decide_tier(_variant(manifest, weights=weights), manifest, levers)
    assert d.tier == 1 and any("weights" in r for r in d.reasons)
    # an undeclared override, even next to a declared one, keeps tier 1
    mixed = _variant(manifest, overrides={"matmul_k_split": "2", "dit.steps": "2"})
    assert decide_tier(mixed, manifest, levers).tier == 1
    assert decide_tier(manifest, manifest, levers).tier == 1  # identical: bit-exact expected
    src = _variant(manifest, source_digest="sha256:" + "8" * 64)
    assert decide_tier(src, manifest, levers).tier == 1


def test_a_missing_levers_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError, match="levers.toml: missing"):
        load_levers(tmp_path / "levers.toml")


# ---- gate set ------------------------------------------------------------------------------------


def test_gate_set_covers_every_bucket_with_at_least_three_chunks(manifest):
    from avatar_release.gates.gateset import gate_set

    gs = gate_set(manifest)
    assert len(gs.requests) == 4 and {(r.image_variant, r.audio_variant) for r in gs.requests} == {
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    }
    assert all(len(r.buckets) >= 3 for r in gs.requests)
    assert gate_set(manifest).digest == gs.digest  # deterministic
    two = manifest.model_copy(
        update={"buckets": [manifest.buckets[0], manifest.buckets[0].model_copy(update={"name": "f4", "frames": 4})]}
    )
    gs2 = gate_set(two)
    assert set(gs2.requests[0].buckets) == {"f8", "f4"} and gs2.digest != gs.digest


# ---- blind review --------------------------------------------------------------------------------


def _result(manifest, status="needs-review") -> GateResult:
    env = _band(0).environment
    return GateResult(
        status=status,
        build_id="tiny-cpu-8-aaaaaaaaaaaa",
        build_digest="sha256:" + "a" * 64,
        pipeline="tiny",
        target="cpu-8",
        baseline=None,
        tier=2,
        environment=env,
        tool={},
        gate_set=_gs(),
        gates=[GateEvidence(name="similarity-band", status="below-band", summary="x")],
        frame_sha256=[],
        frames_blob=BlobRef(digest="sha256:" + "b" * 64, size=1, media_type="x"),
        created_at="now",
        created_by="test",
    )


def test_review_order_is_sealed_behind_a_salted_commitment_and_capped(manifest):
    from avatar_release._digest import canonical_json, sha256_digest

    r = _result(manifest)
    a = new_review(r, "sha256:" + "c" * 64, list(range(100)), seed=7)
    b = new_review(r, "sha256:" + "c" * 64, list(range(100)), seed=7)
    assert len(a.frames) == 24 and a.sealed and a.candidate_left is None and a.seed is None
    (left_a, salt_a), (left_b, salt_b) = unseal_order(a), unseal_order(b)
    assert left_a == left_b and 4 < sum(left_a) < 20  # the seed drew the same order; both sides occur
    # the same order commits differently (a fresh salt each time): the record cannot be matched to it
    assert salt_a != salt_b and a.order_commitment != b.order_commitment
    assert a.order_commitment == sha256_digest(canonical_json({"candidate_left": left_a, "salt": salt_a}))
    assert b'candidate_left":[' not in a.to_json_bytes() and salt_a not in a.to_json_bytes().decode()
    with pytest.raises(InputError):
        new_review(r, "sha256:" + "c" * 64, [])


def test_page_never_says_which_side_is_the_candidate(manifest):
    rv = new_review(_result(manifest), "sha256:" + "c" * 64, [0, 1, 2], seed=1)
    page = review_page(rv, _frames(3, 1), _frames(3, 2)).lower()
    assert "candidate" not in page and "baseline" not in page
    assert page.count("data:image/png;base64,") == 6


def test_answers_are_final_and_approval_needs_all_of_them(manifest):
    from tests.release_records import publish_stand_in

    reg = MemoryRegistry("review")
    publish_stand_in(reg, "a")  # tiny-cpu-8-aaaaaaaaaaaa: answers and the decision are signed about the published build
    result = _result(manifest)
    digest = save_result(reg, result)
    rv = new_review(result, digest, [3, 5], seed=3)
    save_review(reg, rv)
    with pytest.raises(Refusal, match="2 of 2 blind pairs unanswered"):
        decide(reg, result.build_id, approve=True, reviewer="ana", note="")
    r = record_answer(reg, result.build_id, 0, "left")
    [a0] = r.answers
    assert (a0.reviewer, a0.choice, a0.preferred) == ("ana", "left", None)  # resolved only at the decision
    assert a0.evidence.startswith("sha256:") and r.sealed
    with pytest.raises(Refusal, match="already answered .by ana."):
        record_answer(reg, result.build_id, 0, "right")
    with pytest.raises(InputError):
        record_answer(reg, result.build_id, 9, "left")
    with pytest.raises(InputError):
        record_answer(reg, result.build_id, 1, "up")
    with pytest.raises(Refusal, match="1 of 2 blind pairs unanswered"):
        decide(reg, result.build_id, approve=True, reviewer="ana", note="")
    record_answer(reg, result.build_id, 1, "same")
    done = decide(reg, result.build_id, approve=True, reviewer="ana", note="looks identical")
    assert done.decision.decision == "approved" and load_review(reg, result.build_id) == done
    left, salt = unseal_order(rv)
    assert done.candidate_left == left and done.order_salt == salt  # revealed, checkable against the commitment
    assert [a.preferred for a in done.answers] == [("candidate" if left[0] else "baseline"), "same"]
    assert done.decision.answers == [a.evidence for a in done.answers]
    assert done.decision.order_commitment == rv.order_commitment
    with pytest.raises(Refusal, match="decisions are final"):
        decide(reg, result.build_id, approve=False, reviewer="bo", note="")


def test_only_a_build_that_needs_review_can_be_decided(manifest):
    reg = MemoryRegistry("review2")
    with pytest.raises(NotFoundError, match="no gate result"):
        decide(reg, "tiny-cpu-8-aaaaaaaaaaaa", approve=False, reviewer="x", note="")
    save_result(reg, _result(manifest, status="passed"))
    with pytest.raises(Refusal, match="only a build that needs review"):
        decide(reg, "tiny-cpu-8-aaaaaaaaaaaa", approve=False, reviewer="x", note="")


def test_results_accumulate_newest_last(manifest):
    reg = MemoryRegistry("results")
    first = save_result(reg, _result(manifest, status="failed"))
    second = save_result(reg, _result(manifest, status="passed").model_copy(update={"created_at": "later"}))
    got, digest = latest_result(reg, "tiny-cpu-8-aaaaaaaaaaaa")
    assert digest == second != first and got.status == "passed"
    raw = json.loads(reg.get_record("gate-results", "tiny-cpu-8-aaaaaaaaaaaa"))
    assert [r["digest"] for r in raw["results"]] == [first, second]


def test_heatmap_shows_any_difference():
    from avatar_release.gates.report import heatmap, psnr_plot_svg

    a = _frames(1)[0]
    b = a.copy()
    b[1, 1, 2] ^= 1
    h = heatmap(a, b)
    assert h[1, 1].max() > 0 and h[0, 0].max() == 0
    svg = psnr_plot_svg([60.0, float("inf"), 55.0], 58.0, [1])
    assert svg.startswith("<svg") and "band floor 58.00 dB" in svg and svg.count("<circle") == 3
    assert "per-frame PSNR" in svg and "SNR" not in svg.replace("PSNR", "")
    # an audio or tensors build's plot is per chunk and names its metric: SNR, never PSNR
    snr = psnr_plot_svg([40.0, float("inf")], 35.0, [], metric="SNR", unit="chunk")
    assert "per-chunk SNR" in snr and "SNR dB vs baseline" in snr and "PSNR" not in snr
