"""Each gate saying no for the right reason, on real tiny builds rendered in fresh processes.

One module-scoped registry: the reference is gated alone (the session's gated build), the band is
calibrated here (that reference, whose passing verdict already holds its twin renders and frames,
and two reassociation variants rendered fresh), and each test takes the candidate it needs from the
session's build cache or compiles it. One candidate, a build with one changed weight, is gated once
against prod (in a copy of the registry whose prod holds the reference): the tier-1 test reads that
verdict, and the test of what a failed verdict against prod forbids starts from it.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.compile import compile_build
from avatar_release.errors import EnvironmentMismatch, SpecError
from avatar_release.gates import calibrate, effective_status, load_band, run_gate
from avatar_release.gates.gateset import gate_set
from avatar_release.gates.store import get_frames, latest_result, load_review, save_result
from avatar_release.records.gate import (
    BitExactDetails,
    SimilarityBandDetails,
    TwinBaselineDetails,
    ZeroRecompileDetails,
)
from avatar_release.registry import LocalRegistry, read_manifest
from tests.browser import Browser
from tests.tools import binary


@pytest.fixture(scope="module")
def gated(tmp_path_factory, build_cache, gated_registry):
    """The session's tiny build as gated on its own (``gated_registry``: its verdict and report), in a
    registry of this module's where the band is calibrated with that build as the reference."""
    shared, build, verdict = gated_registry
    root = tmp_path_factory.mktemp("gates")
    shutil.copytree(shared, root / "reg")
    reg = LocalRegistry(root / "reg")
    with pytest.MonkeyPatch.context() as mp:  # the reference and its variants from the session's builds
        mp.setattr("avatar_release.compile.compile_build", build_cache.in_place_of_compile_build())
        cal = calibrate("tiny", "cpu-8", registry=reg, out=root / "band.json")
    ref = cal.band.reference_build
    assert ref == build.build_id  # the session's gated build is the calibration's reference
    return SimpleNamespace(root=root, reg=reg, band_file=root / "band.json", cal=cal, ref=ref, ref_outcome=verdict)


