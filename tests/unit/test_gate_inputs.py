"""Issue 39 item 5, "project files cannot lower a verdict": a gate result names the band, target spec
and lever list it was decided by, and a trust policy's [gate_inputs] pins which ones may decide a
verdict that promotes. On an in-memory registry with signed gate results; the real gate and CLI are
in tests/integration/test_gate_inputs.py."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from avatar_release.errors import InputError, Refusal
from avatar_release.gates.band import load_band
from avatar_release.gates.steps import never_promotes
from avatar_release.gates.store import save_result
from avatar_release.gates.tier import read_levers
from avatar_release.promote import promote, rollback
from avatar_release.records import (
    BaselineRef,
    BlobRef,
    EnvironmentRecord,
    GateEvidence,
    GateRequestRecord,
    GateResult,
    GateSetRecord,
    Manifest,
    parse_record,
)
from avatar_release.registry import MemoryRegistry
from avatar_release.specs import load_target
from avatar_release.trust.policy import GateInputPins, load_policy, local_identity
from avatar_release.trust.state_write import init_state
from tests.helpers import DATA, cpu_manifest, put_stand_in_build

REPO = Path(__file__).resolve().parents[2]
A, B, C = ("sha256:" + x * 64 for x in "abc")


@pytest.fixture
def reg():
    """An in-memory registry with a signed release state from this machine's first-use policy."""
    reg = MemoryRegistry("gate-inputs")
    init_state(reg, load_policy())
    return reg


def _policy(tmp_path: Path, monkeypatch, gate_inputs: str = "") -> Path:
    """An explicit policy trusting this machine's keys (as the first-use one does) and ``gate_inputs``."""
    me = local_identity()
    path = tmp_path / "trust.toml"
    path.write_text(
        f'schema_version = 1\n[keys]\ngate = "{me.gate_key_path.with_suffix(".pub")}"\n'
        f'ana = "{me.reviewer_key_path.with_suffix(".pub")}"\nrelease = "{me.release_key_path.with_suffix(".pub")}"\n'
        '[gate]\n"*" = ["gate"]\n[review]\nreviewers = ["ana"]\n[release]\napprovers = ["release"]\n' + gate_inputs
    )
    monkeypatch.setenv("AVATAR_RELEASE_TRUST_POLICY", str(path))
    return path


def _publish(reg, suffix: str) -> tuple[str, str, Manifest]:
    m = cpu_manifest().model_copy(update={"build_id": f"tiny-cpu-8-{suffix * 12}"})
    return m.build_id, put_stand_in_build(reg, m), m


_TICKS = iter(range(10**6))


def _gate(
    reg,
    build_id: str,
    digest: str,
    m: Manifest,
    *,
    band: str | None = None,
    judged: bool = True,
    levers: str | None = None,
    target_spec: str | None = "in force",
    against=None,
    **more,
) -> str:
    """A signed, passing gate result. ``band``: a tier-2 verdict against that band (``judged``: the band
    judged, else bit-exact held and it was skipped); ``target_spec``: the digest it names ("in force":
    the cpu-8 spec in force now)."""
    p = m.platform
    env = EnvironmentRecord(
        fingerprint="sha256:" + "1" * 64,
        backend=p.backend,
        platform_version=p.platform_version,
        device_kind=p.device_kind,
        device_count=p.device_count,
        jax="0",
        jaxlib=m.toolchain.jaxlib,
        cpu_features=p.cpu_features,
    )
    gs = GateSetRecord(
        name="t",
        version=1,
        digest="sha256:" + "0" * 64,
        requests=[GateRequestRecord(name="r", image_variant=0, audio_variant=0, seed=0, frames=1, buckets=["f8"])],
    )
    gates = [GateEvidence(name="bit-exact", status="failed" if judged else "passed", summary="x")]
    if band is not None:
        gates.append(GateEvidence(name="similarity-band", status="passed" if judged else "skipped", summary="x"))
    if against is None and band is not None:
        against = ("tiny-cpu-8-" + "0" * 12, "sha256:" + "e" * 64)
    r = GateResult(
        status="passed",
        build_id=build_id,
        build_digest=digest,
        pipeline="tiny",
        target="cpu-8",
        target_spec_digest=load_target("cpu-8").digest() if target_spec == "in force" else target_spec,
        band_digest=band,
        levers_digest=levers,
        baseline=None
        if against is None
        else BaselineRef(build_id=against[0], digest=against[1], gate_result_digest="sha256:" + "c" * 64),
        tier=None if against is None else (2 if band is not None else 1),
        environment=env,
        tool={},
        gate_set=gs,
        gates=gates,
        frame_sha256=[["h"]],
        frames_blob=BlobRef(digest="sha256:" + "b" * 64, size=1, media_type="x"),
        created_at=f"2026-12-05T00:00:{next(_TICKS):09d}Z",
        created_by="test",
        **more,
    )
    return save_result(reg, r)


