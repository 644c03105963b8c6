"""The gpu-h100-8 and gpu-h200-1 targets: real CUDA executables compiled on this CPU-only host
through the CUDA plugin's compile-only topology and XLA's target descriptions, their evidence
(target description digest, kernel routes, Triton kernels, what stayed un-autotuned, cost), the
compile gate, the estimate against the H100's peaks, and the refusals that keep such a build from
serving here. Skips (with the reason) without the [gpu] extra."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from avatar_release.cli import cli
from avatar_release.records import BUILD_SCHEMA_VERSION
from avatar_release.registry import LocalRegistry, read_manifest
from avatar_release.specs import load_target, manifests_dir, target_description

pytestmark = [pytest.mark.slow, pytest.mark.extra("gpu")]

# Every attention lever on: the DiT's flash attention and the SR's block-sparse attention have
# Triton kernels; the fused pre-attention is Mosaic-only and must be routed around, and say so.
LEVERS = {"dit.attention": "flash", "attention_kernel": "blocksparse", "fused_preattn": "true"}


def _cli(*args):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res


@pytest.fixture(scope="module")
def gpu_build(tmp_path_factory):
    """tiny for gpu-h100-8, every attention lever on, published to dev."""
    from avatar_release.compile import compile_build

    root = tmp_path_factory.mktemp("gpu") / "reg"
    result = compile_build("tiny", "gpu-h100-8", registry=LocalRegistry(root), overrides=dict(LEVERS))
    return root, result


def test_a_gpu_build_is_compiled_for_the_pinned_description_on_a_host_without_gpus(gpu_build):
    import jax

    root, result = gpu_build
    assert jax.default_backend() == "cpu"  # no GPU here
    assert LocalRegistry(root, create=False).resolve("dev").build_id == result.build_id
    m = result.manifest
    assert m.schema_version == BUILD_SCHEMA_VERSION and result.build_id.startswith("tiny-gpu-h100-8-")
    p = m.platform
    assert (p.backend, p.device_kind, p.device_count, p.topology) == ("gpu", "NVIDIA H100 80GB HBM3", 8, "1x1x8")
    assert p.platform_version == "topology:1x1x8"  # a compile-only client: no live version to record
    assert p.target_config == target_description(load_target("gpu-h100-8")).digest
    assert m.flags.name == "gpu-default" and m.flags.compiler_options["xla_gpu_deterministic_ops"] is True
    for e in m.executables:
        assert e.fingerprint is None  # a compile-only client has none; hlo_digest is the evidence
        assert "flops" not in e.cost  # XLA:GPU's compile-only cost_analysis() gives nothing ...
        assert e.cost["flops per run"] > 0 and e.cost["bytes accessed per run"] > 0  # ... the per-run count does
        assert e.memory["argument_size"] > 0 and e.host_callbacks == []
    fit = m.memory_fit
    assert fit and fit.fits and fit.capacity_bytes == 84942979072


def test_each_kernel_route_is_recorded_with_what_was_asked_what_runs_and_why(gpu_build):
    _, result = gpu_build
    m = result.manifest
    routes = {(stage, r.kernel): r for stage, rs in m.kernel_routes.items() for r in rs}
    dit = routes[("dit", "attention (unmasked)")]
    assert (dit.requested, dit.used, dit.program_kernel) == ("flash", "pallas-triton", "mha_forward")
    assert dit.estimate["flops"] > 0 and dit.estimate["bytes accessed"] > 0
    sr = routes[("sr", "attention (frame-window mask)")]
    assert (sr.requested, sr.used, sr.program_kernel) == ("blocksparse", "pallas-triton", "sr_window_attention")
    assert sr.estimate["flops"] > 0 and sr.reason == ""
    pre = [r for (stage, kernel), r in routes.items() if kernel == "pre-attention"]
    assert pre and all(r.used == "xla" and "Mosaic" in r.reason for r in pre)
    kernels = {(e.stage, k.name): k for e in m.executables for k in e.kernels}
    mha = kernels[("dit", "mha_forward")]
    assert mha.backend == "triton" and mha.count and mha.flags["num_warps"] in (4, 8)
    window = kernels[("sr", "sr_window_attention")]
    assert window.backend == "triton" and window.count
    assert not any(k.backend == "mosaic" for k in kernels.values())
    # each declared estimate is in its stage's per-run flops: at least the kernel's own, every call site
    assert m.executable("dit", "f8").cost["flops per run"] >= mha.count * dit.estimate["flops"]
    assert m.executable("sr", "f8").cost["flops per run"] >= window.count * sr.estimate["flops"]


def test_what_the_deviceless_compile_left_unautotuned_is_in_the_manifest(gpu_build):
    _, result = gpu_build
    a = result.manifest.autotune
    assert a.deviceless and a.select_first and a.results is None
    assert a.settings["xla_gpu_require_complete_aot_autotune_results"] is False
    assert a.executables["dit/f8"].gemm_fusions > 0  # transformer matmuls: default Triton tilings
    assert a.executables["vae/f8"].convolutions_at_run_time > 0  # the decoder's convolutions: chosen at first run
    assert a.convolutions_at_run_time == sum(f.convolutions_at_run_time for f in a.executables.values())


def test_the_compile_gate_passes_and_analyze_shows_the_h100_roofline_labelled_an_estimate(gpu_build):
    root, result = gpu_build
    res = _cli("gate", "compile", result.build_id, "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    checks = {c["name"]: c["status"] for c in json.loads(res.stdout)["result"]["checks"]}
    assert checks == {
        "every-bucket": "passed",
        "flags-present": "passed",
        "fits-memory": "passed",
        "no-host-callbacks": "passed",
        "reproducible": "passed",
    }
    res = _cli("analyze", "build", result.build_id, "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    a = json.loads(res.stdout)
    assert "not a measurement" in a["label"]
    assert a["rates"] == {
        "peak_flops_per_second": 989.4e12,
        "hbm_bytes_per_second": 3.35e12,
        "ici_bytes_per_second": 450e9,
    }
    (chunk,) = a["chunks"]
    assert chunk["deadline_seconds"] == 8 / 25 and chunk["estimated_seconds"] > 0
    assert {s["key"] for s in chunk["stages"]} == {"dit/f8", "sr/f8", "vae/f8"}
    assert a["autotune"]["deviceless"] and a["kernel_routes"]["sr"][0]["used"] == "pallas-triton"
    text = _cli("analyze", "build", result.build_id, "--registry", root).output
    assert (
        "against gpu-h100-8's published peaks per device: 989.4 TFLOP/s, 3350 GB/s memory, 450 GB/s arriving "
        "over NVLink" in text
    )
    assert "route sr: attention (frame-window mask): blocksparse requested, pallas-triton compiled" in text


def test_autotune_measures_only_on_the_builds_own_gpus_and_says_so(gpu_build):
    root, result = gpu_build
    before = len(LocalRegistry(root, create=False).list_builds())
    res = _cli("autotune", result.build_id, "--registry", root, "--json")
    assert res.exit_code == 5, res.output
    out = json.loads(res.stdout)
    assert out["error"] == "EnvironmentMismatch"
    assert (
        "measures on the build's own GPUs, 8 x NVIDIA H100 80GB HBM3; this host has no NVIDIA driver" in out["message"]
    )
    assert "--results FILE" in out["message"]
    assert len(LocalRegistry(root, create=False).list_builds()) == before  # nothing compiled, nothing published


def test_results_lacking_a_config_fail_the_compile_and_publish_nothing(gpu_build, tmp_path):
    root, result = gpu_build
    empty = tmp_path / "empty.textproto"
    empty.write_text("version: 3\n")
    before = len(LocalRegistry(root, create=False).list_builds())
    res = _cli("autotune", result.build_id, "--results", empty, "--registry", root, "--json")
    assert res.exit_code == 6, res.output
    out = json.loads(res.stdout)
    assert out["error"] == "CompileError" and "Failed to get configs for" in out["message"]  # XLA's own refusal
    assert "the autotune results lack a config for this program" in out["message"]
    assert "--allow-incomplete" in out["message"]
    assert len(LocalRegistry(root, create=False).list_builds()) == before


def test_a_tuned_build_is_a_new_build_that_keeps_its_results_verifies_and_rebuilds(gpu_build, tmp_path):
    """No GPU here, so the results given are empty and XLA keeps its defaults (--allow-incomplete):
    the same programs, but another build, because the identity covers the results."""

    root, result = gpu_build
    empty, saved = tmp_path / "empty.textproto", tmp_path / "saved.textproto"
    empty.write_text("# nothing measured\nversion: 3\n")
    res = _cli(
        "autotune",
        result.build_id,
        "--results",
        empty,
        "--allow-incomplete",
        "--save-results",
        saved,
        "--registry",
        root,
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["build_id"] == result.build_id and out["tuned_id"] != result.build_id and out["created"]
    assert out["measured_on"] is None and out["results_entries"] == 0 and out["complete_required"] is False
    assert out["convolutions_at_run_time"] == {"before": 10, "after": 10}  # defaults: still chosen at first run
    assert saved.read_bytes() == b"version: 3\n"  # the canonical text the build keeps
    reg = LocalRegistry(root, create=False)
    _, tuned = read_manifest(reg, out["tuned_id"])
    a = tuned.autotune
    assert (
        tuned.schema_version == BUILD_SCHEMA_VERSION
        and a.results == out["results"]
        and a.results_size == len(b"version: 3\n")
    )
    assert a.settings["xla_gpu_require_complete_aot_autotune_results"] is False
    assert [e.hlo_digest for e in tuned.executables] == [e.hlo_digest for e in result.manifest.executables]
    assert tuned.identity != result.manifest.identity
    assert reg.resolve("dev").build_id == result.build_id  # dev left alone
    res = _cli("verify", out["tuned_id"], "--registry", root, "--json")
    assert res.exit_code == 0, res.output
    rows = {r["what"]: r for r in json.loads(res.stdout)["blobs"]}
    assert rows["autotune results"]["ok"] and rows["autotune results"]["note"] == "raw bytes match"
    res = _cli("rebuild", out["tuned_id"], "--registry", root, "--json")
    assert res.exit_code == 0, res.output  # the results come back from the build's blob
    assert json.loads(res.stdout)["identical"] is True
    text = _cli("analyze", "build", out["tuned_id"], "--registry", root).output
    assert f"results loaded: {a.results} (0 configs; XLA's defaults where one is missing)" in text


def test_recompiling_a_build_from_another_source_is_refused_before_tracing(tmp_path):
    """What `autotune` relies on: the configs it measured or was given belong to the build's programs."""
    from avatar_release.compile import compile_build
    from avatar_release.errors import InputError

    reg = LocalRegistry(tmp_path / "reg")
    other = "sha256:" + "0" * 64
    with pytest.raises(InputError, match=f"the build's is {other}: recompiling a build needs the source it was built"):
        compile_build("tiny", "gpu-h100-8", registry=reg, expect_source=other)
    assert reg.list_builds() == []


