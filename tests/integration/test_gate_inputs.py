"""Project files cannot lower a verdict (issue 39 item 5), through the CLI on real builds.

A policy author pins the band, target specs and lever list in force (`gate inputs`, pasted into an
explicit trust policy). A project that redefines cpu-8, or lowers the band's floor so that a build
below the measured band passes, gets a signed verdict from the gate, which says at once that it
never promotes; promotion refuses it, naming the digest the evidence names and the pinned one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from avatar_release._digest import sha256_digest
from avatar_release.gates.gateset import gate_set
from avatar_release.registry import LocalRegistry
from avatar_release.specs import load_target
from avatar_release.trust.policy import local_identity
from tests.helpers import cli, resealed

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path, name: str) -> Path:
    """A copy of the repository's manifests/, for a project to change."""
    man = tmp_path / name / "manifests"
    shutil.copytree(REPO / "manifests", man)
    return man


def _pinned_policy(tmp_path: Path, monkeypatch) -> Path:
    """An explicit policy trusting this machine's keys, with what `gate inputs` prints pasted in."""
    me = local_identity()
    path = tmp_path / "trust.toml"
    path.write_text(
        f'schema_version = 1\n[keys]\ngate = "{me.gate_key_path.with_suffix(".pub")}"\n'
        f'ana = "{me.reviewer_key_path.with_suffix(".pub")}"\nrelease = "{me.release_key_path.with_suffix(".pub")}"\n'
        '[gate]\n"*" = ["gate"]\n[review]\nreviewers = ["ana"]\n[release]\napprovers = ["release"]\n\n'
    )
    monkeypatch.setenv("AVATAR_RELEASE_TRUST_POLICY", str(path))
    res = cli("gate", "inputs")
    assert res.exit_code == 0, res.output
    path.write_text(path.read_text() + res.output)
    return path


