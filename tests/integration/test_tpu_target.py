"""The tpu-v6e-8 target: real TPU executables compiled on this CPU-only host through libtpu's
topology description, their evidence (Mosaic kernels and flags, memory, cost, schedule), the
compile gate, and every refusal that keeps a hardware-absent build from serving or promotion."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.errors import DoesNotFit, EnvironmentMismatch
from avatar_release.registry import LocalRegistry
from tests.tools import need_extra

pytestmark = pytest.mark.slow

LLO = "XLA_TPU_FORCE_LP_LLO_SCHEDULER"


@pytest.fixture(scope="module")
def tpu_build(tpu_registry):
    """tiny for tpu-v6e-8, every attention kernel routed to Pallas, published to dev (the session's:
    tests/integration/conftest.py); read only here, copied by a test that changes it."""
    root, result, _ = tpu_registry
    return root, result


def test_a_tpu_build_is_compiled_and_published_on_a_host_without_tpus(tpu_build):
    import jax

    root, result = tpu_build
    assert jax.default_backend() == "cpu"  # no TPU here
    m = LocalRegistry(root, create=False)
    resolved = m.resolve("dev")
    assert resolved.build_id == result.build_id and result.build_id.startswith("tiny-tpu-v6e-8-")
    man = result.manifest
    assert man.platform.backend == "tpu" and man.platform.device_kind == "TPU v6 lite"
    assert man.platform.device_count == 8 and man.platform.topology == "v6e:2x4"
    assert man.flags.name == "tpu-v6e-default" and man.flags.compiler_options["xla_tpu_enable_async_all_to_all"]
    # FSDP's gathers offloaded to the SparseCore (async calls the schedule can hide).
    assert man.flags.compiler_options["xla_tpu_enable_sparse_core_collective_offload_all_gather"]
    assert man.flags.kernel_flags == {LLO: True}
    assert man.weights.materialized and man.weights.chunks
    for e in man.executables:
        # XLA's own optimal_seconds is recorded but goes negative (unusable) around async
        # SparseCore calls; the estimate uses the per-run counts.
        assert e.hlo_digest and "optimal_seconds" in e.cost and e.cost["flops"] > 0
        assert e.cost["flops per run"] >= e.cost["flops"] and e.cost["bytes accessed per run"] > 0
        assert 0 <= e.cost["exposed collective bytes per run"] <= e.cost["collective bytes per run"]
        assert e.fingerprint is None  # a compile-only client has none; hlo_digest is the evidence
        assert e.memory["argument_size"] > 0 and e.schedule is not None
        assert e.host_callbacks == []
    fit = man.memory_fit
    assert fit and fit.fits and fit.capacity_bytes == 32 * 2**30 and fit.weight_sharding == "fsdp"


def test_every_pallas_kernel_is_a_mosaic_call_carrying_the_low_priority_llo_scheduler(tpu_registry):
    _, result, programs = tpu_registry
    man = result.manifest
    found = {(e.stage, k.name): k for e in man.executables for k in e.kernels}
    assert set(found) == {
        ("dit", "preattn"),
        ("dit", "dit_flash_attention"),
        ("sr", "preattn"),
        ("sr", "sr_blocksparse_attention"),
    }
    for k in found.values():
        assert k.backend == "mosaic" and k.count >= 1 and k.flags == {LLO: True}
    # The compiled programs themselves: every Mosaic custom call carries the flag in its config.
    for key in ("dit/f8", "sr/f8"):
        calls = [line for line in programs[key].splitlines() if "tpu_custom_call" in line]
        assert calls
        for line in calls:
            assert re.search(r'"flag_type":"' + LLO + r'","value":\{"boolean_value":true\}', line), line[:300]


def test_the_loader_refuses_a_tpu_build_on_this_host_naming_both_machines(tpu_build):
    from avatar_release.runtime import load

    root, result = tpu_build
    with pytest.raises(EnvironmentMismatch) as err:
        load("dev", LocalRegistry(root, create=False))
    msg = str(err.value)
    assert "expected 'tpu: TPU v6 lite x 8 (v6e:2x4)', actual 'cpu: cpu x 8'" in msg and "no 'tpu' backend" in msg
    assert err.value.differences["backend"] == ("tpu", "cpu")


def test_output_gates_refuse_here_and_the_compile_gate_proves_what_it_can(tpu_build, tmp_path):
    root, result = tpu_build
    reg = tmp_path / "reg"
    shutil.copytree(root, reg)
    runner = CliRunner()
    res = runner.invoke(cli, ["gate", "dev", "--baseline", "none", "--registry", str(reg)])
    assert res.exit_code == 5, res.output
    assert "avatar-release gate compile" in res.output and "TPU v6 lite x 8" in res.output

    res = runner.invoke(cli, ["gate", "compile", "dev", "--registry", str(reg), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    checks = {c["name"]: c for c in out["result"]["checks"]}
    assert {n: c["status"] for n, c in checks.items()} == {
        "every-bucket": "passed",
        "flags-present": "passed",
        "fits-memory": "passed",
        "no-host-callbacks": "passed",
        "reproducible": "passed",
    }
    assert (
        checks["flags-present"]["details"]["mosaic_kernels"] == 4
    )  # pre-attention and flash (dit), pre-attention and block-sparse (sr)
    assert LocalRegistry(reg, create=False).get_record("compile-gates", result.build_id)
    listed = json.loads(runner.invoke(cli, ["ls", "--registry", str(reg), "--json"]).stdout)["builds"]
    assert [(b["gate"], b["compile_gate"]) for b in listed] == [("ungated", "passed")]

    # CPU-only evidence never takes a TPU build past dev.
    res = runner.invoke(cli, ["promote", "dev", "--to", "staging", "--registry", str(reg)])
    assert res.exit_code == 1
    assert "only a compile gate" in res.output and "never promotes past dev" in res.output


def test_a_compile_gate_fails_a_build_whose_kernels_lost_their_flag(tpu_build, tmp_path):
    """Tamper with nothing but the record of one kernel's flags: the gate must notice."""
    from avatar_release.gates.compile_gate import _flags_present

    _, result = tpu_build
    m = result.manifest
    sr = m.executable("sr", "f8")
    stripped = [k.model_copy(update={"flags": {}}) if k.name == "sr_blocksparse_attention" else k for k in sr.kernels]
    entries = [e.model_copy(update={"kernels": stripped}) if e.key == "sr/f8" else e for e in m.executables]
    check = _flags_present(m.model_copy(update={"executables": entries}))
    assert check.status == "failed" and "sr_blocksparse_attention lacks" in check.summary