def test_this_cpu_host_refuses_to_serve_the_gpu_build_with_both_machines(gpu_build):
    root, result = gpu_build
    res = _cli("render", "--channel", "dev", "--registry", root, "--out", root.parent / "out.mp4", "--json")
    assert res.exit_code == 5, res.output
    out = json.loads(res.stdout)
    assert out["error"] == "EnvironmentMismatch"
    assert "expected 'gpu: NVIDIA H100 80GB HBM3 x 8 (1x1x8)'" in out["message"]
    assert "this machine has no 'gpu' backend" in out["message"]
    assert not (root.parent / "out.mp4").exists()


def test_an_unknown_gpu_compile_option_fails_the_compile_naming_it(tmp_path, monkeypatch):
    man = tmp_path / "manifests"
    shutil.copytree(manifests_dir(), man)
    prof = man / "flags" / "gpu-default.toml"
    prof.write_text(prof.read_text() + "\nxla_gpu_no_such_option = true\n")
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(man))
    res = _cli("compile", "--target", "gpu-h100-8", "--registry", tmp_path / "reg", "--json")
    assert res.exit_code == 6, res.output
    out = json.loads(res.stdout)
    assert out["error"] == "CompileError" and "xla_gpu_no_such_option" in out["message"]


def test_tiny_compiles_for_one_h200(tmp_path):
    from avatar_release.compile import compile_build

    result = compile_build(
        "tiny", "gpu-h200-1", registry=LocalRegistry(tmp_path / "reg"), overrides={"dit.attention": "flash"}
    )
    m = result.manifest
    assert (m.platform.device_kind, m.platform.device_count) == ("NVIDIA H200 141GB HBM3e", 1)
    assert m.platform.target_config == target_description(load_target("gpu-h200-1")).digest
    assert m.memory_fit and m.memory_fit.capacity_bytes == 151397597184
    assert all(e.schedule is not None and e.schedule.all_to_alls == 0 for e in m.executables)  # one device


