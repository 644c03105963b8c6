"""Devices and mesh for a target: live devices, or a topology description when the
target's runtime is absent (TPU or GPU executables built on a CPU-only host). Never falls back
silently to another backend.

A GPU target is described to XLA by its target description (``target_description``: a pinned
GpuTargetConfigProto under manifests/gpu/), through the CUDA plugin's compile-only topology
(``get_topology_desc(platform="cuda", topology_name="", target_config=..., topology="1x1x8")``,
as jax's ``tests/aot_test.py::test_deviceless_aot_compile`` does). Without the devices XLA measures
nothing while compiling: see ``_autotune.py``. On a host that has the target's GPUs (the kind the
description names, at least as many) and a process that started JAX's GPU backend (JAX_PLATFORMS
allows it), the live devices are used instead, so XLA autotunes on them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CompileError, EnvironmentMismatch
from ..specs import TargetSpec, target_description

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    import jax
    from jax.sharding import Mesh

__all__ = ["target_devices", "make_mesh", "measuring_gpus", "GPU_PLUGIN_PLATFORM"]

# Where the NVIDIA kernel driver lists the GPUs it drives (one directory each).
NVIDIA_DRIVER = Path("/proc/driver/nvidia/gpus")
# The PJRT plugin that describes GPU topologies: NVIDIA's (jax-cuda12-plugin). ROCm is not a target.
GPU_PLUGIN_PLATFORM = "cuda"
_INSTALL = {
    "tpu": "for TPU: pip install 'avatar-release[tpu]', which pins the libtpu matching jax",
    "gpu": "for GPU: pip install 'avatar-release[gpu]', which pins the CUDA plugin matching jaxlib",
}


def target_devices(target: TargetSpec) -> list:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    import jax

    if target.platform == "cpu":
        devices = jax.devices("cpu")
        if len(devices) < target.device_count:
            raise EnvironmentMismatch(
                f"target {target.name} needs {target.device_count} CPU devices, this process has "
                f"{len(devices)}; the avatar-release entry point sets "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={target.device_count} before JAX starts — "
                "when calling the library directly, call avatar_release.machine.configure_host_devices first",
                {"device_count": (target.device_count, len(devices))},
            )
        return list(devices[: target.device_count])
    if target.topology is None:
        raise CompileError(f"target {target.name}: platform {target.platform!r} needs a topology to compile for")
    try:
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
        from jax.experimental import topologies

        if target.platform == "gpu":
            text = target_description(target).text
            live = _live_gpus(target, text)
            if live is not None:
                return live
            topo = topologies.get_topology_desc(
                platform=GPU_PLUGIN_PLATFORM, topology_name="", target_config=text, topology=target.topology
            )
        else:
            topo = topologies.get_topology_desc(target.topology, platform=target.platform)
    except Exception as e:  # noqa: BLE001 - report whatever the plugin says, with the fix
        raise CompileError(
            f"target {target.name}: cannot describe {target.platform.upper()} topology {target.topology!r} "
            f"on this host ({type(e).__name__}: {str(e).splitlines()[0][:200]}); install the compiler for it "
            f"({_INSTALL.get(target.platform, 'the PJRT plugin for ' + target.platform)}) — "
            "avatar-release never falls back to another backend"
        ) from None
    devices = list(topo.devices)
    if len(devices) != target.device_count:
        raise CompileError(
            f"target {target.name}: topology {target.topology} has {len(devices)} devices, "
            f"the target declares {target.device_count}"
        )
    return devices


def measuring_gpus(target: TargetSpec) -> list:
    """The target's own GPUs in this process, for XLA to measure configs on; EnvironmentMismatch
    naming what this process has instead (autotuning measures nothing on a description)."""
    text = target_description(target).text
    want = f"{target.device_count} x {_described_kind(text) or 'the description device'}"
    if not NVIDIA_DRIVER.is_dir():  # asked before JAX starts: no plugin traceback for a host without GPUs
        have = f"this host has no NVIDIA driver ({NVIDIA_DRIVER} is absent)"
    else:
        # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
        import jax

        live = _live_gpus(target, text)
        if live is not None:
            return live
        try:
            gpus = jax.devices("gpu")
            have = f"this process has {len(gpus)} x " + ", ".join(sorted({d.device_kind for d in gpus}))
        except RuntimeError as e:
            have = f"JAX starts no GPU backend here ({str(e)[:200]})"
    raise EnvironmentMismatch(
        f"target {target.name}: autotuning measures on the build's own GPUs, {want}; {have}. "
        "Run `avatar-release autotune` on such a host, or pass --results FILE with results recorded there",
        {"gpus": (want, have)},
    )


def _live_gpus(target: TargetSpec, description: str) -> list | None:
    """This process's GPUs when they are the target's (the description's device, enough of them), else None."""
    import jax

    kind = _described_kind(description)
    try:
        live = jax.devices("gpu")
    except RuntimeError:  # no GPU backend in this process (JAX_PLATFORMS=cpu, no plugin, no device)
        return None
    if kind is None or len(live) < target.device_count or {d.device_kind for d in live} != {kind}:
        return None
    return list(live[: target.device_count])


def _described_kind(description: str) -> str | None:
    """The device kind a GPU target description names (what a live device of it reports)."""
    named = re.search(r'device_description_str: "([^"]*)"', description)
    return named.group(1) if named else None


def make_mesh(devices: list[jax.Device], target: TargetSpec) -> Mesh:
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.sharding import Mesh

    return Mesh(np.array(devices).reshape(target.mesh_shape), tuple(target.mesh_axes))
