"""Devices and mesh for a target: live devices, or a topology description when the
target's runtime is absent (TPU executables built on a CPU-only host). Never falls back
silently to another backend."""

from __future__ import annotations

import numpy as np

from ..errors import CompileError, EnvironmentMismatch
from ..specs import TargetSpec

__all__ = ["target_devices", "make_mesh"]


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

        topo = topologies.get_topology_desc(target.topology, platform=target.platform)
    except Exception as e:  # noqa: BLE001 - report whatever the plugin says, with the fix
        raise CompileError(
            f"target {target.name}: cannot describe {target.platform.upper()} topology {target.topology!r} "
            f"on this host ({type(e).__name__}: {str(e).splitlines()[0][:200]}); install the compiler for it "
            f"(for TPU: pip install 'avatar-release[tpu]', which pins the libtpu matching jax) — "
            "avatar-release never falls back to another backend"
        ) from None
    devices = list(topo.devices)
    if len(devices) != target.device_count:
        raise CompileError(
            f"target {target.name}: topology {target.topology} has {len(devices)} devices, "
            f"the target declares {target.device_count}"
        )
    return devices


def make_mesh(devices: list, target: TargetSpec):
    # Lazy (heavy): JAX starts only after XLA_FLAGS are set (avatar_release.machine.configure_*).
    from jax.sharding import Mesh

    return Mesh(np.array(devices).reshape(target.mesh_shape), tuple(target.mesh_axes))
