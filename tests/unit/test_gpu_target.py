"""GPU targets without compiling a pipeline: the pinned target descriptions, the specs' digests,
the v6 manifest fields (and that v5 manifests keep their bytes), the autotune evidence and the cost
of cuDNN convolutions read from a compiled XLA:GPU program, and the machine diff a loader applies.

``tests/data/gpu-h100-dot-softmax-conv.hlo.txt`` is ``compiled.as_text()`` of
``softmax(a @ b)`` (bf16 256x512 @ 512x1024) and a 3x3 convolution (bf16 1x64x64x32 -> 64
features), compiled on a CPU-only host for ``manifests/gpu/h100_sxm.txtpb`` under the
deterministic flags (jaxlib 0.10.2's CUDA plugin, 2026-12-02).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from avatar_release.compile._autotune import autotune_finding, autotune_record
from avatar_release.compile._evidence import kernels_in
from avatar_release.compile._loopcost import _kernel_costs, _Module, run_cost
from avatar_release.errors import IntegrityError, SpecError
from avatar_release.machine import RUN_FIELDS, Machine, diff_machines
from avatar_release.records import Manifest, Platform, check_identity, manifest_identity, parse_record
from avatar_release.specs import load_flag_profile, load_target, target_description
from tests.helpers import cpu_manifest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
GPU_DIR = REPO / "manifests" / "gpu"
HLO = (DATA / "gpu-h100-dot-softmax-conv.hlo.txt").read_text()


@pytest.fixture()
def manifests_copy(tmp_path, monkeypatch):
    man = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", man)
    monkeypatch.setenv("AVATAR_RELEASE_MANIFESTS", str(man))
    return man


# ---- the target descriptions and the specs that pin them ---------------------------------------


@pytest.mark.parametrize(
    "target, device", [("gpu-h100-8", "NVIDIA H100 80GB HBM3"), ("gpu-h200-1", "NVIDIA H200 141GB HBM3e")]
)
def test_each_gpu_target_pins_a_description_of_its_device_with_its_provenance(target, device):
    t = load_target(target)
    desc = target_description(t)
    assert (
        desc.digest
        == "sha256:" + hashlib.sha256(desc.path.read_bytes()).hexdigest()
        == "sha256:" + t.target_config_sha256
    )
    assert f'device_description_str: "{device}"' in desc.text
    assert 'platform_name: "CUDA"' in desc.text
    # the one change from upstream is said in the file itself (Apache-2.0 section 4b) and in PROVENANCE.md
    assert (
        "Modified by avatar-release" in desc.text
        and "collective_memory_granularity" not in desc.text.split("manifests/gpu/PROVENANCE.md")[1]
    )
    provenance = (GPU_DIR / "PROVENANCE.md").read_text()
    assert t.target_config_sha256 in provenance and desc.path.name in provenance
    assert re.search(
        r"https://github.com/openxla/xla/blob/[0-9a-f]{40}/xla/backends/gpu/target_config/specs/"
        + re.escape(desc.path.name),
        provenance,
    )
    assert (GPU_DIR / "LICENSE-APACHE-2.0").read_text().lstrip().startswith("Apache License")
    # the device memory the fit is checked against is the description's own
    assert t.hbm_bytes_per_device == int(re.search(r"device_memory_size: (\d+)", desc.text).group(1))


def test_a_target_description_that_changed_is_refused_with_both_digests(manifests_copy):
    path = manifests_copy / "gpu" / "h100_sxm.txtpb"
    path.write_text(path.read_text().replace("core_count: 132", "core_count: 114"))
    with pytest.raises(SpecError, match=r"h100_sxm.txtpb has sha256 [0-9a-f]{64}, the target pins fd79dd8c") as e:
        load_target("gpu-h100-8")
    assert "a new digest is a new target" in str(e.value)


def test_a_gpu_target_without_its_description_or_outside_manifests_is_refused(manifests_copy):
    spec = manifests_copy / "targets" / "gpu-h100-8.toml"
    text = spec.read_text()
    spec.write_text(text.replace('target_config = "gpu/h100_sxm.txtpb"\n', ""))
    with pytest.raises(SpecError, match="a GPU target names its target description"):
        load_target("gpu-h100-8")
    spec.write_text(text.replace('"gpu/h100_sxm.txtpb"', '"../../etc/passwd"'))
    with pytest.raises(SpecError, match="is not a file under"):
        load_target("gpu-h100-8")


def test_the_description_digest_is_part_of_the_target_spec_digest_and_cpu_tpu_digests_did_not_move(manifests_copy):
    before = load_target("gpu-h100-8").digest()
    # as the file was named before GPU targets existed: gate evidence naming these keeps verifying
    assert load_target("cpu-8").digest() == "sha256:e9d98dfc795ee2a3d5914cfaf34ae9ab3fcf154090668fafea3fc55bacd8dab0"
    assert (
        load_target("tpu-v6e-8").digest() == "sha256:45be5de691901c21e3d6e623b885ea7a3422cc1d1bc1ecdcc142b8c739c5bd3c"
    )
    path = manifests_copy / "gpu" / "h100_sxm.txtpb"
    path.write_text(path.read_text() + "\n")
    spec = manifests_copy / "targets" / "gpu-h100-8.toml"
    new = hashlib.sha256(path.read_bytes()).hexdigest()
    spec.write_text(re.sub(r'target_config_sha256 = "[0-9a-f]+"', f'target_config_sha256 = "{new}"', spec.read_text()))
    assert load_target("gpu-h100-8").digest() != before


def test_the_gpu_flag_profile_documents_every_option_and_pins_determinism():
    prof = load_flag_profile("gpu-default")
    assert prof.platform == "gpu" and prof.compiler_options["xla_gpu_deterministic_ops"] is True
    assert prof.compiler_options["xla_gpu_exclude_nondeterministic_ops"] is True
    lines = (REPO / "manifests" / "flags" / "gpu-default.toml").read_text().splitlines()
    options = tomllib.loads("\n".join(lines))["compiler_options"]
    for name in options:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} ="))
        assert lines[at - 1].startswith("#"), f"{name} has no comment saying why"
    for target in ("gpu-h100-8", "gpu-h200-1"):
        assert load_target(target).flag_profile == "gpu-default"


def test_published_peaks_are_declared_for_the_estimate():
    h100, h200 = load_target("gpu-h100-8"), load_target("gpu-h200-1")
    assert h100.peak_flops_per_second == h200.peak_flops_per_second == 989.4e12  # dense bf16
    assert h100.hbm_bytes_per_second == 3.35e12 and h200.hbm_bytes_per_second == 4.8e12
    assert h100.ici_bytes_per_second == 450e9  # NVLink 900 GB/s both ways
    assert h100.device_count == 8 and h100.mesh_shape == load_target("tpu-v6e-8").mesh_shape
    assert h100.mesh_axes == load_target("tpu-v6e-8").mesh_axes


@pytest.mark.extra("gpu")
def test_the_installed_cuda_plugin_reads_each_description_as_compile_only_devices():
    import jax  # noqa: F401 - the plugin registers with jax
    from jax.experimental import topologies

    for target, kind in (("gpu-h100-8", "NVIDIA H100 80GB HBM3"), ("gpu-h200-1", "NVIDIA H200 141GB HBM3e")):
        t = load_target(target)
        topo = topologies.get_topology_desc(
            platform="cuda", topology_name="", target_config=target_description(t).text, topology=t.topology
        )
        assert len(topo.devices) == t.device_count
        assert {d.device_kind for d in topo.devices} == {kind}
        assert topo.devices[0].client.runtime_type == "compile_only_runtime"


# ---- manifest v6: new fields, old bytes ---------------------------------------------------------


def test_a_cpu_manifest_read_and_written_again_keeps_its_bytes_digest_and_identity():
    raw = cpu_manifest().to_json_bytes()  # no GPU field set: none of them is written
    m = parse_record(Manifest, raw, where="a cpu-8 manifest")
    assert m.to_json_bytes() == raw  # what signatures bind (content digest) did not move
    assert m.platform.target_config is None and m.autotune is None and m.kernel_routes is None
    assert b"target_config" not in raw and b"autotune" not in raw and b"kernel_routes" not in raw
    check_identity(m)


def test_the_target_description_digest_is_covered_by_the_build_identity():
    m = cpu_manifest()
    relabelled = m.model_copy(
        update={"platform": m.platform.model_copy(update={"target_config": "sha256:" + "0" * 64})}
    )
    assert manifest_identity(relabelled) != m.identity
    with pytest.raises(IntegrityError, match="hash to identity"):
        check_identity(relabelled)


def test_platform_fields_added_later_are_left_out_only_while_unset():
    p = Platform(
        backend="gpu",
        platform_version="topology:1x1x8",
        device_kind="NVIDIA H100 80GB HBM3",
        device_count=8,
        mesh_axes=["fsdp"],
        mesh_shape=[8],
        topology="1x1x8",
    )
    assert "target_config" not in p.model_dump(mode="json")
    doc = p.model_copy(update={"target_config": "sha256:" + "1" * 64}).model_dump(mode="json")
    assert doc["target_config"] == "sha256:" + "1" * 64
    assert Platform.model_validate(doc).target_config == doc["target_config"]


# ---- what the compiled program says: kernels, autotuning, cost ---------------------------------


def test_a_pallas_kernel_lowered_through_triton_is_found_by_name_with_its_launch_parameters():
    line = (
        "  ROOT %pallas_call.0 = bf16[1,1024,8,64]{3,2,1,0} custom-call(%q.1, %k.1, %v.1), "
        'custom_call_target="__gpu$xla.gpu.triton", api_version=API_VERSION_TYPED_FFI, '
        'metadata={op_name="jit(f)/jit(mha)/mha_forward/pallas_call" stack_frame_id=3}, '
        'backend_config={debug = false, grid_x = 8 : i32, ir = "ML\\EFR", name = "mha_forward", '
        "num_stages = 2 : i32, num_warps = 4 : i32}"
    )
    (k,) = kernels_in(line)
    assert (k.name, k.backend, k.count, k.flags) == ("mha_forward", "triton", 1, {"num_stages": 2, "num_warps": 4})


def test_a_deviceless_compile_leaves_the_convolution_to_run_time_and_assigns_default_gemm_configs():
    f = autotune_finding(HLO)
    assert f.convolutions_at_run_time == 1  # __cudnn$convForward with algorithm -1
    assert f.gemm_fusions >= 1  # the dot: a Triton GEMM fusion with the default tiling
    assert f.block_fusions >= 1  # the softmax: a Triton block-level fusion
    assert '"algo_id":"-1"' in HLO and "__triton_nested_gemm_fusion" in HLO and '__triton"' in HLO
    rec = autotune_record({"x/f8": HLO}, load_flag_profile("gpu-default").compiler_options, deviceless=True)
    assert rec.deviceless and rec.select_first and rec.results is None
    assert rec.convolutions_at_run_time == 1 and rec.executables["x/f8"] == f
    assert rec.settings == {
        "xla_gpu_deterministic_ops": True,
        "xla_gpu_exclude_nondeterministic_ops": True,
        "xla_gpu_require_complete_aot_autotune_results": False,
    }
    assert not autotune_record({}, {"xla_gpu_autotune_level": 4}, deviceless=False).select_first


def test_a_cudnn_convolution_is_charged_its_flops_and_its_operands_and_result():
    module = _Module(HLO)
    cost, _ = _kernel_costs(module, module.entry)
    flops = 2 * (64 * 64 * 64) * (3 * 3 * 32)  # output elements x (window x input features)
    io = 2 * (64 * 64 * 32 + 64 * 3 * 3 * 32 + 64 * 64 * 64)  # bf16 image, kernel and output, once
    assert cost["flops"] == flops and cost["bytes accessed"] == io
    total = run_cost(HLO)
    assert total.flops >= flops + 2 * 256 * 512 * 1024  # the dot, counted by XLA inside its fusion


def test_a_triton_kernel_is_charged_the_estimate_its_route_declared():
    line = (
        "ENTRY %main (q: bf16[1,128,8,64], k: bf16[1,128,8,64], v: bf16[1,128,8,64]) -> bf16[1,128,8,64] {\n"
        "  %q = bf16[1,128,8,64]{3,2,1,0} parameter(0)\n  %k = bf16[1,128,8,64]{3,2,1,0} parameter(1)\n"
        "  %v = bf16[1,128,8,64]{3,2,1,0} parameter(2)\n"
        "  ROOT %pallas_call.0 = bf16[1,128,8,64]{3,2,1,0} custom-call(%q, %k, %v), "
        'custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(f)/mha_forward/pallas_call"}\n}\n'
    )
    module = _Module(line)
    plain, n = _kernel_costs(module, module.entry)
    assert n == 0 and plain["flops"] == 0 and plain["bytes accessed"] == 4 * 128 * 8 * 64 * 2  # q, k, v, out once
    est = {"mha_forward": {"flops": 1e9, "transcendentals": 5.0, "bytes accessed": 7.0}}
    declared, n = _kernel_costs(module, module.entry, est)
    assert n == 1 and (declared["flops"], declared["transcendentals"], declared["bytes accessed"]) == (1e9, 5.0, 7.0)


# ---- the machine a GPU build asks for -------------------------------------------------------------


def _gpu_build(kind: str = "NVIDIA H100 80GB HBM3") -> Manifest:
    m = cpu_manifest()
    p = Platform(
        backend="gpu",
        platform_version="topology:1x1x8",
        device_kind=kind,
        device_count=8,
        mesh_axes=["fsdp"],
        mesh_shape=[8],
        topology="1x1x8",
        target_config="sha256:" + "2" * 64,
    )
    return m.model_copy(update={"platform": p})


def test_an_h100_build_differs_from_an_h200_host_by_device_kind_and_from_cpu_by_backend():
    build = Machine.of_build(_gpu_build())
    h200 = Machine(
        backend="gpu",
        platform_version="PJRT C API\ncuda 12080",
        device_kind="NVIDIA H200 141GB HBM3e",
        device_count=8,
        jaxlib=build.jaxlib,
    )
    diff = diff_machines(build, h200, fields=RUN_FIELDS)
    assert diff.differences == {"device_kind": ("NVIDIA H100 80GB HBM3", "NVIDIA H200 141GB HBM3e")}
    cpu = Machine(backend="cpu", platform_version="cpu", device_kind="cpu", device_count=8, jaxlib=build.jaxlib)
    assert set(diff_machines(build, cpu, fields=RUN_FIELDS).differences) == {"backend", "device_kind"}
    # a topology build records no live platform version: an H100 host is not refused for its own
    h100 = Machine(
        backend="gpu",
        platform_version="PJRT C API\ncuda 12080",
        device_kind="NVIDIA H100 80GB HBM3",
        device_count=8,
        jaxlib=build.jaxlib,
    )
    assert not diff_machines(build, h100, fields=RUN_FIELDS)


def test_the_loader_refuses_a_gpu_build_on_this_cpu_host_naming_both_machines():
    from avatar_release.errors import EnvironmentMismatch
    from avatar_release.runtime import check_environment

    with pytest.raises(EnvironmentMismatch) as e:
        check_environment(_gpu_build())
    msg = str(e.value)
    assert "compiled for another machine; refusing to load" in msg
    assert "expected 'gpu: NVIDIA H100 80GB HBM3 x 8 (1x1x8)'" in msg and "actual 'cpu: cpu x 8'" in msg
    assert "this machine has no 'gpu' backend" in msg
    assert e.value.differences["backend"] == ("gpu", "cpu")