def test_analyze_build_gives_a_labelled_estimate_against_the_deadline(tpu_build):
    root, result = tpu_build
    res = CliRunner().invoke(cli, ["analyze", "build", "dev", "--registry", str(root), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "not a measurement" in out["label"]
    (chunk,) = out["chunks"]
    assert chunk["deadline_seconds"] == pytest.approx(8 / 25)
    assert 0 < chunk["estimated_seconds"] < chunk["deadline_seconds"] and chunk["ratio"] < 1
    assert {s["key"] for s in chunk["stages"]} == {"dit/f8", "sr/f8", "vae/f8"}
    human = CliRunner().invoke(cli, ["analyze", "build", "dev", "--registry", str(root)]).output
    assert "compiler estimate" in human and "not a measurement" in human and "all-to-alls dit/f8" in human


def test_head_groups_hide_all_to_alls_behind_compute_in_the_tpu_schedule():
    need_extra("tpu")
    from model.schedule import probe_schedule

    probes = {p.groups: p for p in probe_schedule("tiny", "tpu-v6e-8", (1, 2, 4))}
    # One group moves q, k and v by three all-to-alls, no packing copy (kernels/ulysses.py); more
    # groups pack them: one in, one out per group.
    assert [probes[g].all_to_alls for g in (1, 2, 4)] == [4, 4, 8]
    assert probes[1].hidden + probes[1].exposed == 4 and probes[1].exposed >= 2  # the last in and the out
    assert 0 < probes[2].hidden < probes[4].hidden
    assert probes[4].exposed <= probes[1].exposed  # the first in and the last out stay exposed
    assert "probed with 32 heads" in probes[1].note  # tiny's 8 heads cannot form 4 groups per device


def test_a_build_that_does_not_fit_its_device_is_refused_with_the_numbers(tmp_path, monkeypatch):
    """A CPU target declaring 1 MiB per device: the tiny pipeline needs more; nothing is published."""
    from avatar_release.compile import compile_build
    from avatar_release.specs import manifests_dir

    manifests = tmp_path / "manifests"
    shutil.copytree(manifests_dir(), manifests)
    cpu = (manifests / "targets" / "cpu-8.toml").read_text().replace('name = "cpu-8"', 'name = "cpu-8-1mib"')
    (manifests / "targets" / "cpu-8-1mib.toml").write_text(cpu + "hbm_bytes_per_device = 1048576\n")
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(manifests))
    reg = LocalRegistry(tmp_path / "reg")
    with pytest.raises(DoesNotFit) as err:
        compile_build("tiny", "cpu-8-1mib", registry=reg)
    msg, fit = str(err.value), err.value.fit
    assert not fit.fits and fit.total_bytes > fit.capacity_bytes == 1048576
    assert "does not fit cpu-8-1mib" in msg and "the device has 1.00 MiB" in msg and "over by" in msg
    assert fit.peak_stage in msg and "Nothing was published" in msg
    assert reg.list_builds() == []


def test_production_shapes_compile_for_tpu_from_abstract_shapes(tmp_path):
    """avatar-720p (18.5B parameters: 37 GB of bf16 if materialised, more than this machine's RAM)
    compiles in a fresh process that never holds them, and fits 32 GiB per chip only because of FSDP."""
    need_extra("tpu")
    import resource

    reg = tmp_path / "reg"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "compile",
            "--pipeline",
            "avatar-720p",
            "--target",
            "tpu-v6e-8",
            "--set",
            "dit.steps=1",
            "--registry",
            str(reg),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = json.loads(proc.stdout)
    from avatar_release.registry import read_manifest

    _, m = read_manifest(LocalRegistry(reg, create=False), out["build_id"])
    assert not m.weights.materialized and m.weights.blob is None and m.blobs() == [e.blob for e in m.executables]
    assert m.weights.raw_size > 36e9  # what materialising them would take
    assert max(peak_kib, before) * 1024 < 16e9  # the compiler never held them
    fit = m.memory_fit
    assert fit.fits and fit.weight_sharding == "fsdp"
    # FSDP holds 1/8 of every weight on each chip; replicated, the weights alone overflow 32 GiB.
    assert fit.weights_bytes < m.weights.raw_size / 7
    assert m.weights.raw_size > fit.capacity_bytes
    assert {(e.stage, k.name) for e in m.executables for k in e.kernels} == {
        ("dit", "dit_flash_attention"),
        ("sr", "sr_blocksparse_attention"),
    }  # the production defaults
    assert m.executable("dit", "f16").cost_loop_scale > 30  # 36 scanned blocks, counted once by XLA


def test_an_abstract_build_verifies_but_a_pod_refuses_it_for_lack_of_weights(tmp_path, monkeypatch):
    from avatar_release.compile import compile_build
    from avatar_release.errors import InputError
    from avatar_release.runtime import load, verify_build
    from avatar_release.specs import manifests_dir

    manifests = tmp_path / "manifests"
    shutil.copytree(manifests_dir(), manifests)
    spec = (manifests / "pipelines" / "tiny.toml").read_text()
    (manifests / "pipelines" / "tiny.toml").write_text(spec.replace('source = "init"', 'source = "abstract"'))
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(manifests))
    reg = LocalRegistry(tmp_path / "reg")
    result = compile_build("tiny", "cpu-8", registry=reg)
    w = result.manifest.weights
    assert not w.materialized and w.blob is None and w.tensors > 100 and w.raw_size > 0
    report = verify_build(result.build_id, str(tmp_path / "reg"))
    assert report["ok"] and [b["what"] for b in report["blobs"]] == [
        "manifest",
        "dit/f8",
        "sr/f8",
        "vae/f8",
    ]  # no weights row
    with pytest.raises(InputError, match="compiled from abstract shapes.*carries no weights"):
        load(result.build_id, reg)