# ---- the policy section -----------------------------------------------------------------------------------


def test_the_first_use_policy_pins_nothing_and_a_band_judged_verdict_promotes_as_before(reg):
    assert load_policy().gate_inputs == GateInputPins() and not GateInputPins().pinned
    a, da, m = _publish(reg, "a")
    _gate(reg, a, da, m, band=A, levers=B)
    assert promote(reg, a, "staging").changed and promote(reg, a, "prod").changed


def test_gate_inputs_parse_and_a_target_takes_one_digest_or_several(tmp_path, monkeypatch):
    _policy(
        tmp_path,
        monkeypatch,
        f'[gate_inputs]\nbands = ["{A}"]\nlevers = []\n'
        f'[gate_inputs.targets]\n"cpu-8" = "{B}"\n"tpu-v6e-8" = ["{B}", "{C}"]\n',
    )
    pins = load_policy().gate_inputs
    assert pins == GateInputPins(bands=(A,), targets={"cpu-8": (B,), "tpu-v6e-8": (B, C)}, levers=())
    assert pins.pinned


@pytest.mark.parametrize(
    "section, message",
    [
        (
            f'[gate_inputs]\nband = ["{A}"]\n',
            r"gate_inputs\.band: unknown key \(got \['sha256:a+'\]\); did you mean 'bands'\?; "
            r"allowed here: bands, levers, targets",
        ),
        (
            '[gate_inputs]\nbands = ["sha256:abc"]\n',
            r"gate_inputs\.bands\.0: expected a digest \('sha256:' \+ 64 "
            r"lowercase hex, as `avatar-release gate inputs` prints them\) \(got "
            r"'sha256:abc'\)",
        ),
        (
            f'[gate_inputs]\nlevers = "{A}"\n',
            r"gate_inputs\.levers: expected a list \(an array\) \(got \'sha256:a+\'\)",
        ),
        (f'[gate_inputs]\ntargets = ["{A}"]\n', r"gate_inputs\.targets: expected a table"),
        (
            '[gate_inputs.targets]\n"cpu-8" = 3\n',
            r"gate_inputs\.targets\.cpu-8: expected a digest or a list of digests \(\'sha256:\' \+ 64 "
            r"lowercase hex, .*\) \(got 3\)",
        ),
        ("gate_inputs = 1\n", r"gate_inputs: expected a table \(got 1\)"),
    ],
)
def test_a_malformed_gate_inputs_section_is_refused_naming_the_field(tmp_path, monkeypatch, section, message):
    path = _policy(tmp_path, monkeypatch, "" if section.startswith("gate_inputs =") else section)
    if section.startswith("gate_inputs ="):  # a top-level key, before the tables
        path.write_text(section + path.read_text())
    with pytest.raises(InputError, match=rf"trust policy {path}: {message}"):
        load_policy()


# ---- the band ---------------------------------------------------------------------------------------------


def test_a_verdict_judged_by_an_unpinned_band_is_refused_naming_both_digests_and_the_fix(reg, tmp_path, monkeypatch):
    """The attack: a band with a lower floor in the project turns a needs-review build into a signed pass."""
    path = _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    a, da, m = _publish(reg, "a")
    lowered = _gate(reg, a, da, m, band=B)
    with pytest.raises(
        Refusal,
        match=rf"promote {a} to staging: the gate result {lowered} was decided by project "
        rf"files the trust policy {path} does not pin: band {B}, where \[gate_inputs\] "
        rf"bands allows {A}\. Only pinned files decide a verdict that promotes; run "
        rf"`avatar-release gate {a}` with the pinned files in place \(`avatar-release "
        r"gate inputs` prints the digests of the files in force\), or, if these files "
        r"are to be trusted, add their digests to \[gate_inputs\]",
    ):
        promote(reg, a, "staging")
    assert reg.get_channel("staging") is None
    _gate(reg, a, da, m, band=A)  # re-gated under the pinned band
    assert promote(reg, a, "staging").changed and promote(reg, a, "prod").changed


def test_prod_and_a_release_approval_refuse_a_verdict_whose_band_is_no_longer_pinned(reg, tmp_path, monkeypatch):
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    a, da, m = _publish(reg, "a")
    _gate(reg, a, da, m, band=A)
    promote(reg, a, "staging")
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{C}"]\n')  # the policy moved on to a new band
    with pytest.raises(Refusal, match=rf"promote {a} to prod: .*band {A}, where \[gate_inputs\] bands allows {C}"):
        promote(reg, a, "prod")
    from avatar_release.promote.actions import approve

    with pytest.raises(Refusal, match=rf"approve {a} for prod: .*band {A}"):
        approve(reg, a)
    assert reg.get_channel("prod") is None