def test_production_shapes_stream_on_eight_h100s_by_the_estimate_because_both_attentions_are_kernels(tmp_path):
    """avatar-720p with the spec defaults (flash DiT, block-sparse SR) in a fresh process: both
    attentions compile as Triton kernels, the chunk's estimate is under its deadline, and the SR's
    working set is far from the 51.6 GiB XLA's masked attention needs (docs/how-to/gpu-builds.md)."""
    import subprocess
    import sys

    reg = tmp_path / "reg"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "avatar_release",
            "compile",
            "--pipeline",
            "avatar-720p",
            "--target",
            "gpu-h100-8",
            "--registry",
            str(reg),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    build_id = json.loads(proc.stdout)["build_id"]
    res = _cli("analyze", "build", build_id, "--registry", reg, "--json")
    assert res.exit_code == 0, res.output
    a = json.loads(res.stdout)
    assert [r["used"] for r in a["kernel_routes"]["sr"]] == ["pallas-triton"]
    assert "pallas-triton" in [r["used"] for r in a["kernel_routes"]["dit"]]
    (chunk,) = a["chunks"]
    assert chunk["estimated_seconds"] < 0.75 * chunk["deadline_seconds"]  # 307.6 of 640 ms on 2026-12-04
    sr = next(s for s in chunk["stages"] if s["key"] == "sr/f16")
    assert sr["seconds"] < 0.1  # XLA's masked attention: 867.7 ms
    _, m = read_manifest(LocalRegistry(reg, create=False), build_id)
    assert m.memory_fit.fits and m.memory_fit.total_bytes < 16 * 2**30