def test_a_redefined_target_and_a_lowered_band_gate_but_never_promote(
    registry_copy, gated_copy, build_cache, tmp_path, monkeypatch
):
    root, first = registry_copy  # its build never gated: the redefined project's gate is its first
    reg, a = str(root), first.build_id
    pinned_root, _, _ = gated_copy  # the same build, gated under the repository's files (the pinned ones)
    pinned_reg = str(pinned_root)
    policy = _pinned_policy(tmp_path, monkeypatch)
    pinned_spec = load_target("cpu-8").digest()
    pinned_band = sha256_digest((REPO / "manifests" / "bands" / "tiny-cpu-8.json").read_bytes())
    assert f'"cpu-8" = "{pinned_spec}"' in policy.read_text() and f'"{pinned_band}",' in policy.read_text()

    # A project that redefines cpu-8: the gate runs under it and names its spec; the spec in force agrees.
    redefined = _project(tmp_path, "redefined")
    spec = redefined / "targets" / "cpu-8.toml"
    spec.write_text(spec.read_text() + "peak_flops_per_second = 1e15\n")
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(redefined))
    other_spec = load_target("cpu-8").digest()
    res = cli("gate", a, "--baseline", "none", "--registry", reg, "--report", tmp_path / "r1", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["status"] == "passed" and doc["result"]["target_spec_digest"] == other_spec != pinned_spec
    assert (
        not doc["promotable"]
        and f"target spec {other_spec}, where [gate_inputs] targets.cpu-8 allows {pinned_spec}" in doc["never_promotes"]
    )
    res = cli("promote", a, "--to", "staging", "--registry", reg)
    assert res.exit_code == 1, res.output
    flat = " ".join(res.output.split())
    assert f"does not pin: target spec {other_spec}, where [gate_inputs] targets.cpu-8 allows {pinned_spec}" in flat
    assert f"run `avatar-release gate {a}` with the pinned files in place" in flat

    # Gated under the pinned project, the same build promotes all the way.
    monkeypatch.delenv("AVATAR_RELEASE_MANIFESTS")
    root, reg = pinned_root, pinned_reg  # from here on: the registry where it was gated so
    for channel in ("staging", "prod"):
        res = cli("promote", a, "--to", channel, "--registry", reg)
        assert res.exit_code == 0, res.output

    # A bf16 residual stream falls below the measured band (tests/integration/test_gates.py); a project
    # whose band has a floor of 0 dB lets it pass, signed.
    b = build_cache.compile(
        "tiny", "cpu-8", registry=LocalRegistry(root), overrides={"residual_dtype": "bfloat16"}
    ).build_id
    lowered = _project(tmp_path, "lowered")
    band_file = lowered / "bands" / "tiny-cpu-8.json"
    band = json.loads(band_file.read_text())
    band_file.write_text(json.dumps({**band, "psnr_floor_db": 0.0, "max_abs_diff_ceiling": 255}))
    lowered_band = sha256_digest(band_file.read_bytes())
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(lowered))
    res = cli("gate", b, "--registry", reg, "--report", tmp_path / "r3", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    r = doc["result"]
    assert doc["status"] == "passed" and r["tier"] == 2
    assert {g["name"]: g["status"] for g in r["gates"]}["similarity-band"] == "passed"
    assert r["schema_version"] == 2 and r["band_digest"] == r["band"]["digest"] == lowered_band
    assert r["levers_digest"] == sha256_digest((lowered / "levers.toml").read_bytes())
    assert r["target_spec_digest"] == pinned_spec
    assert f"band {lowered_band}, where [gate_inputs] bands allows {pinned_band}" in doc["never_promotes"]
    res = cli("promote", b, "--to", "staging", "--registry", reg)
    assert res.exit_code == 1, res.output
    flat = " ".join(res.output.split())
    assert (
        f"trust policy {policy} does not pin: band {lowered_band}, where [gate_inputs] bands allows "
        f"{pinned_band}" in flat
    )
    assert "`avatar-release gate inputs` prints the digests of the files in force" in flat
    res = cli("history", "staging", "--registry", reg, "--json")
    assert [e["to_build"] for e in json.loads(res.stdout)["entries"]] == [a]  # staging never moved to b


def test_a_baseline_gated_on_other_requests_is_refused_then_regated_on_the_candidates(gated_copy, tmp_path):
    """A candidate whose manifest records other gate requests (its spec's [gate] table changed)
    cannot be compared frame by frame with a baseline gated on its own: refused before anything
    renders, naming both request lists and the command that gets them onto one gate set. That
    command re-gates the baseline on the candidate's requests; the candidate then gates against it."""
    from avatar_release.records import GateRequestsRecord
    from avatar_release.registry import read_manifest

    root, base, verdict = gated_copy
    first_verdict = verdict.digest  # the baseline gated on its own requests
    reg = LocalRegistry(root)
    _, m = read_manifest(reg, base.build_id)
    cand = _stand_in(reg, m, GateRequestsRecord(images=[1], audio=[1], seed=0), split=2)  # one request: cheap to render
    res = cli("gate", cand.build_id, "--baseline", base.build_id, "--registry", root, "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["error"] == "Refusal", res.output
    message = doc["message"]
    assert f"baseline {base.build_id} was gated on gate set" in message
    assert "the baseline rendered requests ['image0-audio0', 'image1-audio0'] (seed 0)" in message
    assert "the candidate renders ['image1-audio1'] (seed 0)" in message
    fix = f"avatar-release gate {base.build_id} --baseline none --requests-of {cand.build_id}"
    assert fix in message
    seeded = _stand_in(reg, m, GateRequestsRecord(images=[0, 1], audio=[0], seed=1), split=3)  # the same names, seed 1
    res = cli("gate", seeded.build_id, "--baseline", base.build_id, "--registry", root, "--json")
    message = json.loads(res.stdout)["message"]
    assert "(seed 0), the candidate renders ['image0-audio0', 'image1-audio0'] (seed 1)" in message
    assert f"--requests-of {seeded.build_id}" in message  # re-gating on its own seed would not help

    res = cli(*fix.split()[1:], "--registry", root, "--report", tmp_path / "rep", "--json")
    assert res.exit_code == 0, res.output
    regated = json.loads(res.stdout)["result"]
    assert [r["name"] for r in regated["gate_set"]["requests"]] == [r.name for r in gate_set(cand).requests]
    assert read_manifest(reg, base.build_id)[1].gate_requests == m.gate_requests  # the build is unchanged
    res = cli("gate", cand.build_id, "--baseline", base.build_id, "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    verdict = json.loads(res.stdout)["result"]
    assert verdict["baseline"]["build_id"] == base.build_id and verdict["status"] == "passed"
    assert [g["status"] for g in verdict["gates"]][:3] == ["passed", "passed", "passed"]  # the same programs: bit-exact
    # a candidate on the baseline's own requests is still compared with the baseline's (older)
    # verdict on those, not with its newest, which is on the other candidate's requests
    own = _stand_in(reg, m, m.gate_requests, split=4)
    res = cli("gate", own.build_id, "--baseline", base.build_id, "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["result"]["baseline"]["gate_result_digest"] == first_verdict


def _stand_in(reg, m, requests, *, split: int):
    """Another build over ``m``'s blobs (the override ``matmul_k_split=split`` changes its identity)
    recording ``requests``."""
    cand = resealed(m, overrides={"matmul_k_split": split}, gate_requests=requests)
    reg.put_build(cand.build_id, cand.to_json_bytes())
    return cand


def test_requests_of_is_only_for_a_gate_on_its_own(gated_copy):
    root, base, _ = gated_copy
    res = cli("gate", base.build_id, "--requests-of", base.build_id, "--baseline", "prod", "--registry", root)
    assert res.exit_code == 2 and "use --baseline none" in res.output
    res = cli("gate", base.build_id, "--requests-of", base.build_id, "--shard", "0/2", "--registry", root)
    assert res.exit_code == 2 and "--requests-of with --shard" in res.output