def test_a_bit_exact_verdict_holds_whatever_band_and_levers_it_loaded(reg, tmp_path, monkeypatch):
    """The band only decides where it judged: a re-measured band never holds back a bit-exact release;
    ``bands = []`` lets nothing the band judged through."""
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = []\nlevers = ["{A}"]\n')
    a, da, m = _publish(reg, "a")
    _gate(reg, a, da, m, band=B, levers=C, judged=False)
    assert promote(reg, a, "staging").changed
    b, db, _ = _publish(reg, "b")
    _gate(reg, b, db, m, band=B, levers=A)
    with pytest.raises(Refusal, match=rf"band {B}, where \[gate_inputs\] bands allows none"):
        promote(reg, b, "staging")


# ---- the lever list ---------------------------------------------------------------------------------------


def test_a_verdict_sent_to_the_band_by_an_unpinned_lever_list_is_refused(reg, tmp_path, monkeypatch):
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nlevers = ["{A}"]\n')
    a, da, m = _publish(reg, "a")
    _gate(reg, a, da, m, band=C, levers=B)
    with pytest.raises(Refusal, match=rf"lever list {B}, where \[gate_inputs\] levers allows {A}"):
        promote(reg, a, "staging")
    _gate(reg, a, da, m, band=C, levers=None)  # a result from before results named their lever list
    with pytest.raises(
        Refusal,
        match=r"lever list no digest \(a gate result written before results named it\), "
        rf"where \[gate_inputs\] levers allows {A}",
    ):
        promote(reg, a, "staging")
    _gate(reg, a, da, m, band=C, levers=A)
    assert promote(reg, a, "staging").changed


def test_a_version_1_result_is_judged_by_the_band_digest_inside_its_band(reg, tmp_path, monkeypatch):
    """Version-1 results name their band only inside ``band``; that digest is the one pinned."""
    raw = json.loads((DATA / "gate-result.v1.json").read_bytes())
    band = {
        "path": "b.json",
        "digest": B,
        "psnr_floor_db": 1.0,
        "max_abs_diff_ceiling": 255,
        "measured_at": "x",
        "environment": "y",
    }
    v1 = parse_record(GateResult, json.dumps({**raw, "band": band}).encode(), where="v1")
    assert v1.schema_version == 1 and v1.band_digest is None and v1.band_judged_by() == B
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    a, da, _ = _publish(reg, "a")
    result = v1.model_copy(
        update={
            "build_id": a,
            "build_digest": da,
            "target": "cpu-8",
            "gates": [GateEvidence(name="similarity-band", status="passed", summary="x")],
            "created_at": f"2026-12-05T00:00:{next(_TICKS):09d}Z",
        }
    )
    save_result(reg, result)
    with pytest.raises(Refusal, match=rf"band {B}, where \[gate_inputs\] bands allows {A}"):
        promote(reg, a, "staging")


# ---- the target spec --------------------------------------------------------------------------------------


@pytest.fixture
def redefined_cpu_8(tmp_path, monkeypatch) -> tuple[str, str]:
    """A project whose cpu-8 says more than the one in the repository: (its digest, the original's)."""
    original = load_target("cpu-8").digest()
    man = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", man)
    spec = man / "targets" / "cpu-8.toml"
    spec.write_text(spec.read_text() + "peak_flops_per_second = 1e9\n")
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(man))
    redefined = load_target("cpu-8").digest()
    assert redefined != original
    return redefined, original


def test_a_verdict_under_a_redefined_target_is_refused_naming_both_specs(reg, tmp_path, monkeypatch, redefined_cpu_8):
    """The attack: the project redefines what a target is; the spec in force agrees with the evidence,
    the pinned one does not."""
    redefined, original = redefined_cpu_8
    path = _policy(tmp_path, monkeypatch, f'[gate_inputs.targets]\n"cpu-8" = "{original}"\n')
    a, da, m = _publish(reg, "a")
    gated = _gate(reg, a, da, m)  # under the project's cpu-8: the spec in force
    with pytest.raises(
        Refusal,
        match=rf"the gate result {gated} was decided by project files the trust policy "
        rf"{path} does not pin: target spec {redefined}, where \[gate_inputs\] "
        rf"targets\.cpu-8 allows {original}\.",
    ):
        promote(reg, a, "staging")
    _policy(tmp_path, monkeypatch, f'[gate_inputs.targets]\n"cpu-8" = ["{original}", "{redefined}"]\n')
    assert promote(reg, a, "staging").changed  # the policy author pinned the new spec too