@pytest.fixture(scope="module")
def against_prod(gated, build_cache, tmp_path_factory):
    """A copy of the registry whose prod holds the reference (its first release), and a candidate
    with one changed weight gated there once through the CLI against prod (the default baseline):
    ``gate`` is that command's result, read by the tests that are about its verdict."""
    import torch

    from model.config import get_config
    from model.weights import init_pipeline, save_weights

    root = tmp_path_factory.mktemp("against-prod")
    shutil.copytree(gated.reg.root, root / "reg")
    reg = LocalRegistry(root / "reg")
    with pytest.MonkeyPatch.context() as mp:  # this registry's signed state, seen by this fixture only
        mp.setenv("AVATAR_RELEASE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
        for args in (["promote", gated.ref, "--to", "staging"], ["promote", "staging", "--to", "prod"]):
            res = _cli(*args, "--registry", str(reg.root))
            assert res.exit_code == 0, res.output  # the first release: prod was empty
        pipe = init_pipeline(get_config("tiny"), seed=0)
        with torch.no_grad():
            w = pipe.vae.conv_out.weight
            w[0, 0, 1, 1] = w[0, 0, 1, 1] * 1.5 + 0.01
        save_weights(pipe, root / "w.safetensors")
        cand = build_cache.compile(
            "tiny", "cpu-8", registry=reg, weights_path=str(root / "w.safetensors"), move_dev=False
        )
        gate = _cli(
            "gate",
            cand.build_id,
            "--registry",
            str(reg.root),
            "--report",
            str(root / "rep"),
            "--band",
            str(gated.band_file),
            "--json",
        )
    return SimpleNamespace(reg=reg, cand=cand, gate=gate, report=root / "rep")


def _cli(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_calibration_measures_the_band_from_reassociation_and_records_provenance(gated):
    band, digest, path = load_band("tiny", "cpu-8", gated.band_file)
    assert digest == gated.cal.digest and path == gated.band_file
    assert [v.overrides for v in band.variants] == [{"matmul_k_split": "2"}, {"matmul_k_split": "4"}]
    lowest = min(v.min_psnr_db for v in band.variants)
    assert band.psnr_floor_db <= lowest - band.margin_db < band.psnr_floor_db + 0.011
    assert band.max_abs_diff_ceiling == max(v.max_abs_diff for v in band.variants) >= 1
    for v in band.variants:  # each variant is a real, different build in the registry
        assert gated.reg.resolve(v.build_id).build_id == v.build_id != band.reference_build
        assert v.identical_frames < v.frames  # reassociation really changed pixels
    _, manifest = read_manifest(gated.reg, band.reference_build)
    assert band.gate_set.digest == gate_set(manifest).digest
    assert band.environment.device_count == 8 and band.environment.fingerprint.startswith("sha256:")
    # The reference's frames: its own signed passing verdict's (identical twins on this machine), named.
    assert f"signed passing gate verdict {gated.ref_outcome.digest}" in band.method


def test_a_reference_verdict_from_another_machine_or_gate_set_is_rendered_again(gated):
    """Only a verdict whose twins ran on a machine like this one, on the same gate set, stands in
    for the reference's two renders."""
    from avatar_release.gates.band_reference import stored_reference

    _, manifest = read_manifest(gated.reg, gated.ref)
    gs, here = gate_set(manifest), gated.cal.band.environment
    found = stored_reference(gated.reg, gated.ref, manifest, gs, here)
    assert found is not None and found.verdict == gated.ref_outcome.digest
    assert found.frames.shape[0] == gs.frames and found.frames.dtype.name == "uint8"
    other_gs = gs.model_copy(update={"digest": "sha256:" + "0" * 64})
    assert stored_reference(gated.reg, gated.ref, manifest, other_gs, here) is None
    k4 = gated.cal.band.variants[1].build_id  # compiled, never gated
    assert stored_reference(gated.reg, k4, read_manifest(gated.reg, k4)[1], gs, here) is None
    elsewhere = here.model_copy(update={"fingerprint": "sha256:" + "1" * 64})
    assert stored_reference(gated.reg, gated.ref, manifest, gs, elsewhere) is None


def test_a_first_build_passes_on_its_own_in_fresh_serving_processes(gated):
    r = gated.ref_outcome.result
    assert r.status == "passed" and r.baseline is None and r.tier is None
    assert [(g.name, g.status) for g in r.gates] == [("zero-recompile", "passed"), ("twin-baseline", "passed")]
    assert r.evidence(ZeroRecompileDetails).imports == []  # the pods never imported torch or the compiler
    # the pairs tiny's [gate] table names (manifests/pipelines/tiny.toml), three chunks each
    assert [q.name for q in r.gate_set.requests] == ["image0-audio0", "image1-audio0"]
    assert all(len(q.buckets) >= 3 for q in r.gate_set.requests)
    stored, digest = latest_result(gated.reg, gated.ref)
    assert digest == gated.ref_outcome.digest and stored == r
    frames = get_frames(gated.reg, r.frames_blob)
    assert frames.shape[0] == r.gate_set.frames == sum(len(h) for h in r.frame_sha256)
    page = gated.ref_outcome.report.read_text()
    assert "passed" in page and "twin-baseline" in page and page.count("data:image/png") >= 4
    assert json.loads((gated.ref_outcome.report.parent / "result.json").read_text())["status"] == "passed"


def test_reassociation_is_not_bit_exact_but_stays_inside_the_band(gated):
    k2 = gated.cal.band.variants[0].build_id
    out = run_gate(k2, gated.reg, baseline=gated.ref, band_file=gated.band_file, report_dir=gated.root / "rep-k2")
    r = out.result
    assert r.status == "passed" and r.tier == 2 and "matmul_k_split" in r.tier_reasons[0]
    assert r.gate("bit-exact").status == "failed" and r.evidence(BitExactDetails).differing_frames > 0
    band = r.gate("similarity-band")
    assert band.status == "passed"
    assert band.details_as(SimilarityBandDetails).min_psnr_db >= gated.cal.band.psnr_floor_db
    assert r.baseline.build_id == gated.ref and r.baseline.gate_result_digest == gated.ref_outcome.digest
    assert "<svg" in out.report.read_text()  # the per-frame PSNR plot


def test_one_changed_weight_fails_bit_exact_as_tier_1(gated, against_prod):
    res = against_prod.gate  # `gate CANDIDATE --registry R --report DIR --band FILE --json`, prod holding the reference
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    r = doc["result"]
    assert doc["status"] == "failed" and r["tier"] == 1 and any("weights" in x for x in r["tier_reasons"])
    assert r["baseline"]["build_id"] == gated.ref  # prod's build
    # Each twin run's chunks are reported as the fresh process renders them (stderr; stdout is the document).
    chunks = len(r["gate_set"]["requests"]) and sum(len(q["buckets"]) for q in r["gate_set"]["requests"])
    for twin in ("twin run 1 of 2", "twin run 2 of 2"):
        assert f"  {twin}: 1/{chunks} chunk" in res.stderr and f"  {twin}: {chunks}/{chunks} chunks" in res.stderr
    gates = {g["name"]: g for g in r["gates"]}
    assert gates["zero-recompile"]["status"] == gates["twin-baseline"]["status"] == "passed"
    be = gates["bit-exact"]
    assert be["status"] == "failed" and be["details"]["differing_frames"] > 0
    first = be["details"]["frames"][0]
    assert first["max_abs_diff"] >= 1 and first["psnr_db"] is not None and "frame" in first["label"]
    assert gates["similarity-band"]["status"] == "skipped" and "tier 1" in gates["similarity-band"]["summary"]


def test_bf16_residual_stream_falls_below_the_band_and_a_blind_review_decides(gated, build_cache, tmp_path):
    exe = binary("chromium")
    cand = build_cache.compile(
        "tiny", "cpu-8", registry=gated.reg, overrides={"residual_dtype": "bfloat16"}, move_dev=False
    )
    out = run_gate(cand.build_id, gated.reg, baseline=gated.ref, band_file=gated.band_file, report_dir=tmp_path / "rep")
    r = out.result
    assert r.status == "needs-review" and r.tier == 2
    band = r.gate("similarity-band")
    assert band.status == "below-band"
    assert band.details_as(SimilarityBandDetails).min_psnr_db < gated.cal.band.psnr_floor_db
    assert out.review_page.is_file() and "review.html" in out.report.read_text()
    # While the review is open the report holds no labelled frames or heat maps, the record no order.
    assert "data:image/png" not in out.report.read_text()
    review = load_review(gated.reg, cand.build_id)
    assert review.gate_result_digest == out.digest and review.frames
    assert review.sealed and review.order_commitment and review.candidate_left is None
    assert set(review.frames) <= set(band.details_as(SimilarityBandDetails).frames_below)
    assert effective_status(gated.reg, cand.build_id)[0] == "needs-review"

    # Approval is refused before the blind answers exist.
    res = _cli("review", cand.build_id, "--approve", "--reviewer", "ana", "--registry", str(gated.reg.root))
    assert res.exit_code == 1 and "unanswered" in res.output

    from avatar_release.gates.review import ReviewServer

    server = ReviewServer(gated.reg, cand.build_id).start()
    browser = Browser(exe)
    try:
        browser.open(server.url)
        n = len(review.frames)
        assert browser.wait_for("document.getElementById('counter').textContent") == f"Pair 1 of {n}"
        text = browser.eval("document.body.innerText").lower()
        assert "candidate" not in text and "baseline" not in text
        # The heat map is refused until the pair is answered; without the session token, everything is.
        assert browser.eval("fetch('heatmap/0.png').then(r => r.status)") == 403
        assert (
            browser.eval(
                "fetch('/answer', {method: 'POST', body: JSON.stringify({pair: 0, choice: 'left'})})"
                ".then(r => r.status)"
            )
            == 403
        )
        choices = ["left", "right", "same"]
        for k in range(n):
            if k:
                browser.eval("document.getElementById('next').click()")
                browser.wait_for(f"document.getElementById('counter').textContent === 'Pair {k + 1} of {n}'")
            assert browser.eval("document.querySelector('#heat img')") is None
            browser.eval(f"document.querySelector('button[data-choice={choices[k % 3]}]').click()")
            browser.wait_for(
                "(() => { const i = document.querySelector('#heat img');"
                " return i && i.complete && i.naturalWidth > 0; })()"
            )
        assert browser.wait_for("!document.getElementById('done').hidden")
    finally:
        browser.close()
        server.close()

    recorded = load_review(gated.reg, cand.build_id)
    assert [a.choice for a in recorded.answers] == [choices[k % 3] for k in range(len(review.frames))]
    assert {a.reviewer for a in recorded.answers} == {"ana"} and all(a.evidence for a in recorded.answers)
    assert {a.preferred for a in recorded.answers} == {None} and recorded.sealed  # resolved at the decision
    res = _cli("review", cand.build_id, "--registry", str(gated.reg.root), "--json")
    status = json.loads(res.stdout)["review"]
    assert status["answered"] == len(review.frames) and status["order"] is None
    assert "candidate_left" not in res.stdout and "preferred" not in res.stdout
    res = _cli(
        "review",
        cand.build_id,
        "--reject",
        "--reviewer",
        "ana",
        "--note",
        "mouth edges shimmer",
        "--registry",
        str(gated.reg.root),
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["review"]["decision"]["decision"] == "rejected"
    decided = load_review(gated.reg, cand.build_id)
    assert decided.decision.answers == [a.evidence for a in decided.answers]
    for a in decided.answers:  # the decision resolved each side from the revealed order
        if a.choice != "same":
            cand_left = decided.candidate_left[a.pair]
            assert a.preferred == ("candidate" if (a.choice == "left") == cand_left else "baseline")
    assert effective_status(gated.reg, cand.build_id)[0] == "rejected"
    res = _cli("review", cand.build_id, "--approve", "--reviewer", "bo", "--registry", str(gated.reg.root))
    assert res.exit_code == 1 and "decisions are final" in res.output


def test_a_build_that_compiles_while_serving_fails_zero_recompile(gated, tmp_path):
    cand = compile_build("tiny", "cpu-8", registry=gated.reg, executable_format="jax-export", move_dev=False)
    r = run_gate(cand.build_id, gated.reg, baseline="none").result
    assert r.status == "failed"
    zr = r.gate("zero-recompile")
    assert zr.status == "failed" and zr.details_as(ZeroRecompileDetails).compiles >= 3
    assert "stage dit/f8 (inputs image(48, 80, 3):uint8" in zr.summary and "stage vae/f8" in zr.summary
    assert r.gate("twin-baseline").status == "passed"  # it is deterministic, it just compiles


def test_a_non_deterministic_build_fails_the_twin_baseline(gated, tmp_path, monkeypatch):
    from avatar_release.specs import manifests_dir

    manifests = tmp_path / "manifests"
    shutil.copytree(manifests_dir(), manifests)
    spec = (manifests / "pipelines" / "tiny.toml").read_text()
    spec = spec.replace('name = "tiny"', 'name = "tiny-entropy"').replace(
        'config = "tiny"', 'config = "tiny"\nnoise = "entropy"'
    )
    (manifests / "pipelines" / "tiny-entropy.toml").write_text(spec)
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(manifests))
    cand = compile_build("tiny-entropy", "cpu-8", registry=gated.reg, move_dev=False)
    assert cand.manifest.program.noise_recipe == "os-entropy-standard-normal/v1"
    r = run_gate(cand.build_id, gated.reg, baseline="none").result
    twin = r.gate("twin-baseline")
    assert r.status == "failed" and twin.status == "failed" and "non-deterministic" in twin.summary
    evidence = twin.details_as(TwinBaselineDetails)
    assert evidence.first.label == "image0-audio0 frame 0" and evidence.differing_frames == r.gate_set.frames


# ---- bad input: refused before anything renders ------------------------------------------------


def test_unknown_builds_and_baselines_are_refused(gated):
    reg = str(gated.reg.root)
    res = _cli("gate", "no-such-build", "--registry", reg)
    assert res.exit_code == 3 and "unknown build" in res.output
    res = _cli("gate", gated.ref, "--baseline", "no-such-build", "--registry", reg)
    assert res.exit_code == 3
    res = _cli("gate", gated.ref, "--registry", reg, "--json")  # default baseline: prod, still empty
    assert res.exit_code == 2 and "--baseline none" in json.loads(res.stdout)["message"]
    k4 = gated.cal.band.variants[1].build_id  # compiled, never gated
    res = _cli("gate", gated.cal.band.variants[0].build_id, "--baseline", k4, "--registry", reg)
    assert res.exit_code == 1 and f"avatar-release gate {k4} --baseline none" in res.output


def test_a_baseline_gated_elsewhere_or_a_missing_band_is_refused(gated, tmp_path):
    root = tmp_path / "reg"
    shutil.copytree(gated.reg.root, root)
    reg = LocalRegistry(root)
    k2 = gated.cal.band.variants[0].build_id
    with pytest.raises(SpecError, match="avatar-release gate calibrate --pipeline tiny --target cpu-8"):
        run_gate(k2, reg, baseline=gated.ref, band_file=tmp_path / "missing.json")
    r, _ = latest_result(reg, gated.ref)
    env = r.environment.model_copy(update={"device_kind": "TPU v6 lite", "fingerprint": "sha256:" + "e" * 64})
    save_result(reg, r.model_copy(update={"environment": env, "created_at": "later"}))
    with pytest.raises(EnvironmentMismatch, match="device_kind: baseline TPU v6 lite") as e:
        run_gate(k2, reg, baseline=gated.ref, band_file=gated.band_file)
    assert "device_kind" in e.value.differences


def test_the_report_folder_is_written_where_asked(gated):
    report = gated.ref_outcome.report  # the session's gate asked for its report_dir
    assert report.is_file() and report.name == "index.html" and report.parent == gated.ref_outcome.report_dir


def test_a_build_that_failed_against_prod_cannot_reach_prod_by_comparing_with_nothing(gated, against_prod, tmp_path):
    """The promise: bit-exact or in band *against prod*. `--baseline none` proves determinism only:
    while prod holds a build, its verdict never promotes, and the gate says so when it runs."""
    root = tmp_path / "reg"
    shutil.copytree(against_prod.reg.root, root)  # prod holds the reference; the candidate was gated against it
    reg = LocalRegistry(root)
    other, failed = against_prod.cand, against_prod.gate
    assert failed.exit_code == 1 and json.loads(failed.stdout)["error"] == "Refusal"
    alone = _cli(
        "gate",
        other.build_id,
        "--baseline",
        "none",
        "--registry",
        str(root),
        "--report",
        str(tmp_path / "r2"),
        "--json",
    )
    doc = json.loads(alone.stdout)
    assert alone.exit_code == 0 and doc["status"] == "passed" and doc["promotable"] is False
    assert (
        f"while prod holds {gated.ref}" in doc["never_promotes"]
        and doc["next"] == f"avatar-release gate {other.build_id}"
    )
    refused = _cli("promote", other.build_id, "--to", "staging", "--registry", str(root))
    assert refused.exit_code == 1
    # What decides is its newest verdict against prod, and that one failed; the pass against nothing is no verdict.
    assert f"latest signed gate result of {other.build_id} is 'failed'" in refused.output
    assert f"compared with {gated.ref}" in refused.output
    assert reg.get_channel("staging").build_id == gated.ref  # nothing moved
    rows = {b["build_id"]: b for b in json.loads(_cli("ls", "--registry", str(root), "--json").output)["builds"]}
    assert rows[other.build_id]["compared_with"] == "nothing" and {"prod", "staging"} <= set(
        rows[gated.ref]["channels"]
    )
    # every verdict is kept and listed, with what it compared with: the failure is not overwritten
    listed = json.loads(_cli("ls", "--verdicts", "--registry", str(root), "--json").output)["builds"]
    verdicts = next(b for b in listed if b["build_id"] == other.build_id)["verdicts"]
    assert [(v["status"], v["compared_with"], v["signed"]) for v in verdicts] == [
        ("failed", f"compared with {gated.ref}", True),
        ("passed", "compared with nothing (--baseline none)", True),
    ]
    assert (against_prod.report / "index.html").is_file() and (tmp_path / "r2" / "index.html").is_file()