def test_a_target_the_policy_does_not_list_and_a_result_naming_no_spec_promote_nothing(reg, tmp_path, monkeypatch):
    _policy(tmp_path, monkeypatch, f'[gate_inputs.targets]\n"tpu-v6e-8" = "{A}"\n')
    a, da, m = _publish(reg, "a")
    _gate(reg, a, da, m)
    with pytest.raises(
        Refusal,
        match=rf"target spec {load_target('cpu-8').digest()}, where \[gate_inputs\] "
        r"targets\.cpu-8 allows none",
    ):
        promote(reg, a, "staging")
    _policy(tmp_path, monkeypatch, f'[gate_inputs.targets]\n"cpu-8" = "{load_target("cpu-8").digest()}"\n')
    _gate(reg, a, da, m, target_spec=None)
    with pytest.raises(Refusal, match=r"target spec no digest \(a gate result written before results named it\)"):
        promote(reg, a, "staging")


def test_a_rollback_is_held_to_the_pins_too(reg, tmp_path, monkeypatch):
    a, da, m = _publish(reg, "a")
    b, db, _ = _publish(reg, "b")
    _gate(reg, a, da, m, band=B, levers=C)
    promote(reg, a, "staging")
    promote(reg, a, "prod")
    _gate(reg, b, db, m, against=(a, da))
    promote(reg, b, "staging")
    promote(reg, b, "prod")
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    with pytest.raises(Refusal, match=rf"roll prod back to {a}: .*band {B}, where \[gate_inputs\] bands allows {A}"):
        rollback(reg, "prod")
    _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}", "{B}"]\n')  # the earlier band kept for rollbacks
    assert rollback(reg, "prod").decision.build_id == a


# ---- said when the gate runs, and the digests to pin ------------------------------------------------------


def test_the_gate_says_at_once_that_a_verdict_under_an_unpinned_band_never_promotes(reg, tmp_path, monkeypatch):
    path = _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    a, da, m = _publish(reg, "a")
    from avatar_release.gates.store import latest_result

    _gate(reg, a, da, m, band=B)
    result, _ = latest_result(reg, a)
    inputs = SimpleNamespace(baseline=result.baseline, resolved=reg.resolve(a))
    note = never_promotes(reg, inputs, result)
    assert note is not None and note.startswith(
        f"decided by project files the trust policy {path} does not pin "
        f"(band {B}, where [gate_inputs] bands allows {A})"
    )
    _gate(reg, a, da, m, band=A)
    assert never_promotes(reg, inputs, latest_result(reg, a)[0]) is None


def test_gate_inputs_prints_a_section_that_pins_the_files_in_force(tmp_path, monkeypatch):
    """What `gate inputs` prints, pasted into the policy, pins exactly the band, specs and levers in force."""
    from avatar_release.cli import cli

    path = _policy(tmp_path, monkeypatch, f'[gate_inputs]\nbands = ["{A}"]\n')
    res = CliRunner().invoke(cli, ["gate", "inputs"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    _, band, _ = load_band("tiny", "cpu-8")
    _, levers, _ = read_levers()
    assert f'"{band}",  # bands/tiny-cpu-8.json: tiny on cpu-8: PSNR >= ' in res.output
    assert f"; NOT allowed by {path} now" in res.output
    assert f'"{A}",  # allowed by the policy now, no file here has it' in res.output  # kept for rollbacks
    assert f'"{levers}",  # levers.toml: ' in res.output and f"not pinned: {path} pins no lever list yet" in res.output
    section = tomllib.loads(res.output)["gate_inputs"]
    assert section["bands"] == [band, A] and section["levers"] == [levers]
    assert section["targets"]["cpu-8"] == load_target("cpu-8").digest()
    assert section["targets"]["tpu-v6e-8"] == load_target("tpu-v6e-8").digest()

    path.write_text(path.read_text().split("[gate_inputs]")[0] + res.output)  # pasted into the policy
    pins = load_policy().gate_inputs
    assert (
        pins.bands == (band, A)
        and pins.levers == (levers,)
        and pins.targets["cpu-8"] == (load_target("cpu-8").digest(),)
    )
    res = CliRunner().invoke(cli, ["gate", "inputs", "--json"], catch_exceptions=False)
    doc = json.loads(res.stdout)
    assert doc["pinned"] and doc["policy"] == str(path)
    assert {f["name"]: f["allowed"] for f in doc["files"]}["tiny-cpu-8.json"] is True
    assert all(f["allowed"] for f in doc["files"] if f["digest"] is not None)
